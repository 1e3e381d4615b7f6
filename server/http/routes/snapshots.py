"""Snapshots: save a world, start branches from it, rewind to it.

    POST   /v1/sessions/{id}/snapshots          save the session's whole generation state (201 SnapshotInfo)
    GET    /v1/snapshots                        the snapshots of the bearer's lines (the web page's strip)
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
(or the API token) may use it. A token of another line gets 403, no token or an unknown one 401
(server/snapshots/book.py keeps the lines and their tokens).

The engine's catalog (workers/runtime/snapshot_catalog.py) keeps them within
WORLDRTC_SNAPSHOT_BUDGET_GIB of host memory, least recently used evicted first (spilled to
WORLDRTC_SNAPSHOT_SPILL_DIR when it is set). With WORLDRTC_SNAPSHOT_DIR, each is saved to disk as
it is taken and outlives the server (server/snapshots/saves.py): its memory is freed once written,
and a branch reads its parts from the files. One the memory plan says cannot fit is refused before
any copy (507 `snapshot_too_large`); asking for one that was evicted says so (410 `snapshot_gone`).
"""

import asyncio
import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from server.common.errors import Forbidden, Gone, InsufficientStorage, NotFound, Unauthorized, Unavailable
from server.http.dependencies import SessionDep, StateDep, bearer_is
from server.session.info import session_info
from server.session.session import ServerSession
from server.snapshots.saves import SavedSnapshots
from server.snapshots.snapshot import ServerSnapshot
from server.state import AppState
from server.wire.protocol import RestoreRequest, SessionInfo, SnapshotInfo
from workers.runtime.snapshot_catalog import SnapshotGone

SNAPSHOT_WAIT_S = 60.0  # a snapshot waits for its boundary chunk on every stage: a few chunks at most


def snapshot_url(state: AppState, snapshot_id: str) -> str:
    return state.node_url(f"/v1/snapshots/{snapshot_id}")


def snapshot_info(state: AppState, snapshot: ServerSnapshot) -> dict[str, Any]:
    """A snapshot kept by this server's engine, with the model, weights, placement and thread count
    it was made with (a save read back from disk may have been made with others)."""
    entry = state.engine.snapshots.get(snapshot.snapshot_id)
    made = snapshot.made_with
    return SnapshotInfo(
        snapshot_id=snapshot.snapshot_id,
        session_id=snapshot.session_id,
        chunk_index=snapshot.chunk_index,
        frames=snapshot.frames,
        bytes=snapshot.nbytes,
        created=snapshot.created,
        where=entry.where.value,
        parent=snapshot.parent,
        model=made.model,
        weights=made.weights,
        placement=made.placement,
        intra_op_threads=made.intra_op_threads,
        snapshot_url=snapshot_url(state, snapshot.snapshot_id),
    ).model_dump()


async def take_snapshot(state: AppState, session: ServerSession, *, to_disk: bool = True) -> ServerSnapshot:
    """Save `session` at its next chunk boundary (and to disk, with saves on, unless `to_disk` is
    False: a turn's hand-over needs it only until the next driver's session opens from it); raises
    what the client should be told."""
    budget = int(state.settings.snapshot_budget_gib * 2**30)
    if budget == 0:
        raise NotFound("this server keeps no snapshots (WORLDRTC_SNAPSHOT_BUDGET_GIB=0)")
    if state.snapshot_plan_bytes > budget:
        raise InsufficientStorage(
            f"a {state.preset.name} snapshot needs at least {state.snapshot_plan_bytes / 2**30:.2f} GiB "
            "(the memory plan), "
            f"over the {state.settings.snapshot_budget_gib:g} GiB budget (WORLDRTC_SNAPSHOT_BUDGET_GIB)"
        )
    snapshot = await session.snapshot(SNAPSHOT_WAIT_S)
    state.snapshot_book.add(snapshot)
    if state.saves is not None and to_disk:
        await save_to_disk(state, state.saves, snapshot)
    return snapshot


async def save_to_disk(state: AppState, saves: SavedSnapshots, snapshot: ServerSnapshot) -> None:
    """Write a new snapshot under WORLDRTC_SNAPSHOT_DIR (server/snapshots/saves.py): the workers
    their parts, then the server its metadata and manifest; then the oldest saves past the quota go.
    A save that cannot be written is dropped whole (503), never left half-written."""
    loop = asyncio.get_running_loop()
    written: asyncio.Future[str | None] = loop.create_future()

    def settle(error: str | None) -> None:
        if not written.done():  # a late answer after the wait gave up
            written.set_result(error)

    def on_done(error: str | None) -> None:  # the engine's scheduler thread
        loop.call_soon_threadsafe(settle, error)

    snapshot_id = snapshot.snapshot_id
    state.engine.keep_snapshot(snapshot_id, saves.directory, on_done)
    try:
        error = await asyncio.wait_for(written, SNAPSHOT_WAIT_S)
        if error is None:
            hashes = state.snapshot_book.line_hashes(snapshot.origin.line)
            await asyncio.to_thread(saves.write, snapshot, state.made_with, hashes)
    except (TimeoutError, OSError) as exc:
        error = str(exc) or f"the workers did not write it within {SNAPSHOT_WAIT_S:g} s"
    if error is not None:
        forget(state, snapshot_id, "could not be saved to disk")
        raise Unavailable(f"the snapshot could not be saved to disk: {error}", retry_after_s=2)
    for old in saves.over_quota():
        forget(state, old, "was removed to keep the saves within WORLDRTC_SNAPSHOT_DIR_QUOTA_GIB")


def forget(state: AppState, snapshot_id: str, why: str) -> None:
    """Drop a snapshot everywhere: the workers' parts, the book (its owners told `why`), its save."""
    with contextlib.suppress(SnapshotGone):
        state.engine.drop_snapshot(snapshot_id)
    state.snapshot_book.forget(snapshot_id, why)
    if state.saves is not None:
        state.saves.remove(snapshot_id)


def snapshot_for(snapshot_id: str, request: Request, state: StateDep) -> ServerSnapshot:
    """FastAPI dependency: the snapshot in the path, if the request's bearer may use it."""
    return state.authorize_snapshot(snapshot_id, request)


SnapshotDep = Annotated[ServerSnapshot, Depends(snapshot_for)]

router = APIRouter()


@router.post("/v1/sessions/{session_id}/snapshots", status_code=201, response_model=SnapshotInfo)
async def create(session: SessionDep, state: StateDep) -> dict[str, Any]:
    return snapshot_info(state, await take_snapshot(state, session))


@router.get("/v1/snapshots/{snapshot_id}", response_model=SnapshotInfo)
async def get(snapshot: SnapshotDep, state: StateDep) -> dict[str, Any]:
    return snapshot_info(state, snapshot)


@router.delete("/v1/snapshots/{snapshot_id}", response_model=SnapshotInfo)
async def delete(snapshot: SnapshotDep, state: StateDep) -> dict[str, Any]:
    info = snapshot_info(state, snapshot)
    forget(state, snapshot.snapshot_id, "was deleted")
    return info


@router.get("/v1/snapshots")
async def list_saved(request: Request, state: StateDep) -> dict[str, Any]:
    """The snapshots of the lines the bearer holds a token of (every one for the API token), oldest
    first: what the web page's strip shows after a reload, saves from before a restart included."""
    api_token = state.settings.api_token
    everything = api_token is not None and bearer_is(request, api_token)
    lines = state.snapshot_book.lines_of(request)
    if not (everything or lines):
        raise Unauthorized("send 'Authorization: Bearer <a token of a session>' to list its line's snapshots")
    listed = []
    for snapshot in sorted(state.snapshot_book.snapshots.values(), key=lambda s: s.created):
        if everything or snapshot.origin.line in lines:
            with contextlib.suppress(SnapshotGone):
                listed.append(snapshot_info(state, snapshot) | {"line": snapshot.origin.line})
    return {"snapshots": listed}


@router.post("/v1/sessions/{session_id}/restore", response_model=SessionInfo)
async def restore(body: RestoreRequest, session: SessionDep, request: Request, state: StateDep) -> dict[str, Any]:
    snapshot = state.authorize_snapshot(body.snapshot, request)
    state.shelf.require_compatible(snapshot, state.made_with)
    if snapshot.origin.line != session.origin.line:
        raise Forbidden("the snapshot belongs to another line: start a branch from it instead")
    try:
        await session.restore(snapshot)
    except SnapshotGone as gone:
        raise Gone(f"{gone}; take a new one") from None
    return session_info(session)
