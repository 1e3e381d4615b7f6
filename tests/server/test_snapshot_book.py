"""Who may open a snapshot: the tokens of its line, for as long as the line has a listed session or a
snapshot (kept, or remembered as gone)."""

from __future__ import annotations

import numpy as np
from starlette.requests import Request

from server.snapshots.book import SnapshotBook
from server.snapshots.snapshot import MadeWith, Origin, ServerSnapshot


def bearer(token: str) -> Request:
    return Request({"type": "http", "headers": [(b"authorization", f"Bearer {token}".encode())]})


def snapshot(snapshot_id: str, line: str) -> ServerSnapshot:
    origin = Origin(np.zeros((8, 8, 3), np.uint8), "", 0, 16, 4, None, line=line)
    return ServerSnapshot(snapshot_id, line, 3, 100, 0.0, origin, None, None, MadeWith("tiny", "w", "cpu", 1))


def test_a_line_keeps_its_tokens_while_a_session_or_a_snapshot_needs_them() -> None:
    listed = {"a", "b"}
    book = SnapshotBook(lambda: set(listed))
    book.joined("a", "tok-a")
    book.joined("a", "tok-a-branch")  # a branch joins its snapshot's line
    book.joined("b", "tok-b")
    book.add(snapshot("s1", "a"))
    assert book.owns("a", bearer("tok-a")) and book.owns("a", bearer("tok-a-branch"))
    assert not book.owns("a", bearer("tok-b")) and book.any_line(bearer("tok-b"))
    assert not book.any_line(bearer("nobody"))
    # Forgetting another line's snapshot leaves a listed line alone, even one without snapshots.
    book.add(snapshot("s2", "b"))
    book.forget("s2", "was deleted")
    assert book.owns("b", bearer("tok-b")) and book.gone["s2"] == ("b", "was deleted")
    # Once nothing needs them (no listed session, no snapshot, no tombstone) they go.
    listed.clear()
    book.forget("s1", "was evicted")
    assert book.owns("a", bearer("tok-a"))  # the tombstone still answers its owner with 410
    book.gone.clear()
    book.add(snapshot("s3", "c"))
    book.forget("s3", "was deleted")
    assert not book.owns("a", bearer("tok-a")) and not book.owns("b", bearer("tok-b"))
