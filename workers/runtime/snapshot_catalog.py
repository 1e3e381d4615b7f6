"""The engine's list of snapshots: where each one's parts are, and what the budget lets it keep.

Every stage worker holds its part of a snapshot (workers/runtime/snapshot_store.py); this catalog,
in the engine, counts all of them against one host-memory budget and decides:
- a snapshot whose parts alone exceed the memory budget is refused (dropped as soon as it is known);
- otherwise the least recently used snapshots (taken or branched from) leave memory until the new
  one fits: spilled to the spill directory while that has room under its own budget (evicting its
  least recently used first), else dropped;
- a stage that dies loses its parts, so every snapshot does: they are all dropped.
A snapshot that is gone keeps a tombstone with the reason (the last TOMBSTONES_KEPT), so asking for
it says "evicted" or "lost" rather than "unknown". Thread-safe: the scheduler thread adds and
evicts, request threads look up.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

TOMBSTONES_KEPT = 1024


class Where(Enum):
    MEMORY = "memory"
    DISK = "disk"  # spilled: gone with the workers, within the spill budget
    SAVED = "saved"  # written to the server's snapshot directory: outlives the workers, outside both budgets


@dataclass(frozen=True)
class SnapshotBudget:
    memory_bytes: int
    spill_dir: Path | None = None
    spill_bytes: int = 0  # on disk, used only with a spill directory

    def __post_init__(self) -> None:
        if self.memory_bytes < 0 or self.spill_bytes < 0:
            raise ValueError(f"snapshot budgets cannot be negative: {self}")


@dataclass(frozen=True)
class SnapshotEntry:
    snapshot_id: str
    session_id: str  # the engine session it was taken from
    chunk_index: int  # the first chunk a session opened from it generates
    chunk_latent_frames: int
    nbytes: int  # every worker's part together
    created_unix: float
    where: Where = Where.MEMORY
    saved_dir: Path | None = None  # SAVED: the directory whose <snapshot_id>/ holds its parts


@dataclass(frozen=True)
class Move:
    """Carry out on every worker: spill the snapshot's parts to `directory`, or drop them (None)."""

    snapshot_id: str
    directory: Path | None


class SnapshotGone(KeyError):
    """Asked for a snapshot that is not kept (any more): `reason` says why."""

    def __init__(self, snapshot_id: str, reason: str) -> None:
        super().__init__(snapshot_id)
        self.snapshot_id, self.reason = snapshot_id, reason

    def __str__(self) -> str:
        return f"snapshot {self.snapshot_id} {self.reason}"


class SnapshotCatalog:
    def __init__(self, budget: SnapshotBudget) -> None:
        self.budget = budget
        self._entries: OrderedDict[str, SnapshotEntry] = OrderedDict()  # least recently used first
        self._gone: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, entry: SnapshotEntry) -> list[Move]:
        """Keep a completed snapshot; returns what must move to make room (including, when it is
        refused, the snapshot's own drop: check `get` or `gone_reason` after)."""
        with self._lock:
            if entry.nbytes > self.budget.memory_bytes:
                limit = self.budget.memory_bytes / 2**30
                self._bury(entry.snapshot_id, f"needs {entry.nbytes / 2**30:.2f} GiB, over the {limit:g} GiB budget")
                return [Move(entry.snapshot_id, None)]
            moves = self._make_room(Where.MEMORY, entry.nbytes)
            self._entries[entry.snapshot_id] = entry
            return moves

    def use(self, snapshot_id: str) -> SnapshotEntry:
        """The entry, now the most recently used; SnapshotGone if it is not kept."""
        with self._lock:
            entry = self._get(snapshot_id)
            self._entries.move_to_end(snapshot_id)
            return entry

    def get(self, snapshot_id: str) -> SnapshotEntry:
        with self._lock:
            return self._get(snapshot_id)

    def mark_saved(self, snapshot_id: str, directory: Path) -> None:
        """Every worker wrote its part under `directory` and freed its memory: it counts against
        neither budget any more, and a stage's loss does not take it."""
        with self._lock:
            entry = self._get(snapshot_id)
            self._entries[snapshot_id] = replace(entry, where=Where.SAVED, saved_dir=directory)

    def add_saved(self, entry: SnapshotEntry) -> None:
        """A snapshot saved by an earlier run of the server (its files checked by the caller)."""
        assert entry.where is Where.SAVED and entry.saved_dir is not None
        with self._lock:
            self._gone.pop(entry.snapshot_id, None)
            self._entries[entry.snapshot_id] = entry

    def bury(self, snapshot_id: str, reason: str) -> None:
        """Tell anyone who asks for `snapshot_id` why it is not kept (a save found corrupt at start)."""
        with self._lock:
            self._bury(snapshot_id, reason)

    def remove(self, snapshot_id: str, reason: str = "was deleted") -> list[Move]:
        with self._lock:
            self._get(snapshot_id)
            self._bury(snapshot_id, reason)
            return [Move(snapshot_id, None)]

    def lose_all(self, reason: str) -> list[Move]:
        """The workers' parts are gone: every snapshot but the saved ones (their files are the parts)."""
        with self._lock:
            ids = [i for i, e in self._entries.items() if e.where is not Where.SAVED]
            for snapshot_id in ids:
                self._bury(snapshot_id, reason)
            return [Move(i, None) for i in ids]

    def entries(self) -> list[SnapshotEntry]:
        with self._lock:
            return list(self._entries.values())

    def bytes_in(self, where: Where) -> int:
        with self._lock:
            return self._bytes_in(where)

    # ---- under the lock ----

    def _get(self, snapshot_id: str) -> SnapshotEntry:
        entry = self._entries.get(snapshot_id)
        if entry is None:
            raise SnapshotGone(snapshot_id, self._gone.get(snapshot_id, "does not exist"))
        return entry

    def _bytes_in(self, where: Where) -> int:
        return sum(e.nbytes for e in self._entries.values() if e.where is where)

    def _make_room(self, where: Where, nbytes: int) -> list[Move]:
        limit = self.budget.memory_bytes if where is Where.MEMORY else self.budget.spill_bytes
        moves: list[Move] = []
        for victim in [e for e in self._entries.values() if e.where is where]:  # least recently used first
            if self._bytes_in(where) + nbytes <= limit:
                break
            spill = self.budget.spill_dir
            if where is Where.MEMORY and spill is not None and victim.nbytes <= self.budget.spill_bytes:
                moves += self._make_room(Where.DISK, victim.nbytes)
                self._entries[victim.snapshot_id] = replace(victim, where=Where.DISK)
                moves.append(Move(victim.snapshot_id, spill))
            else:
                self._bury(victim.snapshot_id, "was evicted to keep within the snapshot budget")
                moves.append(Move(victim.snapshot_id, None))
        return moves

    def _bury(self, snapshot_id: str, reason: str) -> None:
        self._entries.pop(snapshot_id, None)
        self._gone[snapshot_id] = reason
        while len(self._gone) > TOMBSTONES_KEPT:
            self._gone.popitem(last=False)


def new_entry(
    snapshot_id: str, session_id: str, chunk_index: int, chunk_latent_frames: int, nbytes: int
) -> SnapshotEntry:
    return SnapshotEntry(snapshot_id, session_id, chunk_index, chunk_latent_frames, nbytes, time.time())
