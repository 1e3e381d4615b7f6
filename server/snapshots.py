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
(or the API token) may use it. A token of another line gets 403, no token or an unknown one 401
(server/snapshot_book.py keeps the lines and their tokens).

The engine's catalog (workers/runtime/snapshot_catalog.py) keeps them within
WORLDRTC_SNAPSHOT_BUDGET_GIB of host memory, least recently used evicted first (spilled to
WORLDRTC_SNAPSHOT_SPILL_DIR when it is set). One the memory plan says cannot fit is refused before
any copy (507 `snapshot_too_large`); asking for one that was evicted says so (410 `snapshot_gone`).
"""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from server.dependencies import SessionDep, StateDep
from server.errors import Forbidden, Gone, InsufficientStorage, NotFound
from server.protocol import RestoreRequest, SessionInfo, SnapshotInfo
from server.session import ServerSession
from server.session_info import session_info
from server.snapshot import ServerSnapshot
from server.state import AppState
from workers.runtime.snapshot_catalog import SnapshotGone

SNAPSHOT_WAIT_S = 60.0  # a snapshot waits for its boundary chunk on every stage: a few chunks at most


def snapshot_url(state: AppState, snapshot_id: str) -> str:
    return state.node_url(f"/v1/snapshots/{snapshot_id}")


def snapshot_info(state: AppState, snapshot: ServerSnapshot) -> dict[str, Any]:
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


async def take_snapshot(state: AppState, session: ServerSession) -> ServerSnapshot:
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
    snapshot = await session.snapshot(SNAPSHOT_WAIT_S)
    state.snapshot_book.add(snapshot)
    return snapshot


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
    try:
        state.engine.drop_snapshot(snapshot.snapshot_id)
    except SnapshotGone as gone:
        raise Gone(str(gone)) from None
    finally:
        state.snapshot_book.forget(snapshot.snapshot_id, "was deleted")
    return info


@router.post("/v1/sessions/{session_id}/restore", response_model=SessionInfo)
async def restore(body: RestoreRequest, session: SessionDep, request: Request, state: StateDep) -> dict[str, Any]:
    snapshot = state.authorize_snapshot(body.snapshot, request)
    if snapshot.origin.line != session.origin.line:
        raise Forbidden("the snapshot belongs to another line: start a branch from it instead")
    try:
        await session.restore(snapshot)
    except SnapshotGone as gone:
        raise Gone(f"{gone}; take a new one") from None
    return session_info(session)
