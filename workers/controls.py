"""The control vocabulary, shared by the server, the runtime, clients and traces (no torch here).

- Keys: W/S forward/back, A/D strafe (the arrow keys alias them), J/L yaw, I/K pitch; browser names
  ('KeyW', 'ArrowUp', 'W') fold onto those canonical names, and keys that do not steer are ignored.
- `ChunkControl`: the controls applied to one chunk, sampled when the DiT starts it.
- Control messages in the TeleFuser event form, typed and validated once where they enter (the data
  channel, a trace file): `control` {key, action: press|release} (`control`/`event` accepted as
  aliases of `key`/`action`), `control_state` {controls: [keys]}, `look` {dx, dy} in pixels,
  `reset_pose`. Each may carry the client's `seq` and `t` (ms).
- `ControlState`: latest-wins folding of those messages; mouse deltas accumulate until a chunk
  samples them.

`client_contract()` is what the server publishes (GET /v1/model) so clients need no copies of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

# Canonical keys: (right, forward) per move key, (yaw, pitch) per turn key; aliases from browsers.
MOVE_KEYS: dict[str, tuple[float, float]] = {"w": (0.0, 1.0), "s": (0.0, -1.0), "a": (-1.0, 0.0), "d": (1.0, 0.0)}
TURN_KEYS: dict[str, tuple[float, float]] = {"j": (-1.0, 0.0), "l": (1.0, 0.0), "i": (0.0, 1.0), "k": (0.0, -1.0)}
KEY_ALIASES = {"arrowup": "w", "arrowdown": "s", "arrowleft": "a", "arrowright": "d"}

MAX_LOOK_PX = 10_000.0  # per message; larger deltas are a client bug, not a fast flick
MAX_KEYS = 32  # keys in one control_state
MAX_KEY_NAME = 32  # characters in a key name
MAX_SEQ = 2**53 - 1  # the largest integer a JavaScript number holds exactly


def canonical_key(name: str) -> str | None:
    """'W', 'KeyW', 'ArrowUp' -> 'w'; None for keys that do not steer the camera."""
    key = name.strip().lower()
    if key.startswith("key") and len(key) == 4:
        key = key[3:]
    key = KEY_ALIASES.get(key, key)
    return key if key in MOVE_KEYS or key in TURN_KEYS else None


@dataclass(frozen=True)
class ChunkControl:
    """The controls applied to one chunk: held keys plus mouse-look deltas summed since the last chunk."""

    keys: frozenset[str] = field(default_factory=frozenset)
    look_dx_px: float = 0.0
    look_dy_px: float = 0.0
    seq: int | None = None  # the last client control message folded into this state

    @staticmethod
    def from_keys(keys: Iterable[str], seq: int | None = None) -> ChunkControl:
        canonical = {k for k in (canonical_key(n) for n in keys) if k is not None}
        return ChunkControl(keys=frozenset(canonical), seq=seq)


class ControlError(ValueError):
    """A control message that is not valid; the message says what is wrong."""


# ---- typed control messages ----


class ClientMessageBase(BaseModel):
    """Every client → server data-channel message: its optional `seq` and `t`."""

    # Strict: "5" is not a number and 9.0 is not a seq; unknown fields are ignored. seq and t come
    # back to the client (pong, applied_seq), so they stay numbers a JavaScript client can read.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    seq: Annotated[int, Field(ge=0, le=MAX_SEQ)] | None = None
    t: Annotated[float, Field(allow_inf_nan=False)] | None = None  # the client's clock, ms


class ControlMsg(ClientMessageBase):
    type: Literal["control"]
    key: Annotated[str, Field(max_length=MAX_KEY_NAME)]
    action: Literal["press", "release"]

    @model_validator(mode="before")
    @classmethod
    def _telefuser_names(cls, raw: Any) -> Any:
        # TeleFuser's event form names the fields control/event.
        if isinstance(raw, dict) and ("control" in raw or "event" in raw):
            raw = dict(raw)
            raw.setdefault("key", raw.pop("control", None))
            raw.setdefault("action", raw.pop("event", None))
        return raw


class ControlStateMsg(ClientMessageBase):
    type: Literal["control_state"]
    controls: Annotated[list[Annotated[str, Field(max_length=MAX_KEY_NAME)]], Field(max_length=MAX_KEYS)]


LookDelta = Annotated[float, Field(allow_inf_nan=False, ge=-MAX_LOOK_PX, le=MAX_LOOK_PX)]


class LookMsg(ClientMessageBase):
    type: Literal["look"]
    dx: LookDelta = 0.0
    dy: LookDelta = 0.0


class ResetPoseMsg(ClientMessageBase):
    type: Literal["reset_pose"]


ControlMessage = ControlMsg | ControlStateMsg | LookMsg | ResetPoseMsg
CONTROL_TYPES = ("control", "control_state", "look", "reset_pose")
_CONTROL = TypeAdapter(Annotated[ControlMessage, Field(discriminator="type")])


def first_error(exc: ValidationError, kind: str) -> str:
    """One readable line for the first thing wrong with a message of type `kind`."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"][1:]) or kind
    return f"{kind}: {where}: {first['msg']}"


def parse_control(raw: dict[str, Any]) -> ControlMessage:
    """A control message (of CONTROL_TYPES) from its JSON object; ControlError says what is wrong."""
    try:
        return _CONTROL.validate_python(raw)
    except ValidationError as exc:
        raise ControlError(first_error(exc, str(raw.get("type")))) from None


# ---- folding ----


@dataclass
class ControlState:
    held: set[str] = field(default_factory=set)
    look_dx_px: float = 0.0
    look_dy_px: float = 0.0
    last_seq: int | None = None
    reset_requested: bool = False

    def apply(self, msg: ControlMessage) -> None:
        """Fold one (validated) control message in."""
        if isinstance(msg, ControlMsg):
            key = canonical_key(msg.key)
            if key is not None and msg.action == "press":
                self.held.add(key)
            elif key is not None:
                self.held.discard(key)
        elif isinstance(msg, ControlStateMsg):
            self.held = {k for k in (canonical_key(n) for n in msg.controls) if k is not None}
        elif isinstance(msg, LookMsg):
            self.look_dx_px += msg.dx
            self.look_dy_px += msg.dy
        else:
            self.reset_requested = True
        if msg.seq is not None:
            self.last_seq = msg.seq

    def sample(self) -> tuple[ChunkControl, bool]:
        """The control for the next chunk, and whether a pose reset was asked for; consumes deltas."""
        control = ChunkControl(
            keys=frozenset(self.held), look_dx_px=self.look_dx_px, look_dy_px=self.look_dy_px, seq=self.last_seq
        )
        reset = self.reset_requested
        self.look_dx_px = self.look_dy_px = 0.0
        self.reset_requested = False
        return control, reset


@dataclass(frozen=True)
class ControlVocabulary:
    """The keys and the mouse look a model family's control adapter turns into model input; the rest
    of the one wire vocabulary is accepted and has no effect on that model. Published per preset
    (GET /v1/model `accepts`) so clients can show only what steers."""

    keys: frozenset[str]  # canonical key names (the keys of MOVE_KEYS and TURN_KEYS)
    look: bool  # whether `look` deltas steer
    meanings: tuple[tuple[str, str], ...] = ()  # (key, what it does for this model), for key help

    def __post_init__(self) -> None:
        unknown = self.keys - set(MOVE_KEYS) - set(TURN_KEYS)
        if unknown:
            raise ValueError(f"keys outside the wire vocabulary: {sorted(unknown)}")

    def record(self) -> dict[str, Any]:
        return {"keys": sorted(self.keys), "look": self.look, "meanings": dict(self.meanings)}


# The camera families (LingBot-World, the embedded world) take every key and the mouse look.
CAMERA_VOCABULARY = ControlVocabulary(
    keys=frozenset(MOVE_KEYS) | frozenset(TURN_KEYS),
    look=True,
    meanings=(
        ("w", "forward"),
        ("s", "back"),
        ("a", "strafe left"),
        ("d", "strafe right"),
        ("j", "turn left"),
        ("l", "turn right"),
        ("i", "look up"),
        ("k", "look down"),
    ),
)


def client_contract() -> dict[str, Any]:
    """The control vocabulary and limits as clients need them (published by GET /v1/model)."""
    return {
        "move_keys": sorted(MOVE_KEYS),
        "turn_keys": sorted(TURN_KEYS),
        # What each key does, so on-screen controls (a stick, turn buttons) need no copy of it.
        "move_vectors": {k: list(v) for k, v in MOVE_KEYS.items()},  # (right, forward)
        "turn_vectors": {k: list(v) for k, v in TURN_KEYS.items()},  # (yaw right, pitch up)
        "key_aliases": dict(KEY_ALIASES),
        "max_look_px": MAX_LOOK_PX,
        "max_keys": MAX_KEYS,
        "max_key_name": MAX_KEY_NAME,
    }
