"""Control traces in the TeleFuser shape, replayed on the media clock.

    {"events": [{"delay_s": 1.0, "message": {"type": "control", "key": "ArrowUp", "action": "press"}}, …]}

`delay_s` is the wait before an event, counted from the previous event (so a trace replays as a
sequence of sleeps, the way a client would send it). A chunk takes the control state in force at
its start time on the media clock: every event at or before that time has been applied. Control
messages are validated when the trace loads (`workers/controls.py`); other messages (`stop`,
`prompt`, `ping`) are kept for clients to send and do not steer.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.controls import CONTROL_TYPES, ChunkControl, ControlError, ControlMessage, ControlState, parse_control


@dataclass(frozen=True)
class TraceEvent:
    at_s: float  # absolute time on the media clock
    message: dict[str, Any]  # as written: what a client sends
    control: ControlMessage | None = None  # the message, validated, if it steers


@dataclass(frozen=True)
class Trace:
    events: tuple[TraceEvent, ...]

    @staticmethod
    def parse(data: Any) -> Trace:
        if not isinstance(data, dict) or not isinstance(data.get("events"), list):
            raise ValueError("trace must be a JSON object with an 'events' list")
        events, clock = [], 0.0
        for i, item in enumerate(data["events"]):
            if not isinstance(item, dict) or not isinstance(item.get("message"), dict):
                raise ValueError(f"trace event {i} needs a 'message' object")
            delay = item.get("delay_s", 0.0)
            if not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
                raise ValueError(f"trace event {i}: delay_s must be a non-negative number")
            clock += float(delay)
            message = item["message"]
            try:
                control = parse_control(message) if message.get("type") in CONTROL_TYPES else None
            except ControlError as exc:
                raise ValueError(f"trace event {i}: {exc}") from None
            events.append(TraceEvent(at_s=clock, message=message, control=control))
        return Trace(tuple(events))

    @staticmethod
    def load(path: str | Path) -> Trace:
        return Trace.parse(json.loads(Path(path).read_text()))

    @property
    def duration_s(self) -> float:
        return self.events[-1].at_s if self.events else 0.0

    @staticmethod
    def random_walk(duration_s: float, seed: int = 0, min_gap_s: float = 0.6, max_gap_s: float = 1.8) -> Trace:
        """Held-key changes (`control_state`) at uniformly random gaps: controls land at random phases
        of the chunk schedule, so the wait for the next chunk start averages half a chunk."""
        rng = random.Random(seed)
        events, t = [], 0.0
        while t < duration_s:
            message = {"type": "control_state", "controls": list(rng.choice(WALK_KEYS))}
            events.append(TraceEvent(at_s=t, message=message, control=parse_control(message)))
            t += rng.uniform(min_gap_s, max_gap_s)
        return Trace(tuple(events))


# Held-key sets a walker uses: forward, turns, strafes, looks and standing still.
WALK_KEYS: tuple[tuple[str, ...], ...] = (
    ("w",),
    ("w", "j"),
    ("w", "l"),
    ("a",),
    ("d",),
    ("j",),
    ("l",),
    ("i",),
    ("k",),
    (),
)


class TraceReplayer:
    """Yields each chunk's control, given the chunk's start time on the media clock."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.state = ControlState()
        self._next = 0

    def control_at(self, start_s: float) -> tuple[ChunkControl, bool]:
        events = self.trace.events
        while self._next < len(events) and events[self._next].at_s <= start_s:
            control = events[self._next].control
            if control is not None:
                self.state.apply(control)
            self._next += 1
        return self.state.sample()
