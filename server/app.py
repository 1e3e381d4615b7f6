"""The FastAPI application: REST session API, SDP offer/answer, static client, health and metrics.

The engine (stage worker processes) starts in the background when the app starts, then runs one
warm-up chunk; `/readyz` turns ready after that, and session routes answer 503 until then. Nothing
here runs model code or touches a tensor: images are decoded and fitted off the loop, frames arrive
as ready uint8 arrays, and each session's video fan-out converts and encodes them off the loop too.
"""

import asyncio
import base64
import binascii
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.codecs import set_video_bitrate
from server.errors import (
    BadImage,
    BadRequest,
    Busy,
    Conflict,
    Draining,
    Full,
    Loading,
    NotFound,
    RateLimited,
    Restarting,
    ServerError,
    TooLarge,
    Unauthorized,
    UnknownScene,
    http_status,
)
from server.growing_file import growing_file_response
from server.ice import host_addresses, keep_local_candidates, use_loopback_candidates, use_udp_port_range
from server.lifecycle import WORKER_GRACE_S, Phase
from server.memory import MemoryReclaimer, freeze_startup_objects
from server.metrics import LoopLagMonitor, Metrics
from server.protocol import (
    MAX_CONTROL_MESSAGE_BYTES,
    MAX_PROMPT_CHARS,
    AnswerResponse,
    CreateSessionRequest,
    EndReason,
    ErrorBody,
    OfferRequest,
    SessionInfo,
)
from server.rate_limit import PerClientLimiter, client_address
from server.recording_store import RecordingStore
from server.scenes import default_scene, scene_names, scene_path
from server.sctp import bound_inbound_messages
from server.session import ACTIVE, ServerSession, SessionState
from server.settings import Settings
from server.snapshots import SnapshotBook, authorize_snapshot, snapshot_router
from server.turn import ice_servers_for
from server.watch import WATCH_TOKEN_HEADER, WATCH_URL_HEADER, watch_headers, watch_router, watch_url
from server.whep import whep_router
from workers.chunk_geometry import chunk_num_frames
from workers.controls import client_contract
from workers.images import ImageError, fit_image, read_image
from workers.models.weights_digest import weights_digest
from workers.runtime.engine import PipelineEngine
from workers.runtime.memory_plan import check_fits, machine_capacity
from workers.runtime.placement import get_placement
from workers.runtime.snapshot_catalog import SnapshotBudget
from workers.runtime.synthetic import SYNTHETIC, resolve_model

log = logging.getLogger("worldrtc.server")
WEB_DIR = Path(__file__).resolve().parent.parent / "web"
DATA_URL_OVERHEAD = 4 / 3  # base64


class AppState:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.preset, synthetic = resolve_model(settings.model, settings.stage_ms, settings.synthetic_geometry)
        placement = get_placement(settings.placement)
        self.snapshot_plan_bytes = 0  # the smallest snapshot as the memory plan counts it (synthetic: tiny)
        if synthetic is None:
            # The same plan as `python -m workers.models plan`: a placement that cannot hold the model
            # and max_sessions fails now, naming the device, the shortfall and what would fit.
            capacity = machine_capacity(settings.device_memory_gib, settings.host_memory_gib)
            plan = check_fits(self.preset, placement, settings.max_sessions, capacity, settings.kernels)
            for device in plan.devices:
                log.info("memory plan: %s", device.summary())
            # The smallest a snapshot gets (after the condition encoder's fixed point): over the budget,
            # none can fit and it is refused before any copy; a larger early one is refused once measured.
            self.snapshot_plan_bytes = plan.snapshot_steady_bytes
        # Constructing the engine validates the placement against the model: a bad one fails now.
        self.engine = PipelineEngine(
            self.preset,
            placement,
            "pipelined",
            max_sessions=settings.max_sessions,
            checkpoint_dir=settings.checkpoint_dir,
            weights_seed=settings.weights_seed,
            random_weights=settings.random_weights,
            synthetic=synthetic,
            kernels=settings.kernels,
            snapshot_budget=SnapshotBudget(
                memory_bytes=int(settings.snapshot_budget_gib * 2**30),
                spill_dir=settings.snapshot_spill_dir,
                spill_bytes=int(settings.snapshot_spill_gib * 2**30),
            ),
        )
        self.placement = placement
        self.fps = settings.fps or self.preset.fps  # sessions' default frame rate
        self.metrics = Metrics()
        self.lag = LoopLagMonitor(self.metrics)
        self.sessions: dict[str, ServerSession] = {}
        self.snapshot_book = SnapshotBook(lambda: {s.origin.line for s in self.sessions.values()})
        self.tasks: set[asyncio.Task[None]] = set()  # app-owned background tasks, cancelled at shutdown
        self.ready = False
        self.load_error: str | None = None
        self.ready_s: float | None = None
        self.on_ready: Callable[[], None] | None = None
        self.phase = Phase.SERVING
        # Set by the process runner (server/lifecycle.py): stop with this exit status. Without one
        # (an app inside tests) a broken engine only shows in /readyz.
        self.request_exit: Callable[[int], None] | None = None
        self.worker_grace_s = WORKER_GRACE_S

        # Bound to loopback, offers keep only candidates on this host (server/ice.py).
        self.own_addresses = host_addresses() if settings.is_loopback else None
        self.create_limiter = PerClientLimiter(settings.create_rate_per_min / 60, settings.create_burst)
        self._admitting = 0  # creates past the capacity check, still decoding their image
        self.reclaimer = MemoryReclaimer()
        self.recordings = RecordingStore(settings.recordings_dir, int(settings.recordings_quota_mib * 2**20))
        # What recordings name the weights by (server/recording.py); read from the files while loading.
        self.weights_digest = SYNTHETIC if synthetic is not None else ""

    def active_sessions(self) -> int:
        return sum(s.state in ACTIVE for s in self.sessions.values())

    def require_ready(self) -> None:
        """Raise unless new sessions can start now."""
        if self.load_error is not None:
            raise ServerError(f"the engine failed to start: {self.load_error}")
        if self.engine.fatal_error is not None:
            raise ServerError(f"the engine failed: {self.engine.fatal_error}")
        if self.phase is not Phase.SERVING:
            raise Draining("the server is shutting down; connect to another instance", retry_after_s=5)
        if not self.ready:
            raise Loading("the model is loading; retry shortly", retry_after_s=2)
        if not self.engine.healthy:
            raise Restarting("a stage worker is restarting after a failure; retry shortly", retry_after_s=2)

    def node_url(self, path: str) -> str:
        """`path` on this node: absolute with WORLDRTC_PUBLIC_URL (behind a balancer), else as is."""
        return f"{self.settings.public_url or ''}{path}"

    def free_slots(self) -> int:
        return max(0, self.settings.max_sessions - self.active_sessions() - self._admitting)

    def engine_failed(self, error: str) -> None:
        """The engine cannot serve any more (on the loop): every session ends, the process exits 1."""
        log.error("the engine failed: %s", error)
        if self.request_exit is not None:
            self.request_exit(1)

    def check_token(self, request: Request) -> None:
        """FastAPI dependency: the API token, when the server has one."""
        token = self.settings.api_token
        if token is not None and not bearer_is(request, token):
            raise Unauthorized("missing or wrong API token: send 'Authorization: Bearer <token>'")

    def session_for(self, session_id: str, request: Request) -> ServerSession:
        """FastAPI dependency: the session, if the request may act on it (API or session token).
        Without a valid token the answer is 401 whether or not the session exists: no oracle."""
        session = self.sessions.get(session_id)
        if self.settings.api_token is not None:
            own = session is not None and bearer_is(request, session.token)
            if not (own or bearer_is(request, self.settings.api_token)):
                raise Unauthorized("send 'Authorization: Bearer <session token or API token>'")
        if session is None:
            raise NotFound(f"no session {session_id!r}")
        return session

    async def new_session(self, body: CreateSessionRequest, request: Request) -> ServerSession:
        """A session in state `created`, waiting for its offer (REST create, or WHEP); the request's
        address counts against the per-client creation rate, and its bearer must open the snapshot
        of a branch. Every refusal comes before any work."""
        self.require_ready()
        settings = self.settings
        client = client_address(request)
        branch_of = None
        if body.snapshot is not None:
            given = body.model_fields_set - {"snapshot", "fps", "max_duration_s", "dispatch"}
            if given:
                raise BadRequest(
                    f"a branch continues its snapshot's {', '.join(sorted(given))}: send 'snapshot' without them"
                )
            branch_of = authorize_snapshot(self, body.snapshot, request)
        wait_s = self.create_limiter.take(client, time.monotonic())
        if wait_s is not None:
            self.metrics.sessions_refused.labels("rate_limited").inc()
            rate = f"{settings.create_burst} at once, then {settings.create_rate_per_min:g} a minute"
            raise RateLimited(f"too many sessions created from {client} ({rate})", retry_after_s=wait_s)
        if self.free_slots() == 0:
            self.metrics.sessions_refused.labels("busy").inc()
            raise Busy(f"all {settings.max_sessions} session slots are in use; retry later", retry_after_s=5)
        if body.fps is not None and 90_000 % body.fps:
            raise BadRequest(
                f"fps {body.fps} does not divide the 90 kHz video clock; use e.g. 10, 12, 15, 16, 20, 24, 25, 30"
            )
        dit = self.preset.dit
        if body.chunk_frames is not None and dit.local_attn_size_frames != -1:
            room = dit.local_attn_size_frames - dit.sink_size_frames - 1
            if body.chunk_frames > room:
                raise BadRequest(
                    f"chunk_frames {body.chunk_frames} does not fit the attention window; use at most {room}"
                )
        if branch_of is None:
            self._admitting += 1  # holds the slot while the image decodes off the loop
            try:
                scene, image = await asyncio.to_thread(_start_image, body, self)
            finally:
                self._admitting -= 1
        else:
            scene, image = branch_of.origin.scene, branch_of.origin.image
        session = ServerSession(
            self.engine,
            self.preset,
            settings,
            self.metrics,
            image,
            body.prompt,
            body.seed,
            body.max_duration_s,
            fps=body.fps,
            chunk_latent_frames=body.chunk_frames,
            dispatch=body.dispatch,
            scene=scene,
            recordings=self.recordings if settings.record else None,
            weights_digest=self.weights_digest,
            branch_of=branch_of,
        )
        self.sessions[session.id] = session
        self.snapshot_book.joined(session.origin.line, session.token)
        self._forget_when_closed(session)
        return session

    async def local_offer(self, sdp: str) -> str:
        """An offer as the server answers it: on loopback, without candidates off this host."""
        if self.own_addresses is not None:
            sdp = keep_local_candidates(sdp, self.own_addresses)
        return sdp

    def spectator_count(self) -> int:
        return sum(len(s.spectators) for s in self.sessions.values())

    def _forget_when_closed(self, session: ServerSession) -> None:
        # Owned by the app, not the session: the session cancels its own tasks when it closes.
        async def forget() -> None:
            await session.wait_closed()
            self._own(self.reclaimer.session_closed())
            await asyncio.sleep(self.settings.closed_session_keep_s)
            self.sessions.pop(session.id, None)
            self.recordings.remove(session.id)

        self._own(asyncio.get_running_loop().create_task(forget(), name=f"forget-{session.id}"))

    def _own(self, task: asyncio.Task[None] | None) -> None:
        """Keep a background task until it is done (and cancel it at shutdown)."""
        if task is not None:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)


def create_app(settings: Settings) -> FastAPI:
    state = AppState(settings)
    set_video_bitrate(settings.video_bitrate_bps, fps=state.fps)
    use_loopback_candidates(settings.is_loopback)
    bound_inbound_messages()
    lo, hi = settings.udp_port_min, settings.udp_port_max
    use_udp_port_range(None if lo is None or hi is None else (lo, hi))  # both or neither (validated)

    async def load() -> None:
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        state.engine.on_fatal = lambda error: loop.call_soon_threadsafe(state.engine_failed, error)
        try:
            if not state.weights_digest:
                state.weights_digest = await asyncio.to_thread(
                    weights_digest, state.preset, settings.checkpoint_dir, settings.weights_seed
                )
            await asyncio.to_thread(state.engine.start)
            await asyncio.to_thread(state.engine.warm_up)
        except Exception as exc:
            state.load_error = str(exc)
            state.engine_failed(f"it did not start: {state.load_error}")
            return
        freeze_startup_objects()  # before any session: what is alive now lives as long as the process
        state.ready = True
        state.ready_s = time.monotonic() - t0
        if state.on_ready is not None:
            state.on_ready()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.lag.start()
        loader = asyncio.create_task(load(), name="engine-load")
        try:
            yield
        finally:
            bye = "the server is shutting down"
            await asyncio.gather(*(s.close(EndReason.SERVER_SHUTDOWN, bye) for s in state.sessions.values()))
            for task in (loader, *state.tasks):
                task.cancel()
            await asyncio.gather(loader, *state.tasks, return_exceptions=True)
            await asyncio.to_thread(state.engine.shutdown, state.worker_grace_s)
            state.recordings.close()
            await state.lag.stop()

    # With an API token, the schema is served behind it too, and the docs pages (which fetch the
    # schema without a token) are off.
    public_docs = settings.api_token is None
    app = FastAPI(
        title="worldrtc",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url="/openapi.json" if public_docs else None,
        docs_url="/docs" if public_docs else None,
        redoc_url="/redoc" if public_docs else None,
    )
    app.state.worldrtc = state
    app.add_middleware(BodyLimit, settings=settings)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["authorization", "content-type"],
            expose_headers=["Location", "Link", WATCH_URL_HEADER, WATCH_TOKEN_HEADER],
        )

    # ---- errors: one JSON shape everywhere ----

    @app.exception_handler(ServerError)
    async def on_server_error(request: Request, exc: ServerError) -> JSONResponse:
        headers = {"Retry-After": str(int(exc.retry_after_s))} if exc.retry_after_s else None
        body = ErrorBody(error=exc.code, message=exc.message).model_dump()
        return JSONResponse(body, status_code=http_status(exc), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = first.get("loc", ())
        json_error = first.get("type") == "json_invalid"  # its loc ends with a character offset
        where = ".".join(str(p) for p in loc if p != "body" and not json_error) or "body"
        body = ErrorBody(error="bad_request", message=f"{where}: {first.get('msg')}").model_dump()
        return JSONResponse(body, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(ErrorBody(error=code, message=str(exc.detail)).model_dump(), status_code=exc.status_code)

    require_token = state.check_token
    session_for = state.session_for
    require_ready = state.require_ready

    # ---- health, model, metrics ----

    if not public_docs:

        @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_token)])
        async def openapi() -> dict[str, Any]:
            return app.openapi()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"model": ErrorBody}})
    async def readyz() -> dict[str, Any]:
        require_ready()
        return {"ready": True, "load_s": state.ready_s}

    @app.get("/capacityz", responses={503: {"model": ErrorBody}})
    async def capacityz() -> dict[str, Any]:
        """For a balancer's health check: 200 while this node can start a session now, 503 (with
        Retry-After) while it is full, loading, restarting or draining."""
        require_ready()
        free = state.free_slots()
        if free == 0:
            raise Full(f"all {settings.max_sessions} session slots are in use", retry_after_s=5)
        return {"free": free, "max_sessions": settings.max_sessions}

    @app.get("/v1/model", dependencies=[Depends(require_token)])
    async def model() -> dict[str, Any]:
        p = state.preset
        return {
            "model": p.name,
            "family": p.family.value,
            "weights": p.weights_note,
            "width": p.width_px,
            "height": p.height_px,
            "fps": state.fps,
            "chunk_frames": chunk_num_frames(1, p.chunk_latent_frames),
            "placement": state.placement.name,
            "dispatch": settings.dispatch.value,
            "kernels": settings.kernels.record(state.placement.stage_devices("dit")[0]),
            "controls": client_contract(),
            "accepts": p.controls.record(),
            "takes_prompt": p.t5 is not None,  # Matrix-Game conditions on the start image only
            "limits": {
                "control_message_bytes": MAX_CONTROL_MESSAGE_BYTES,
                "control_rate_per_s": settings.control_rate_per_s,
                "abuse_limit": settings.abuse_limit,
                "abuse_window_s": settings.abuse_window_s,
                "create_burst": settings.create_burst,
                "create_rate_per_min": settings.create_rate_per_min,
                "rest_body_max_bytes": settings.rest_body_max_bytes,
                "image_max_bytes": settings.image_max_bytes,
                "image_max_pixels": settings.image_max_pixels,
                "sdp_max_bytes": settings.sdp_max_bytes,
                "max_prompt_chars": MAX_PROMPT_CHARS,
                "idle_timeout_s": settings.idle_timeout_s,
                "peer_timeout_s": settings.peer_timeout_s,
                "max_session_s": settings.session_limit_s,
            },
            "scenes": [{"name": n, "url": f"/v1/scenes/{n}"} for n in scene_names()],
            "ready": state.ready,
        }

    @app.get("/v1/scenes/{name}", dependencies=[Depends(require_token)])
    async def scene(name: str) -> FileResponse:
        path = scene_path(name)
        if path is None:
            raise NotFound(f"no scene {name!r}; see GET /v1/model for the list")
        return FileResponse(path, media_type="image/png")

    @app.get("/v1/ice-servers", dependencies=[Depends(require_token)])
    async def ice_servers(session: str | None = None) -> dict[str, Any]:
        """STUN/TURN servers for a client's RTCPeerConnection; TURN credentials are minted for
        `session` (or for an anonymous viewer) and expire after WORLDRTC_TURN_TTL_S."""
        user = session if session in state.sessions else f"viewer-{secrets.token_hex(4)}"
        return {"ice_servers": ice_servers_for(settings.ice_servers, settings.turn, user)}

    @app.get("/v1/engine", dependencies=[Depends(require_token)])
    async def engine_status() -> dict[str, Any]:
        """Workers, counters and slot usage: what an operator checks when something looks stuck."""
        require_ready()
        stats = await asyncio.to_thread(state.engine.stats)
        return stats | {
            "stage_busy_idle_s": {
                k: {"busy_s": v["busy_s"], "idle_s": v["idle_s"]} for k, v in state.engine.stage_report().items()
            },
            "event_loop_lag_p99_s": state.lag.p99_s(),
            "event_loop_tasks": len(asyncio.all_tasks()),
            "peer_connections": int(state.metrics.registry.get_sample_value("worldrtc_peer_connections") or 0),
        }

    @app.get("/metrics")
    async def metrics(_: None = Depends(require_token)) -> Response:
        m = state.metrics
        for s in SessionState:
            m.sessions.labels(s.value).set(sum(x.state is s for x in state.sessions.values()))
        m.worker_restarts.set(state.engine.counters["worker_restarts"])
        m.spectators.set(state.spectator_count())
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    # ---- sessions ----

    @app.post("/v1/sessions", status_code=201, response_model=SessionInfo, dependencies=[Depends(require_token)])
    async def create_session(request: Request, body: CreateSessionRequest | None = None) -> dict[str, Any]:
        session = await state.new_session(body or CreateSessionRequest(), request)
        url = state.node_url(f"/v1/sessions/{session.id}")
        return session.info() | {
            "token": session.token,
            "ice_servers": ice_servers_for(settings.ice_servers, settings.turn, session.id),
            "session_url": url,
            "offer_url": f"{url}/offer",
            "recording_url": f"{url}/recording",
            "video_url": f"{url}/video.mp4",
            "watch_url": watch_url(state, session),
            "watch_token": session.watch_token,
            "snapshots_url": f"{url}/snapshots",
        }

    @app.get("/v1/sessions", dependencies=[Depends(require_token)])
    async def list_sessions() -> dict[str, Any]:
        return {"sessions": [s.info() for s in state.sessions.values()]}

    @app.get("/v1/sessions/{session_id}", response_model=SessionInfo)
    async def get_session(session: Annotated[ServerSession, Depends(session_for)]) -> dict[str, Any]:
        return session.info()

    @app.get("/v1/sessions/{session_id}/timeline")
    async def get_timeline(
        session: Annotated[ServerSession, Depends(session_for)],
        window_s: Annotated[float | None, Query(gt=0, le=3600, description="only the last this many seconds")] = None,
    ) -> dict[str, Any]:
        """The session's recent stage timeline; `python -m benchmarks.timeline URL-or-file` draws it."""
        return session.timeline_report(window_s)

    @app.get("/v1/sessions/{session_id}/recording")
    async def get_recording(session: Annotated[ServerSession, Depends(session_for)]) -> Response:
        """What regenerates the session (server/recording.py): `python -m benchmarks.replay --recording`."""
        if not settings.record:
            raise NotFound("this server keeps no recordings (WORLDRTC_RECORD=false)")
        record = await asyncio.to_thread(session.recording_record)  # encodes the start image, off the loop
        if record is None:
            raise Conflict(f"session {session.id} has not started generating; it has nothing recorded yet")
        body = json.dumps(record, separators=(",", ":"))
        disposition = f'attachment; filename="worldrtc-{session.id}.json"'
        return Response(body, media_type="application/json", headers={"Content-Disposition": disposition})

    @app.get("/v1/sessions/{session_id}/video.mp4")
    async def get_video(session: Annotated[ServerSession, Depends(session_for)]) -> StreamingResponse:
        """The frames as generated (not as streamed), as an MP4 that plays while the session runs."""
        if not settings.record:
            raise NotFound("this server keeps no recordings (WORLDRTC_RECORD=false)")
        path = session.video_path()
        if path is None or not path.is_file():
            raise NotFound(f"session {session.id} has no video (not started, or removed to keep the quota)")
        # The recorder may append a fragment while this is sent: serve the file as it is now.
        return growing_file_response(path, "video/mp4", f"worldrtc-{session.id}.mp4")

    @app.delete("/v1/sessions/{session_id}", response_model=SessionInfo)
    async def delete_session(session: Annotated[ServerSession, Depends(session_for)]) -> dict[str, Any]:
        await session.close(EndReason.DELETED, "deleted")
        return session.info()

    @app.post("/v1/sessions/{session_id}/offer", response_model=AnswerResponse)
    async def offer(body: OfferRequest, session: Annotated[ServerSession, Depends(session_for)]) -> dict[str, str]:
        return {"sdp": await session.accept_offer(await state.local_offer(body.sdp)), "type": "answer"}

    app.include_router(whep_router(state.check_token, lambda session: watch_headers(state, session)))
    app.include_router(watch_router(state))
    app.include_router(snapshot_router(state))

    # ---- the browser client ----

    if WEB_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")

        @app.get("/", include_in_schema=False)
        async def index() -> FileResponse:
            return FileResponse(WEB_DIR / "index.html")

    return app


def bearer_is(request: Request, token: str) -> bool:
    """The request carries `Authorization: Bearer <token>` (compared in constant time)."""
    given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
    return secrets.compare_digest(given, f"Bearer {token}".encode())


def _start_image(body: CreateSessionRequest, state: AppState) -> tuple[str | None, np.ndarray]:
    """(scene name or None, HxWx3 uint8 at the model's resolution) from a scene name, a data URL, or
    neither: the default scene. Runs in a worker thread."""
    p = state.preset
    if body.scene is not None and body.image is not None:
        raise BadRequest("give 'scene' (a built-in scene name) or 'image' (a data URL), not both")
    scene = body.scene if body.scene is not None or body.image is not None else default_scene()
    if scene is not None:
        path = scene_path(scene)
        if path is None:
            raise UnknownScene(f"there is no built-in scene {scene!r}; choose one of {', '.join(scene_names())}")
        source: Path | bytes = path
    else:
        assert body.image is not None
        header, _, payload = body.image.partition(",")
        if not header.startswith("data:image/") or ";base64" not in header:
            raise BadImage("'image' must be a data URL: data:image/png;base64,... or data:image/jpeg;base64,...")
        if len(payload) > state.settings.image_max_bytes * DATA_URL_OVERHEAD + 4:
            raise TooLarge(f"images are limited to {state.settings.image_max_bytes // (1024 * 1024)} MiB")
        try:
            source = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise BadImage("'image' is not valid base64") from None
    try:
        return scene, fit_image(read_image(source, state.settings.image_max_pixels), p.height_px, p.width_px)
    except ImageError as exc:
        raise BadImage(f"the start image cannot be used: {exc}") from None


class BodyLimit:
    """Pure ASGI middleware: refuse request bodies over the route's limit before reading them whole."""

    def __init__(self, app: Callable[..., Awaitable[None]], settings: Settings) -> None:
        self.app = app
        self.settings = settings

    def _limit(self, path: str) -> int:
        s = self.settings
        if path.endswith("/offer") or path.rstrip("/") == "/v1/whep":
            return s.sdp_max_bytes + 1024
        if path.rstrip("/") == "/v1/sessions":
            return int(s.image_max_bytes * DATA_URL_OVERHEAD) + s.rest_body_max_bytes
        return s.rest_body_max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope["path"])
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._refuse(send, limit)
            return
        seen = 0
        exceeded = started = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen, exceeded
            if exceeded:
                raise _TooLargeBody()
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _TooLargeBody()
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            # The app may turn the cut-off into an error of its own (FastAPI: 400, "error parsing
            # the body"); the client gets the 413 instead.
            nonlocal started
            if exceeded:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        with suppress(_TooLargeBody):
            await self.app(scope, limited_receive, guarded_send)
        if exceeded and not started:
            await self._refuse(send, limit)

    @staticmethod
    async def _refuse(send: Callable[..., Any], limit: int) -> None:
        body = ErrorBody(error="too_large", message=f"request body over the {limit}-byte limit for this route")
        payload = body.model_dump_json().encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class _TooLargeBody(Exception):
    pass
