"""Who may open a snapshot: the server's book of its snapshots, their lines and the tokens of each.

A snapshot belongs to its session's *line*, the session it was taken from and every session
branched from that line, and any of their tokens (or the API token) may use it; a token of another
line gets 403, no token or an unknown one 401 (server/http/routes/snapshots.py says what snapshots are). The
book also remembers the lines of the last TOMBSTONES_KEPT snapshots that are gone, so that their
owners are told why (410) rather than "unknown".

The app state keeps one (server/state.py): a branch's create asks it before any work, as the
snapshot routes do.
"""

import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Callable

from fastapi import Request

from server.common.errors import Forbidden, Gone, NotFound, Unauthorized
from server.snapshots.snapshot import ServerSnapshot
from workers.runtime.snapshot_catalog import TOMBSTONES_KEPT, SnapshotCatalog, SnapshotGone


class SnapshotBook:
    """The server's side of its snapshots: their origin and line, which tokens hold each line, and
    the lines of the last TOMBSTONES_KEPT that are gone (their owners are told why: 410)."""

    def __init__(self, listed_lines: Callable[[], set[str]]) -> None:
        self.listed_lines = listed_lines  # the lines of the sessions the server still lists
        self.snapshots: dict[str, ServerSnapshot] = {}
        self.gone: OrderedDict[str, tuple[str, str]] = OrderedDict()  # id -> (line, why)
        # line -> SHA-256 (hex) of each token of its sessions: what a save keeps on disk, so a line's
        # tokens open its saves after a restart without the server ever storing a token.
        self._line_tokens: dict[str, set[str]] = {}

    def joined(self, line: str, token: str) -> None:
        self._line_tokens.setdefault(line, set()).add(token_sha256(token))

    def joined_hashes(self, line: str, hashes: list[str]) -> None:
        """A line read back from disk (server/snapshots/saves.py): its tokens as their hashes."""
        self._line_tokens.setdefault(line, set()).update(hashes)

    def line_hashes(self, line: str) -> list[str]:
        return sorted(self._line_tokens.get(line, ()))

    def lines_of(self, request: Request) -> set[str]:
        """The lines the request's bearer holds a token of."""
        given = _bearer_sha256(request)
        return {line for line, hashes in self._line_tokens.items() if given in hashes}

    def add(self, snapshot: ServerSnapshot) -> None:
        self.snapshots[snapshot.snapshot_id] = snapshot

    def remember_gone(self, snapshot_id: str, line: str, why: str) -> None:
        """A snapshot its owner should be told is gone, and why (a save found corrupt at start)."""
        self.gone[snapshot_id] = (line, why)
        while len(self.gone) > TOMBSTONES_KEPT:
            self.gone.popitem(last=False)

    def forget(self, snapshot_id: str, why: str) -> None:
        gone = self.snapshots.pop(snapshot_id, None)
        if gone is None:
            return
        self.gone[snapshot_id] = (gone.origin.line, why)
        while len(self.gone) > TOMBSTONES_KEPT:
            self.gone.popitem(last=False)
        # A line's tokens go with its last session and its last snapshot, kept or remembered.
        needed = self.listed_lines() | {s.origin.line for s in self.snapshots.values()}
        needed |= {line for line, _ in self.gone.values()}
        for line in [line for line in self._line_tokens if line not in needed]:
            del self._line_tokens[line]

    def owns(self, line: str, request: Request) -> bool:
        # Hashes compared, not tokens: the time a comparison takes says nothing of a token.
        return _bearer_sha256(request) in self._line_tokens.get(line, ())

    def any_line(self, request: Request) -> bool:
        return bool(self.lines_of(request))

    def authorize(
        self, snapshot_id: str, request: Request, api_token: str | None, catalog: SnapshotCatalog
    ) -> ServerSnapshot:
        """The snapshot, if the request's bearer may use it: a token of its line, or the API token.
        Kept by the engine (`catalog`) or not: an evicted one is 410 (to its owner), an unknown one 404."""
        snapshot = self.snapshots.get(snapshot_id)
        operator = api_token is not None and _bearer_matches(request.headers.get("authorization", ""), api_token)
        line = snapshot.origin.line if snapshot is not None else self.gone.get(snapshot_id, ("", ""))[0]
        if not (operator or self.owns(line, request)):
            if self.any_line(request):
                if snapshot is None and snapshot_id not in self.gone:
                    raise NotFound(f"no snapshot {snapshot_id!r}")
                raise Forbidden("this snapshot belongs to another session's line; its token does not open it")
            raise Unauthorized("send 'Authorization: Bearer <a token of the snapshot's session>'")
        if snapshot is not None:
            try:
                catalog.get(snapshot_id)
                return snapshot
            except SnapshotGone as gone:
                self.forget(snapshot_id, gone.reason)
        if snapshot_id in self.gone:
            raise Gone(f"snapshot {snapshot_id} {self.gone[snapshot_id][1]}; take a new one")
        raise NotFound(f"no snapshot {snapshot_id!r}")


def _bearer_matches(given: str, token: str) -> bool:
    return secrets.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode())


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def _bearer_sha256(request: Request) -> str:
    given = request.headers.get("authorization", "")
    return token_sha256(given.removeprefix("Bearer ")) if given.startswith("Bearer ") else ""
