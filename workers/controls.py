"""Latest-wins control state, folded from client control messages and sampled once per chunk.

Messages use the TeleFuser event form (DESIGN §5): `control` {key, action: press|release}
(`control`/`event` accepted as aliases of `key`/`action`), `control_state` {controls: [keys]},
`look` {dx, dy}, `reset_pose`. Other message types (`prompt`, `ping`, `stop`) do not change the
camera and are ignored here. Mouse deltas accumulate until a chunk samples them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from workers.models.camera import ChunkControl, canonical_key

MAX_LOOK_PX = 10_000.0  # per message; larger deltas are a client bug, not a fast flick


class ControlError(ValueError):
    """A control message that cannot be applied."""


@dataclass
class ControlState:
    held: set[str] = field(default_factory=set)
    look_dx_px: float = 0.0
    look_dy_px: float = 0.0
    last_seq: int | None = None
    reset_requested: bool = False

    def apply(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "control":
            name = message.get("key", message.get("control"))
            action = message.get("action", message.get("event"))
            if not isinstance(name, str) or action not in ("press", "release"):
                raise ControlError("control needs a string 'key' and 'action' of press|release")
            key = canonical_key(name)
            if key is not None:
                if action == "press":
                    self.held.add(key)
                else:
                    self.held.discard(key)
        elif kind == "control_state":
            controls = message.get("controls")
            if not isinstance(controls, list) or not all(isinstance(k, str) for k in controls):
                raise ControlError("control_state needs 'controls': a list of key names")
            self.held = {k for k in (canonical_key(n) for n in controls) if k is not None}
        elif kind == "look":
            dx, dy = message.get("dx", 0.0), message.get("dy", 0.0)
            if not all(isinstance(v, int | float) and math.isfinite(v) and abs(v) <= MAX_LOOK_PX for v in (dx, dy)):
                raise ControlError(f"look needs finite numeric 'dx'/'dy' within ±{MAX_LOOK_PX:g}")
            self.look_dx_px += float(dx)
            self.look_dy_px += float(dy)
        elif kind == "reset_pose":
            self.reset_requested = True
        else:
            return
        seq = message.get("seq")
        if isinstance(seq, int):
            self.last_seq = seq

    def sample(self) -> tuple[ChunkControl, bool]:
        """The control for the next chunk, and whether a pose reset was asked for; consumes deltas."""
        control = ChunkControl(
            keys=frozenset(self.held), look_dx_px=self.look_dx_px, look_dy_px=self.look_dy_px, seq=self.last_seq
        )
        reset = self.reset_requested
        self.look_dx_px = self.look_dy_px = 0.0
        self.reset_requested = False
        return control, reset
