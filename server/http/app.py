"""The FastAPI application: `create_app(settings)` composes the app state, the middleware, the error
responses, the routers, the browser client's files and the lifespan.

The engine (stage worker processes) starts in the background when the app starts, then runs two
warm-up chunks; `/readyz` turns ready after that, and session routes answer 503 until then. Nothing
here runs model code or touches a tensor: images are decoded and fitted off the loop, frames arrive
as ready uint8 arrays, and each session's video fan-out converts and encodes them off the loop too.

The routes are module-level routers by resource (server/http/routes/, server/http/routes/watch.py,
server/http/routes/snapshots.py, server/http/routes/whep.py) that reach the state through FastAPI dependencies
(server/http/dependencies.py); the state and what it does is server/state.py.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from server.common.settings import Settings
from server.http.body_limit import BodyLimit
from server.http.dependencies import require_token
from server.http.error_responses import add_error_handlers
from server.http.routes import health, metrics, model, sessions, snapshots, tickets, watch, whep
from server.http.routes.watch import WATCH_TOKEN_HEADER, WATCH_URL_HEADER
from server.media.codecs import set_video_bitrate
from server.peers.ice import use_loopback_candidates, use_udp_port_range
from server.peers.sctp import bound_inbound_messages
from server.state import AppState
from server.waiting_room.usher import Usher

WEB_DIR = Path(__file__).resolve().parents[2] / "web"  # server/http/app.py -> the repository
# In this order: the first route that matches a request serves it.
ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    model.router,
    metrics.router,
    sessions.router,
    tickets.router,
    whep.router,
    watch.router,
    snapshots.router,
)


def create_app(settings: Settings) -> FastAPI:
    state = AppState(settings)
    use_transport_settings(settings, state.fps)
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
    app.state.worldrtc = state  # what the routes' dependencies read (server/http/dependencies.py)
    app.add_middleware(BodyLimit, settings=settings)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["authorization", "content-type"],
            expose_headers=["Location", "Link", WATCH_URL_HEADER, WATCH_TOKEN_HEADER],
        )
    add_error_handlers(app)
    if not public_docs:
        app.add_api_route(
            "/openapi.json",
            openapi,
            methods=["GET"],
            include_in_schema=False,
            dependencies=[Depends(require_token)],
        )
    for router in ROUTERS:
        app.include_router(router)
    if WEB_DIR.is_dir():
        app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
        app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    return app


def use_transport_settings(settings: Settings, fps: int) -> None:
    """What the settings say of the media transport, for the whole process (aiortc's are global):
    the video bitrate, loopback ICE, the SCTP inbound limit and the UDP port range."""
    set_video_bitrate(settings.video_bitrate_bps, fps=fps)
    use_loopback_candidates(settings.is_loopback)
    bound_inbound_messages()
    lo, hi = settings.udp_port_min, settings.udp_port_max
    use_udp_port_range(None if lo is None or hi is None else (lo, hi))  # both or neither (validated)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: AppState = app.state.worldrtc
    state.start()
    # Seats the waiting room (server/waiting_room/usher.py); a turn's world is kept in memory for the next driver.
    usher = Usher(state, lambda session: snapshots.take_snapshot(state, session, to_disk=False))
    usher.start()
    try:
        yield
    finally:
        await usher.stop()
        await state.stop()


async def openapi(request: Request) -> dict[str, Any]:
    """The schema, behind the API token (the server has one)."""
    schema: dict[str, Any] = request.app.openapi()
    return schema


async def index() -> FileResponse:
    return FileResponse(WEB_DIR / "index.html")
