"""Snapshots: save a world, start branches from it, rewind to it.

    POST   /v1/sessions/{id}/snapshots          save the session's whole generation state (201 SnapshotInfo)
    GET    /v1/snapshots/{snapshot}             what it is, where it is kept
    DELETE /v1/snapshots/{snapshot}             forget it
    POST   /v1/sessions {"snapshot": ID}        a new session that continues from it (a branch; WHEP:
                                                POST /v1/whep?snapshot=ID)
    POST   /v1/sessions/{id}/restore {"snapshot": ID}   rewind a live session to it, in place

A snapshot is taken at the session's next chunk boundary, each stage copying its own state between
two chunks (workers/runtime/scheduler.py), so the viewer waits for no more than one copy. It holds
everything that determines the frames after it: the DiT's KV caches and context K/V, the encoder's
and the decoder's causal caches, the sampler's generator, the camera pose, the chunk counters; its
session's image, prompt, seed and chunk size stay with it here. A branch fed the same controls
produces the same frames as the session did after the snapshot, bit for bit (the determinism
contract: same model, weights, placement and thread count, which one server always has).

Ownership is a capability, as for the session itself: a snapshot belongs to its session's *line*,
the session it was taken from and every session branched from that line, and any of their tokens
(or the API token) may use it. A token of another line gets 403, no token or an unknown one 401.

The engine's catalog (workers/runtime/snapshot_catalog.py) keeps them within
WORLDRTC_SNAPSHOT_BUDGET_GIB of host memory, least recently used evicted first (spilled to
WORLDRTC_SNAPSHOT_SPILL_DIR when it is set). One the memory plan says cannot fit is refused before
any copy (507 `snapshot_too_large`); asking for one that was evicted says so (410 `snapshot_gone`).
"""

import asyncio
import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Request

from server.errors import (
    Forbidden,
    Gone,
    InsufficientStorage,
    NotFound,
    Unauthorized,
)
from server.protocol import RestoreRequest, SessionInfo, SnapshotInfo
from server.session import ServerSession
from server.snapshot import ServerSnapshot
from workers.runtime.snapshot_catalog import TOMBSTONES_KEPT, SnapshotGone

if TYPE_CHECKING:
    from server.app import AppState

SNAPSHOT_WAIT_S = 60.0  # a snapshot waits for its boundary chunk on every stage: a few chunks at most


def snapshot_url(state: "AppState", snapshot_id: str) -> str:
    return state.node_url(f"/v1/snapshots/{snapshot_id}")


class SnapshotBook:
    """The server's side of its snapshots: their origin and line, which tokens hold each line, and
    the lines of the last TOMBSTONES_KEPT that are gone (their owners are told why: 410)."""

    def __init__(self, listed_lines: Callable[[], set[str]]) -> None:
        self.listed_lines = listed_lines  # the lines of the sessions the server still lists
        self.snapshots: dict[str, ServerSnapshot] = {}
        self.gone: OrderedDict[str, tuple[str, str]] = OrderedDict()  # id -> (line, why)
        self._line_tokens: dict[str, set[str]] = {}  # line -> tokens of its sessions

    def joined(self, line: str, token: str) -> None:
        self._line_tokens.setdefault(line, set()).add(token)

    def add(self, snapshot: ServerSnapshot) -> None:
        self.snapshots[snapshot.snapshot_id] = snapshot

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
        given = request.headers.get("authorization", "")
        return any(_bearer_matches(given, token) for token in self._line_tokens.get(line, ()))

    def any_line(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return any(_bearer_matches(given, t) for tokens in self._line_tokens.values() for t in tokens)


def _bearer_matches(given: str, token: str) -> bool:
    return secrets.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {token}".encode())


def authorize_snapshot(state: "AppState", snapshot_id: str, request: Request) -> ServerSnapshot:
    """The snapshot, if the request's bearer may use it: a token of its line, or the API token.
    Kept by the engine or not: an evicted one is 410 (to its owner), an unknown one 404."""
    book = state.snapshot_book
    snapshot = book.snapshots.get(snapshot_id)
    api = state.settings.api_token
    operator = api is not None and _bearer_matches(request.headers.get("authorization", ""), api)
    line = snapshot.origin.line if snapshot is not None else book.gone.get(snapshot_id, ("", ""))[0]
    if not (operator or book.owns(line, request)):
        if book.any_line(request):
            if snapshot is None and snapshot_id not in book.gone:
                raise NotFound(f"no snapshot {snapshot_id!r}")
            raise Forbidden("this snapshot belongs to another session's line; its token does not open it")
        raise Unauthorized("send 'Authorization: Bearer <a token of the snapshot's session>'")
    if snapshot is not None:
        try:
            state.engine.snapshots.get(snapshot_id)
            return snapshot
        except SnapshotGone as gone:
            book.forget(snapshot_id, gone.reason)
    if snapshot_id in book.gone:
        raise Gone(f"snapshot {snapshot_id} {book.gone[snapshot_id][1]}; take a new one")
    raise NotFound(f"no snapshot {snapshot_id!r}")


def snapshot_info(state: "AppState", snapshot: ServerSnapshot) -> dict[str, Any]:
    """A snapshot kept by this server's engine: the model, weights, placement and thread count it was
    taken with are the server's (snapshots do not outlive its workers)."""
    entry = state.engine.snapshots.get(snapshot.snapshot_id)
    return SnapshotInfo(
        snapshot_id=snapshot.snapshot_id,
        session_id=snapshot.session_id,
        chunk_index=snapshot.chunk_index,
        frames=snapshot.frames,
        bytes=snapshot.nbytes,
        created=snapshot.created,
        where=entry.where.value,
        parent=snapshot.parent,
        model=state.preset.name,
        weights=state.weights_digest,
        placement=state.placement.name,
        intra_op_threads=state.placement.cpu_threads_per_worker,
        snapshot_url=snapshot_url(state, snapshot.snapshot_id),
    ).model_dump()


async def take_snapshot(state: "AppState", session: ServerSession) -> ServerSnapshot:
    """Save `session` at its next chunk boundary; raises what the client should be told."""
    budget = int(state.settings.snapshot_budget_gib * 2**30)
    if budget == 0:
        raise NotFound("this server keeps no snapshots (WORLDRTC_SNAPSHOT_BUDGET_GIB=0)")
    if state.snapshot_plan_bytes > budget:
        raise InsufficientStorage(
            f"a {state.preset.name} snapshot needs at least {state.snapshot_plan_bytes / 2**30:.2f} GiB "
            "(the memory plan), "
            f"over the {state.settings.snapshot_budget_gib:g} GiB budget (WORLDRTC_SNAPSHOT_BUDGET_GIB)"
        )
    entry = await session.snapshot(SNAPSHOT_WAIT_S)
    history = None
    if session.recording is not None:
        history = await asyncio.to_thread(session.recording.history, entry.chunk_index)
    snapshot = ServerSnapshot(
        entry.snapshot_id,
        session.id,
        entry.chunk_index,
        entry.nbytes,
        entry.created_unix,
        session.origin,
        session.parent,
        history,
    )
    state.snapshot_book.add(snapshot)
    return snapshot


def snapshot_router(state: "AppState") -> APIRouter:
    router = APIRouter()

    def snapshot_for(snapshot_id: str, request: Request) -> ServerSnapshot:
        return authorize_snapshot(state, snapshot_id, request)

    @router.post("/v1/sessions/{session_id}/snapshots", status_code=201, response_model=SnapshotInfo)
    async def create(session: Annotated[ServerSession, Depends(state.session_for)]) -> dict[str, Any]:
        return snapshot_info(state, await take_snapshot(state, session))

    @router.get("/v1/snapshots/{snapshot_id}", response_model=SnapshotInfo)
    async def get(snapshot: Annotated[ServerSnapshot, Depends(snapshot_for)]) -> dict[str, Any]:
        return snapshot_info(state, snapshot)

    @router.delete("/v1/snapshots/{snapshot_id}", response_model=SnapshotInfo)
    async def delete(snapshot: Annotated[ServerSnapshot, Depends(snapshot_for)]) -> dict[str, Any]:
        info = snapshot_info(state, snapshot)
        try:
            state.engine.drop_snapshot(snapshot.snapshot_id)
        except SnapshotGone as gone:
            raise Gone(str(gone)) from None
        finally:
            state.snapshot_book.forget(snapshot.snapshot_id, "was deleted")
        return info

    @router.post("/v1/sessions/{session_id}/restore", response_model=SessionInfo)
    async def restore(
        body: RestoreRequest, session: Annotated[ServerSession, Depends(state.session_for)], request: Request
    ) -> dict[str, Any]:
        snapshot = authorize_snapshot(state, body.snapshot, request)
        if snapshot.origin.line != session.origin.line:
            raise Forbidden("the snapshot belongs to another line: start a branch from it instead")
        try:
            await session.restore(snapshot)
        except SnapshotGone as gone:
            raise Gone(f"{gone}; take a new one") from None
        return session.info()

    return router
