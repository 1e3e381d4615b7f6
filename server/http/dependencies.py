"""FastAPI dependencies every router shares: the app's state, and who may call a route.

The routers (server/http/routes/) are module-level and reach the one `AppState` of their app
through `get_state`, which reads what `create_app` put on `app.state.worldrtc`: no route closes over
a local, so a route module needs no app to be written.

    require_token   the API token, when the server has one                          401 without it
    session_for     the session in the path, for its own token or the API token     401 (no oracle), 404
"""

import secrets
from typing import Annotated

from fastapi import Depends, Request

from server.common.errors import NotFound, Unauthorized
from server.session.session import ServerSession
from server.state import AppState


async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.worldrtc
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def require_token(request: Request, state: StateDep) -> None:
    """The API token, when the server has one."""
    token = state.settings.api_token
    if token is not None and not bearer_is(request, token):
        raise Unauthorized("missing or wrong API token: send 'Authorization: Bearer <token>'")


def session_for(session_id: str, request: Request, state: StateDep) -> ServerSession:
    """The session, if the request may act on it (API or session token).
    Without a valid token the answer is 401 whether or not the session exists: no oracle."""
    session = state.sessions.get(session_id)
    if state.settings.api_token is not None:
        own = session is not None and bearer_is(request, session.token)
        if not (own or bearer_is(request, state.settings.api_token)):
            raise Unauthorized("send 'Authorization: Bearer <session token or API token>'")
    if session is None:
        raise NotFound(f"no session {session_id!r}")
    return session


SessionDep = Annotated[ServerSession, Depends(session_for)]


def bearer_is(request: Request, token: str) -> bool:
    """The request carries `Authorization: Bearer <token>` (compared in constant time)."""
    given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
    return secrets.compare_digest(given, f"Bearer {token}".encode())
