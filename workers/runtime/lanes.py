"""A stage as the scheduler sees it (`Lane`): the one command it computes (`Assignment`), the
open, prompt and close commands queued ahead of chunk work, a round-robin pointer over sessions,
its busy and idle time, and how long it may take to answer before it counts as hung (`Deadlines`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from workers.runtime.messages import ChunkCommitted, CloseSession, EncodePrompt, OpenSession, Reply, Stage, TensorRef

IDLE_INTERVALS_KEPT = 10_000  # per stage: a replay's worth (hours of chunks) for timelines


class CommandKind(Enum):
    OPEN = "open"
    PROMPT = "prompt"
    CHUNK = "chunk"
    CLOSE = "close"
    SNAPSHOT = "snapshot"


@dataclass(frozen=True)
class Deadlines:
    """How long a stage may take to answer a command before it counts as hung.

    A kind of command the stage has answered before gets `factor` × the median of its last `window`
    answer times, and at least `floor_s`; one it has never answered (first calls compile and
    allocate) gets `first_s`. The server's warm-up chunks send every kind once.
    """

    floor_s: float = 3.0
    factor: float = 4.0
    first_s: float = 300.0
    window: int = 16

    def __post_init__(self) -> None:
        if self.floor_s <= 0 or self.factor < 1 or self.first_s <= 0 or self.window < 1:
            raise ValueError(f"invalid deadlines: {self}")

    def budget_s(self, history: deque[float] | None) -> float:
        if not history:
            return self.first_s
        ordered = sorted(history)
        return max(self.floor_s, self.factor * ordered[len(ordered) // 2])


@dataclass
class Assignment:
    """The one command a stage is computing; a multi-rank stage replies once per rank."""

    session_id: str
    epoch: int
    kind: CommandKind
    chunk_index: int | None
    sent_t: float
    deadline_t: float = math.inf  # no answer by then: the stage is hung (set as the lane starts it)
    inputs: tuple[tuple[Stage, TensorRef], ...] = ()  # (producer, ref) the command reads
    replies: list[Reply] = field(default_factory=list)
    commits: list[ChunkCommitted] = field(default_factory=list)  # a DiT chunk's, after its replies


@dataclass
class Lane:
    """One stage as the scheduler sees it."""

    stage: Stage
    world_size: int
    alive: bool = False
    assignment: Assignment | None = None
    queued: deque[OpenSession | EncodePrompt | CloseSession] = field(default_factory=deque)  # ahead of chunk work
    rr: int = 0  # round-robin pointer over sessions
    idle_since: float | None = None
    idle_s: float = 0.0
    # The most recent idle intervals (for benchmarks' timelines), since the scheduler's origin; the
    # oldest are dropped so that a server running for weeks holds a bounded number.
    idle_intervals: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=IDLE_INTERVALS_KEPT))
    busy_s: float = 0.0
    answer_s: dict[CommandKind, deque[float]] = field(default_factory=dict)  # recent send-to-answer times

    def start(self, assignment: Assignment, deadlines: Deadlines, now: float, origin_t: float, open_: bool) -> None:
        """The stage starts `assignment`, due by its kind's budget; the idle time since its last
        answer counts while sessions are open (`open_`), as an interval since `origin_t`."""
        if self.idle_since is not None and open_:
            self.idle_intervals.append((self.idle_since - origin_t, now - origin_t))
            self.idle_s += now - self.idle_since
        self.idle_since = None
        assignment.deadline_t = now + deadlines.budget_s(self.answer_s.get(assignment.kind))
        self.assignment = assignment

    def answered(self, deadlines: Deadlines, now: float) -> Assignment:
        """Every rank has answered the current assignment: the stage is idle from `now`, and the
        answer's time joins its kind's history (the next deadlines)."""
        assignment = self.assignment
        assert assignment is not None
        self.assignment, self.idle_since = None, now
        history = self.answer_s.setdefault(assignment.kind, deque(maxlen=deadlines.window))
        history.append(now - assignment.sent_t)
        return assignment

    def times(self, now: float, open_: bool) -> dict[str, Any]:
        """Busy and idle seconds; idle time counts while sessions are open (`open_`), up to `now`."""
        idle = self.idle_s
        if self.idle_since is not None and open_:
            idle += now - self.idle_since
        return {"busy_s": self.busy_s, "idle_s": idle, "idle_intervals": list(self.idle_intervals)}
