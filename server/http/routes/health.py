"""The probes, open without a token: liveness (`/healthz`), readiness (`/readyz`: the engine is
loaded, warm and serving) and capacity (`/capacityz`: a session could start here now), for an
orchestrator and a load balancer."""

from typing import Any

from fastapi import APIRouter

from server.common.errors import Full
from server.http.dependencies import StateDep
from server.wire.protocol import ErrorBody

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorBody}})
async def readyz(state: StateDep) -> dict[str, Any]:
    state.require_ready()
    return {"ready": True, "load_s": state.ready_s}


@router.get("/capacityz", responses={503: {"model": ErrorBody}})
async def capacityz(state: StateDep) -> dict[str, Any]:
    """For a balancer's health check: 200 while this node can start a session now, 503 (with
    Retry-After) while it is full, loading, restarting or draining."""
    state.require_ready()
    free = state.free_slots()
    if free == 0:
        raise Full(f"all {state.settings.max_sessions} session slots are in use", retry_after_s=5)
    if len(state.waiting_room):  # a slot that just freed is the head ticket's, not a new visitor's
        raise Full(f"{len(state.waiting_room)} people wait for a session slot here", retry_after_s=5)
    return {"free": free, "max_sessions": state.settings.max_sessions}
