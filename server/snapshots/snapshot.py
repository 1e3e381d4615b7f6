"""A snapshot as the server keeps it: the engine's state is in the workers (server/http/routes/snapshots.py says
how snapshots are taken and used); what a branch needs besides it, its line's start and recorded
chunks, is here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from server.common.errors import Conflict, InsufficientStorage, Unavailable
from server.media.recording import ChunkEntry
from server.wire.protocol import Parent
from workers.chunk_geometry import chunk_first_frame
from workers.models.savings import NO_SAVINGS, Savings
from workers.runtime.placement import Placement
from workers.runtime.snapshot_catalog import SnapshotEntry


@dataclass
class Origin:
    """What a branch starts from besides the engine's state: the line's start and its recording."""

    image: Any  # HxWx3 uint8, fitted to the model
    prompt: str
    seed: int
    fps: int
    chunk_latent_frames: int
    scene: str | None
    line: str  # the id of the line's first session


@dataclass(frozen=True)
class MadeWith:
    """What a snapshot's frames depend on besides it (workers/determinism.py): a branch must run on the same."""

    model: str
    weights: str  # workers/models/weights_digest.py
    placement: str
    intra_op_threads: int
    savings: str = NO_SAVINGS.describe()  # workers/models/savings.py, as the command line names them

    @staticmethod
    def of(model: str, weights: str, placement: Placement, savings: Savings) -> MadeWith:
        return MadeWith(model, weights, placement.name, placement.cpu_threads_per_worker, savings.describe())

    def differences(self, here: MadeWith) -> list[str]:
        """What differs from `here` (this server), in words; empty when a branch would be bit-exact."""
        return [
            f"{name} {getattr(self, name)} (this server: {getattr(here, name)})"
            for name in ("model", "weights", "placement", "intra_op_threads", "savings")
            if getattr(self, name) != getattr(here, name)
        ]


@dataclass
class ServerSnapshot:
    snapshot_id: str
    session_id: str
    chunk_index: int
    nbytes: int
    created: float
    origin: Origin
    parent: Parent | None  # the snapshot the session it was taken from started from
    history: list[ChunkEntry] | None  # the line's recorded chunks before it (with recordings)
    made_with: MadeWith
    frames: int = field(init=False)

    @classmethod
    def of(
        cls,
        entry: SnapshotEntry,
        session_id: str,
        origin: Origin,
        parent: Parent | None,
        history: list[ChunkEntry] | None,
        made_with: MadeWith,
    ) -> ServerSnapshot:
        """The engine's catalog entry, with what the server keeps beside it."""
        return cls(
            entry.snapshot_id,
            session_id,
            entry.chunk_index,
            entry.nbytes,
            entry.created_unix,
            origin,
            parent,
            history,
            made_with,
        )

    def __post_init__(self) -> None:
        self.frames = chunk_first_frame(self.chunk_index, self.origin.chunk_latent_frames)

    def as_parent(self) -> Parent:
        return Parent(snapshot_id=self.snapshot_id, session_id=self.session_id, chunk_index=self.chunk_index)


def snapshot_error(error: str) -> Exception:
    """The engine's reason a snapshot failed, as what the client is told."""
    if "budget" in error:
        return InsufficientStorage(error)
    if "running session" in error or "being taken" in error:
        return Conflict(error)
    return Unavailable(f"the snapshot failed: {error}", retry_after_s=2)
