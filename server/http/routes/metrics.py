"""What an operator reads: the engine's workers, counters and slot usage (`/v1/engine`), and the
Prometheus metrics (`/metrics`), both behind the API token."""

import asyncio
from typing import Any

import torch
from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.http.dependencies import StateDep, require_token
from server.session.session import SessionState

router = APIRouter()


@router.get("/v1/engine", dependencies=[Depends(require_token)])
async def engine_status(state: StateDep) -> dict[str, Any]:
    """Workers, counters and slot usage: what an operator checks when something looks stuck."""
    state.require_ready()
    stats = await asyncio.to_thread(state.engine.stats)
    return stats | {
        "stage_busy_idle_s": {
            k: {"busy_s": v["busy_s"], "idle_s": v["idle_s"]} for k, v in state.engine.stage_report().items()
        },
        "event_loop_lag_p99_s": state.lag.p99_s(),
        "event_loop_tasks": len(asyncio.all_tasks()),
        "peer_connections": int(state.metrics.registry.get_sample_value("worldrtc_peer_connections") or 0),
        # 1 when started as a server (server/__main__.py): this process copies frames, the workers compute.
        "server_intra_op_threads": torch.get_num_threads(),
    }


@router.get("/metrics", dependencies=[Depends(require_token)])
async def metrics(state: StateDep) -> Response:
    m = state.metrics
    for s in SessionState:
        m.sessions.labels(s.value).set(sum(x.state is s for x in state.sessions.values()))
    m.worker_restarts.set(state.engine.counters["worker_restarts"])
    m.spectators.set(state.spectator_count())
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
