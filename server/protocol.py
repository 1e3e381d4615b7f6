"""Wire formats: REST bodies and data-channel messages, validated with pydantic at the boundary.

Data channel "control" (JSON text, ≤ 4 KiB, each with `seq` and client time `t` in ms):

client → server
    control        {key, action: "press" | "release"}   (aliases: control → key, event → action)
    control_state  {controls: [held keys]}
    look           {dx, dy}                              (mouse-look deltas in pixels)
    reset_pose     {}
    prompt         {text}                                (accepted, applies to the next session)
    ping           {}
    stop           {}

server → client
    ready   {session_id, model, weights, width, height, fps, chunk_frames, dispatch}
    chunk   {index, first_frame, num_frames, pts_start, pts_end, applied_seq, applied_keys,
             timings: {encode_s, dit_s, decode_s, queue_s, start_to_pacer_s}}
    stats   {frames_sent, frames_dropped, frames_repeated, repeats_per_s, chunk_period_p50_s,
             real_time_factor, fps, dispatch, buffered_ms, chunks_in_flight, predicted_latency_s,
             predicted_control_to_frame_s, control_to_frame_p50_s, start_to_pacer_quantile_s,
             start_to_pacer_p50_s, dispatch_lateness_s}
    error   {code, message}
    pong    {seq, t, server_t}
    done    {reason}
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from server.dispatch import DispatchPolicy

MAX_CONTROL_MESSAGE_BYTES = 4096
MAX_KEYS = 32
MAX_KEY_NAME = 32
MAX_PROMPT_CHARS = 2000


class ProtocolError(ValueError):
    """A client message we refuse; `code` goes back in the data-channel `error` message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# ---- client -> server (data channel) ----


class _ClientMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)
    seq: int | None = None
    t: float | None = None  # client clock, ms


class ControlMsg(_ClientMessage):
    type: Literal["control"]
    key: Annotated[str, Field(max_length=MAX_KEY_NAME, validation_alias="key")]
    action: Literal["press", "release"]

    @classmethod
    def normalise(cls, raw: dict[str, Any]) -> dict[str, Any]:
        # TeleFuser's event form names the fields control/event.
        out = dict(raw)
        if "key" not in out and "control" in out:
            out["key"] = out.pop("control")
        if "action" not in out and "event" in out:
            out["action"] = out.pop("event")
        return out


class ControlStateMsg(_ClientMessage):
    type: Literal["control_state"]
    controls: Annotated[list[Annotated[str, Field(max_length=MAX_KEY_NAME)]], Field(max_length=MAX_KEYS)]


class LookMsg(_ClientMessage):
    type: Literal["look"]
    dx: Annotated[float, Field(allow_inf_nan=False, ge=-10_000, le=10_000)] = 0.0
    dy: Annotated[float, Field(allow_inf_nan=False, ge=-10_000, le=10_000)] = 0.0


class ResetPoseMsg(_ClientMessage):
    type: Literal["reset_pose"]


class PromptMsg(_ClientMessage):
    type: Literal["prompt"]
    text: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]


class PingMsg(_ClientMessage):
    type: Literal["ping"]


class StopMsg(_ClientMessage):
    type: Literal["stop"]


ClientMessage = Annotated[
    ControlMsg | ControlStateMsg | LookMsg | ResetPoseMsg | PromptMsg | PingMsg | StopMsg,
    Field(discriminator="type"),
]
_CLIENT = TypeAdapter(ClientMessage)
KNOWN_TYPES = ("control", "control_state", "look", "reset_pose", "prompt", "ping", "stop")


def parse_client_message(
    data: str | bytes,
) -> ControlMsg | ControlStateMsg | LookMsg | ResetPoseMsg | PromptMsg | PingMsg | StopMsg:
    """Raw data-channel payload -> typed message, or ProtocolError with a code the client can act on."""
    size = len(data.encode() if isinstance(data, str) else data)
    if size > MAX_CONTROL_MESSAGE_BYTES:
        raise ProtocolError("message_too_large", f"control messages are limited to {MAX_CONTROL_MESSAGE_BYTES} bytes")
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProtocolError("bad_json", "control messages must be JSON objects") from None
    if not isinstance(raw, dict):
        raise ProtocolError("bad_json", "control messages must be JSON objects")
    kind = raw.get("type")
    if kind not in KNOWN_TYPES:
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}; expected one of {list(KNOWN_TYPES)}")
    if kind == "control":
        raw = ControlMsg.normalise(raw)
    try:
        return _CLIENT.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or kind
        raise ProtocolError("bad_message", f"{kind}: {where}: {first['msg']}") from None


def as_control_dict(msg: _ClientMessage) -> dict[str, Any]:
    """The dict form that workers.controls.ControlState applies (validated already)."""
    return msg.model_dump(exclude_none=True)


# ---- REST ----


class CreateSessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scene: str | None = Field(default=None, description="built-in start image name (see GET /v1/model)")
    image: str | None = Field(default=None, description="start image as a data URL (base64 PNG/JPEG)")
    prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] = ""
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    fps: Annotated[int, Field(ge=1, le=60, description="video frame rate (must divide 90000)")] | None = None
    chunk_frames: (
        Annotated[int, Field(ge=1, le=16, description="latent frames per chunk (4 video frames each)")] | None
    ) = None
    max_duration_s: Annotated[float, Field(gt=0, le=24 * 3600)] | None = None
    dispatch: DispatchPolicy | None = Field(
        default=None, description="when chunks start: jit (default) or chunk-synchronous (the A/B baseline)"
    )


class SessionInfo(BaseModel):
    session_id: str
    state: str
    created_s: float
    model: str
    width: int
    height: int
    fps: int
    chunk_frames: int
    token: str | None = None  # only in the create response
    metrics: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


class OfferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sdp: Annotated[str, Field(min_length=1)]
    type: Literal["offer"]


class AnswerResponse(BaseModel):
    sdp: str
    type: Literal["answer"] = "answer"


class ErrorBody(BaseModel):
    error: str  # machine-readable code
    message: str  # what is wrong and how to fix it
