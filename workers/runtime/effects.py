"""What the scheduler asks the engine to do (workers/runtime/scheduler.py's docstring lists them),
carried out in order: send a command, hand slots back, deliver frames, end a session, report a
snapshot, replace a lost stage."""

from __future__ import annotations

from dataclasses import dataclass

from workers.runtime.channel import Ack
from workers.runtime.messages import Command, FramesReady, Stage
from workers.runtime.records import ChunkRecord
from workers.runtime.scheduled_session import SessionSpec


@dataclass(frozen=True)
class Send:
    stage: Stage
    command: Command


@dataclass(frozen=True)
class ReleaseSlots:
    producer: Stage
    acks: tuple[Ack, ...]


@dataclass(frozen=True)
class Deliver:
    session: SessionSpec
    part: FramesReady
    record: ChunkRecord
    last: bool


@dataclass(frozen=True)
class Ended:
    session: SessionSpec
    error: str | None


@dataclass(frozen=True)
class StageLost:
    stage: Stage
    error: str


@dataclass(frozen=True)
class SnapshotDone:
    snapshot_id: str
    session: SessionSpec | None  # None: asked of a session that had already ended
    chunk_index: int  # the boundary: a session opened from it starts with this chunk
    nbytes: dict[Stage, int]  # every rank's part, summed per stage
    error: str | None = None  # failed: drop whatever parts were stored


Effect = Send | ReleaseSlots | Deliver | Ended | StageLost | SnapshotDone
