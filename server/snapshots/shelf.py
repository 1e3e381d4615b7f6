"""The server's snapshots in one place: the book of their lines and tokens (server/snapshots/book.py),
the engine's catalog of where their parts are, and, with WORLDRTC_SNAPSHOT_DIR, their saves on disk
(server/snapshots/saves.py). What spans the three is here: reading saves back at start, telling
whether one is saved, refusing to branch one made with something else, and keeping a line's new
token in its saves."""

from __future__ import annotations

import logging

from server.common.errors import Conflict
from server.snapshots.book import SnapshotBook
from server.snapshots.saves import SavedSnapshots, Scan
from server.snapshots.snapshot import MadeWith, ServerSnapshot
from workers.runtime.engine import PipelineEngine
from workers.runtime.snapshot_catalog import SnapshotEntry, SnapshotGone, Where

log = logging.getLogger("worldrtc.saves")


class SnapshotShelf:
    def __init__(self, book: SnapshotBook, engine: PipelineEngine, saves: SavedSnapshots | None) -> None:
        self.book, self.engine, self.saves = book, engine, saves

    def read_saves(self, scan: Scan) -> None:
        """At start: the saves an earlier run left are snapshots again, their lines' tokens (as
        hashes) opening them; a corrupt one answers its owner 410 saying so."""
        for save in scan.found:
            snap = save.snapshot
            self.book.joined_hashes(snap.origin.line, save.token_sha256)
            self.book.add(snap)
            entry = SnapshotEntry(
                snap.snapshot_id,
                snap.session_id,
                snap.chunk_index,
                save.chunk_latent_frames,
                snap.nbytes,
                snap.created,
                Where.SAVED,
                save.directory,
            )
            self.engine.adopt_saved_snapshot(entry)
        for snapshot_id, (line, hashes, why) in scan.corrupt.items():
            self.book.joined_hashes(line, hashes)
            self.book.remember_gone(snapshot_id, line, f"is corrupt on disk: {why}")
            self.engine.snapshots.bury(snapshot_id, f"is corrupt on disk: {why}")
        log.info(
            "saved snapshots: %d read back, %d corrupt, %d interrupted and removed",
            len(scan.found),
            len(scan.corrupt),
            len(scan.removed),
        )

    def is_saved(self, snapshot_id: str) -> bool:
        """The snapshot is kept on disk under WORLDRTC_SNAPSHOT_DIR (it outlives the server)."""
        try:
            return self.engine.snapshots.get(snapshot_id).where is Where.SAVED
        except SnapshotGone:
            return False

    @staticmethod
    def require_compatible(snapshot: ServerSnapshot, here: MadeWith) -> None:
        """A branch or rewind reproduces the snapshot only on what it was made with: 409 naming what differs."""
        differs = snapshot.made_with.differences(here)
        if differs:
            raise Conflict(
                f"snapshot {snapshot.snapshot_id} was saved with {'; '.join(differs)}: a branch here would not "
                "continue it as it was; serve it with the same weights, placement, threads and savings"
            )

    def joined(self, line: str, token: str) -> None:
        """A session of `line` (its first, or a branch): its token opens the line's snapshots, and
        after a restart its saves too (their metadata's hashes: a few small files)."""
        self.book.joined(line, token)
        if self.saves is None:
            return
        hashes = self.book.line_hashes(line)
        for snap in self.book.snapshots.values():
            if snap.origin.line == line and self.is_saved(snap.snapshot_id):
                self.saves.update_tokens(snap.snapshot_id, hashes)
