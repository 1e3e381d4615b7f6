"""Wire formats: REST bodies and data-channel messages, both ways, typed and validated at the boundary.

Data channel "control" (JSON text, ≤ 4 KiB; client messages carry `seq` and client time `t` in ms):

client → server (the control messages are `workers/controls.py`'s, shared with traces)
    control        {key, action: "press" | "release"}   (aliases: control → key, event → action)
    control_state  {controls: [held keys]}
    look           {dx, dy}                              (mouse-look deltas in pixels)
    reset_pose     {}
    prompt         {text, transition_chunks?}            (the world's prompt from the next chunk the DiT
                                                          starts, blended over transition_chunks; latest wins)
    ping           {}
    stop           {}

server → client (the models below)
    ready   ReadyMsg    geometry, model, dispatch, the control vocabulary, and the role (driver or spectator)
    video_start VideoStartMsg  {pts}: the session pts of this viewer's first video frame (its receiver counts from 0)
    chunk   ChunkMsg    one per generated chunk: frames, pts (per part), applied controls, timings
    stats   StatsMsg    every stats interval: delivery, buffer, latency
    error   ErrorMsg    {code, message}
    pong    PongMsg     {seq, t, server_t}
    done    DoneMsg     {code, reason}: the session (or this spectator's watch) is over (EndReason says why)

A spectator (server/peers/spectator.py) may open a data channel of any label: it gets ready, video_start,
chunk, stats and done, answers `ping` with `pong`, and refuses anything else with `error` read_only.

Nothing here imports torch or model code: parsing, validating and routing a message needs none.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from server.wire.dispatch import DispatchPolicy
from workers.controls import (
    CONTROL_TYPES,
    ClientMessageBase,
    ControlMsg,
    ControlStateMsg,
    LookMsg,
    ResetPoseMsg,
    first_error,
)

MAX_CONTROL_MESSAGE_BYTES = 4096
MAX_PROMPT_CHARS = 2000
MAX_TRANSITION_CHUNKS = 16  # about 16 s of video at LingBot-World's chunk: longer is a slow fade, not a change


class ProtocolError(ValueError):
    """A client message we refuse; `code` goes back in the data-channel `error` message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# ---- client -> server (data channel) ----


class PromptMsg(ClientMessageBase):
    type: Literal["prompt"]
    text: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
    transition_chunks: Annotated[int, Field(ge=1, le=MAX_TRANSITION_CHUNKS)] = 1


class PingMsg(ClientMessageBase):
    type: Literal["ping"]


class StopMsg(ClientMessageBase):
    type: Literal["stop"]


ClientMessage = ControlMsg | ControlStateMsg | LookMsg | ResetPoseMsg | PromptMsg | PingMsg | StopMsg
_CLIENT = TypeAdapter(Annotated[ClientMessage, Field(discriminator="type")])
KNOWN_TYPES = (*CONTROL_TYPES, "prompt", "ping", "stop")


def parse_client_message(data: str | bytes) -> ClientMessage:
    """Raw data-channel payload -> typed message, or ProtocolError with a code the client can act on."""
    if isinstance(data, bytes):
        raise ProtocolError("bad_message", "control messages are JSON text, not binary messages")
    try:
        size = len(data.encode())
    except UnicodeEncodeError:  # a lone surrogate: no client's JSON text holds one
        raise ProtocolError("bad_json", "control messages must be UTF-8 JSON text") from None
    if size > MAX_CONTROL_MESSAGE_BYTES:
        raise ProtocolError("message_too_large", f"control messages are limited to {MAX_CONTROL_MESSAGE_BYTES} bytes")
    try:
        # Deep nesting exhausts the parser's recursion before any size check could see it.
        raw = json.loads(data)
    except (json.JSONDecodeError, RecursionError):
        raise ProtocolError("bad_json", "control messages must be JSON objects") from None
    if not isinstance(raw, dict):
        raise ProtocolError("bad_json", "control messages must be JSON objects")
    kind = raw.get("type")
    if kind not in KNOWN_TYPES:
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}; expected one of {list(KNOWN_TYPES)}")
    try:
        return _CLIENT.validate_python(raw)
    except ValidationError as exc:
        raise ProtocolError("bad_message", first_error(exc, kind)) from None


# ---- server -> client (data channel) ----


class _ServerMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_json(self) -> str:
        return self.model_dump_json()


class Parent(BaseModel):
    """Where a branch came from: the snapshot it started from, the session that took it, its chunk."""

    snapshot_id: str
    session_id: str
    chunk_index: int


class ReadyMsg(_ServerMessage):
    type: Literal["ready"] = "ready"
    session_id: str
    model: str
    weights: str
    width: int
    height: int
    fps: int
    chunk_frames: int  # video frames per chunk (the first chunk has 3 fewer)
    dispatch: str
    controls: dict[str, Any]  # workers.controls.client_contract()
    idle_timeout_s: float | None  # the session ends after this long without a control (None: never)
    max_duration_s: float | None
    role: Literal["driver", "spectator"] = "driver"  # a spectator watches and cannot steer
    parent: Parent | None = None  # a branch: the snapshot it started from


class VideoStartMsg(_ServerMessage):
    """The session pts of the first frame this viewer's video carries. A receiver counts pts from its
    first frame, so a spectator that joined late adds this to map frames onto the `chunk` messages."""

    type: Literal["video_start"] = "video_start"
    pts: int


class ChunkMsg(_ServerMessage):
    type: Literal["chunk"] = "chunk"
    index: int
    first_frame: int  # index of the chunk's first frame in the session's video
    num_frames: int
    pts_start: int  # 90 kHz pts of the chunk's first frame
    pts_end: int
    parts: list[tuple[int, int, int]]  # (first_frame, pts_start, num_frames) of each part as paced
    applied_seq: int | None  # the last control message folded into this chunk's controls
    applied_keys: list[str]
    # That control as the DiT consumed it: {"poses": [F][4][4]} for camera models, {"keyboard":
    # [F][12][keys], "mouse": [F][12][2] or null} for Matrix-Game (each latent frame's action window).
    model_input: dict[str, Any] | None = None
    # The prompt this chunk's DiT read (families with text): {"text"}, or during a transition
    # {"text", "weight" (the new prompt's, 0..1), "from" (the prompt it moves away from)}.
    prompt: dict[str, Any] | None = None
    timings: dict[str, float | None]  # {stage}_s busy, queue_s, start_to_pacer_s
    stages: dict[str, tuple[float, float]]  # stage -> (dispatch, done), s since the session opened


class StatsMsg(_ServerMessage):
    type: Literal["stats"] = "stats"
    fps: int
    dispatch: str
    frames_sent: int
    frames_dropped: int
    frames_repeated: int
    repeats_per_s: float
    chunk_period_p50_s: float | None
    real_time_factor: float | None
    buffered_ms: float
    chunks_in_flight: int
    predicted_latency_s: float | None  # a chunk's start -> its first frame on screen
    predicted_control_to_frame_s: float | None  # + half a chunk's wait for the next start
    control_to_frame_p50_s: float | None  # measured: control arrival -> its first frame sent
    start_to_pacer_quantile_s: float | None
    start_to_pacer_p50_s: float | None
    dispatch_lateness_s: float
    # Generation is slower than playback: chunks come further apart than they last (the viewer sees
    # repeated frames). The model is too slow for this session's fps on this hardware.
    behind: bool
    controls_accepted: int
    controls_refused: int  # rate-limited or invalid
    spectators: int = 0  # watching now


class ErrorMsg(_ServerMessage):
    type: Literal["error"] = "error"
    code: str
    message: str


class PongMsg(_ServerMessage):
    type: Literal["pong"] = "pong"
    seq: int | None
    t: float | None
    server_t: float  # ms since the epoch


class EndReason(StrEnum):
    """Why a session ended: the `code` of its `done` message (and of GET /v1/sessions/{id}'s `ended`)."""

    STOPPED = "stopped"  # the client sent `stop`
    DELETED = "deleted"  # DELETE on the session (REST or WHEP)
    CONNECTION_CLOSED = "connection_closed"  # the peer closed its connection or the control channel
    PEER_GONE = "peer_gone"  # the connection failed, or the peer stopped answering (no RTCP reports)
    IDLE = "idle"  # no control for idle_timeout_s
    MAX_DURATION = "max_duration"  # max_duration_s reached
    NO_OFFER = "no_offer"  # no offer within offer_timeout_s of the create
    ICE_TIMEOUT = "ice_timeout"  # ICE did not connect within ice_timeout_s
    BAD_OFFER = "bad_offer"  # the offer could not be used
    GENERATION_FAILED = "generation_failed"  # a stage failed; the message says which and how
    PROTOCOL_ABUSE = "protocol_abuse"  # too many invalid data-channel messages (abuse_limit)
    SERVER_SHUTDOWN = "server_shutdown"  # the server stopped (after its drain, if it had one)
    DRIVER_LEFT = "driver_left"  # a spectator's session ended
    REVOKED = "revoked"  # a spectator's watch token was revoked by the driver
    TURN_OVER = "turn_over"  # max_turn_s reached while someone waited for the slot (after `turn_ending`)

    @property
    def failed(self) -> bool:
        return self in FAILURES


FAILURES = frozenset(
    {
        EndReason.PEER_GONE,
        EndReason.NO_OFFER,
        EndReason.ICE_TIMEOUT,
        EndReason.BAD_OFFER,
        EndReason.GENERATION_FAILED,
        EndReason.PROTOCOL_ABUSE,
    }
)


class DoneMsg(_ServerMessage):
    type: Literal["done"] = "done"
    code: EndReason
    reason: str


class TurnEndingMsg(_ServerMessage):
    """Someone is waiting for this session's slot: the turn ends (`done` turn_over) in `seconds_left`."""

    type: Literal["turn_ending"] = "turn_ending"
    seconds_left: float


class RewoundMsg(_ServerMessage):
    """The session was rewound to a snapshot (POST /v1/sessions/{id}/restore): frames from here on
    continue from it; chunk indices start again at its `chunk_index`."""

    type: Literal["rewound"] = "rewound"
    parent: Parent


ServerMessage = (
    ReadyMsg | VideoStartMsg | ChunkMsg | StatsMsg | ErrorMsg | PongMsg | DoneMsg | RewoundMsg | TurnEndingMsg
)


# ---- REST ----


SnapshotId = Annotated[str, Field(pattern=r"^[0-9a-f]{16}$", description="a snapshot's id")]


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
    snapshot: SnapshotId | None = Field(
        default=None,
        description="start from this snapshot (a branch): its image, prompt, seed and chunk size; "
        "send a token of its session's line as the bearer",
    )
    queue: bool = Field(
        default=True,
        description="when every slot is taken, wait in line (202 with a ticket, where the server queues) "
        "rather than get 429 busy",
    )


class RestoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    snapshot: SnapshotId


class SnapshotInfo(BaseModel):
    snapshot_id: str
    session_id: str  # the session it was taken from
    chunk_index: int  # the first chunk a branch generates: the state after chunk_index - 1
    frames: int  # video frames generated before it
    bytes: int  # every stage worker's part together
    created: float  # unix seconds
    where: Literal["memory", "disk", "saved"]  # saved: on disk under WORLDRTC_SNAPSHOT_DIR, outlives the server
    parent: Parent | None = None  # the snapshot the session it was taken from started from
    # What its frames depend on besides it (workers/determinism.py): a branch runs on the same.
    model: str
    weights: str  # workers/models/weights_digest.py
    placement: str
    intra_op_threads: int
    snapshot_url: str


class SessionInfo(BaseModel):
    session_id: str
    state: str
    created_s: float
    model: str
    scene: str | None = None  # the built-in scene it started from (None: an uploaded image)
    width: int
    height: int
    fps: int
    chunk_frames: int
    token: str | None = None  # only in the create response
    ice_servers: list[dict[str, Any]] | None = None  # only in the create response: TURN minted for it
    # Only in the create response: where this session's routes live (the node that holds it).
    session_url: str | None = None
    offer_url: str | None = None
    recording_url: str | None = None  # what regenerates the session (GET; server/media/recording.py)
    video_url: str | None = None  # its frames as generated, an MP4 (GET)
    # Only in the create response: the session's WHEP endpoint for spectators, and the capability
    # that lets its holder watch (never steer) this one session; the driver can revoke it.
    watch_url: str | None = None
    watch_token: str | None = None
    snapshots_url: str | None = None  # only in the create response: POST here to save the world
    parent: Parent | None = None  # a branch: the snapshot it started from
    metrics: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    ended: str | None = None  # the EndReason, once it has ended


class TicketInfo(BaseModel):
    """A place in the waiting room (server/waiting_room/line.py): the 202 of a create, and each poll."""

    ticket_id: str
    ticket_token: str | None = None  # only in the 202: the bearer of every poll
    state: Literal["waiting", "ready", "served"]
    position: int  # 1: next; 0 once it is not waiting
    waiting: int  # tickets waiting now, this one included
    estimated_wait_s: float  # from measured turns (0 once ready)
    poll_url: str
    # The world to watch meanwhile (WORLDRTC_QUEUE_WATCH), as a spectator: may change between polls.
    watch_url: str | None = None
    watch_token: str | None = None
    # Once ready: exactly what a 201 create returns; offer to its offer_url within connect_by_s.
    session: SessionInfo | None = None
    connect_by_s: float | None = None


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
