"""Spectators: a WHEP endpoint (RFC 9725) per session, opened by the session's watch token.

    POST   /v1/sessions/{id}/watch                 application/sdp offer, Authorization: Bearer <watch token>
           -> 201 Created, application/sdp answer, Location: /v1/sessions/{id}/watch/{spectator}
    DELETE /v1/sessions/{id}/watch/{spectator}     ends that watch (the same token)
    PATCH  /v1/sessions/{id}/watch/{spectator}     405: no trickle ICE
    POST   /v1/sessions/{id}/watch-token           the driver: revoke the current watch token (its
                                                   spectators end, `done` revoked) and get a new one
    DELETE /v1/sessions/{id}/watch-token           the driver: revoke it, and issue none

The watch token comes with the session's create response (`watch_url`, `watch_token`; for a WHEP
driver, in the `Worldrtc-Watch-URL` and `Worldrtc-Watch-Token` headers). It is a capability: it lets
its holder watch that one session and nothing else, and it is never the driver's token. The API
token, where the server has one, also watches (an operator). Refused requests to watch are
counted in `worldrtc_watch_refused_total{reason}` (a spectator's DELETE, a leave, is not):

    missing        no bearer token                                  401
    wrong          a token that is nobody's                         401
    driver_token   the session's driver token                      403
    other_session  another session's watch token                   403
    revoked        a watch token the driver revoked                 403
    ended          the session has ended                            409
    full           max_spectators_per_session watch it already      429
    node_full      max_spectators watch this node already           429
"""

import secrets
from typing import Any

from fastapi import APIRouter, Request, Response

from server.common.errors import Busy, Forbidden, MethodNotAllowed, NotFound, SessionClosed, Unauthorized
from server.common.turn_credentials import ice_servers_for
from server.http.dependencies import SessionDep, StateDep
from server.peers.whep_http import SDP, ice_server_links, read_sdp_offer
from server.session.session import ACTIVE, ServerSession
from server.state import AppState
from server.wire.protocol import EndReason

WATCH_URL_HEADER = "Worldrtc-Watch-URL"
WATCH_TOKEN_HEADER = "Worldrtc-Watch-Token"


def watch_url(state: AppState, session: ServerSession) -> str:
    return state.node_url(f"/v1/sessions/{session.id}/watch")


def watch_headers(state: AppState, session: ServerSession) -> dict[str, str]:
    """For a WHEP driver's 201: where and how others watch its session."""
    assert session.audience.watch_token is not None
    return {WATCH_URL_HEADER: watch_url(state, session), WATCH_TOKEN_HEADER: session.audience.watch_token}


def _same(given: str, token: str | None) -> bool:
    return token is not None and secrets.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode())


def authorize_watch(
    state: AppState, session_id: str, request: Request, *, joining: bool = True
) -> tuple[ServerSession, str]:
    """The session and the token that may watch it, or a refusal (see the module docstring).
    Without a token that is good for something, the answer is 401 whether or not the session exists.
    Only requests to join (`joining`) are counted and need the session to be live: a spectator's
    DELETE after its session ended is a leave, not an attempt to watch."""

    def refuse(reason: str, error: Exception) -> Exception:
        if joining:
            state.metrics.watch_refused.labels(reason).inc()
        return error

    header = request.headers.get("authorization", "")
    if not header.startswith("Bearer ") or not header[7:]:
        raise refuse("missing", Unauthorized("watching takes 'Authorization: Bearer <watch token>'"))
    token = header[7:]
    session = state.sessions.get(session_id)
    if session is not None:
        if _same(token, session.audience.watch_token) or _same(token, state.settings.api_token):
            if joining and session.state not in ACTIVE:
                raise refuse("ended", SessionClosed(f"session {session.id} has ended: there is nothing to watch"))
            return session, token
        if _same(token, session.token):
            why = "that is the session's driver token; watching takes its watch token (watch_token)"
            raise refuse("driver_token", Forbidden(why))
        if any(_same(token, old) for old in session.audience.revoked_watch_tokens):
            raise refuse("revoked", Forbidden("the driver revoked this watch token; ask for a new link"))
    if any(_same(token, s.audience.watch_token) for s in state.sessions.values() if s is not session):
        raise refuse("other_session", Forbidden("this watch token is for another session"))
    raise refuse("wrong", Unauthorized("wrong watch token"))


router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["watch"])


@router.post("/watch", status_code=201, response_class=Response)
async def watch(session_id: str, request: Request, state: StateDep) -> Response:
    settings = state.settings
    authorize_watch(state, session_id, request)
    sdp = await read_sdp_offer(request)
    # Checked again after the body: the session may have ended while it arrived, and the node's
    # count must be read with no wait before the spectator joins the session's table.
    session, token = authorize_watch(state, session_id, request)
    if state.spectator_count() >= settings.max_spectators:
        state.metrics.watch_refused.labels("node_full").inc()
        raise Busy(f"this node has {settings.max_spectators} spectators, the most it takes", retry_after_s=5)
    spectator, answer = await session.add_spectator(await state.local_offer(sdp), token)
    location = state.node_url(f"/v1/sessions/{session.id}/watch/{spectator.id}")
    response = Response(answer, status_code=201, media_type=SDP, headers={"Location": location})
    for link in ice_server_links(ice_servers_for(settings.ice_servers, settings.turn, f"watch-{spectator.id}")):
        response.headers.append("Link", link)
    return response


@router.delete("/watch/{spectator_id}")
async def stop_watching(session_id: str, spectator_id: str, request: Request, state: StateDep) -> Response:
    session, _ = authorize_watch(state, session_id, request, joining=False)
    spectator = session.audience.spectators.get(spectator_id)
    if spectator is None:
        raise NotFound(f"no spectator {spectator_id!r} watching session {session_id!r}")
    await spectator.close(EndReason.DELETED, "deleted")
    return Response(status_code=200)


@router.patch("/watch/{spectator_id}")
async def trickle(session_id: str, spectator_id: str, request: Request, state: StateDep) -> Response:
    authorize_watch(state, session_id, request, joining=False)
    raise MethodNotAllowed("trickle ICE is not supported: put every candidate in the offer (wait for gathering)")


@router.post("/watch-token")
async def new_watch_token(session: SessionDep, state: StateDep) -> dict[str, Any]:
    """Revoke the current watch token (its spectators end) and issue another."""
    token = await session.new_watch_token()
    return {"watch_url": watch_url(state, session), "watch_token": token}


@router.delete("/watch-token")
async def revoke_watch_token(session: SessionDep) -> dict[str, Any]:
    """Revoke the watch token: its spectators end, and nobody watches until a new one is issued."""
    return {"spectators_ended": await session.audience.revoke()}
