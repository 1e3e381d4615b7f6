"""WHEP (RFC 9725): any WebRTC player can watch, and steer if it opens a `control` data channel.

    POST   /v1/whep[?scene=&seed=&prompt=&dispatch=&snapshot=]   application/sdp offer
           -> 201 Created, application/sdp answer, Location: /v1/whep/{id}, ICE servers in Link headers
    DELETE /v1/whep/{id}                               ends the session
    PATCH  /v1/whep/{id}                               405: no trickle ICE; send every candidate in the offer

The 201 also carries the session's `Worldrtc-Watch-URL` and `Worldrtc-Watch-Token`: its spectators'
WHEP endpoint and the token that opens it (server/watch.py).

The offer is the whole negotiation: a session is created from the query (the default scene, seed 0,
when it names none; `snapshot=ID` starts a branch from a snapshot, server/snapshots.py), answered,
and starts streaming as soon as ICE connects (or, with a `control` data channel in the offer, once
that channel opens, exactly as REST sessions do). Where the server
has an API token, every request carries it as `Authorization: Bearer <token>`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import ValidationError

from server.errors import BadRequest, MethodNotAllowed, NotFound, UnsupportedMediaType
from server.protocol import CreateSessionRequest, EndReason
from server.turn import ice_servers_for

SDP = "application/sdp"
QUERY_FIELDS = ("scene", "seed", "prompt", "dispatch", "snapshot")


def ice_server_links(ice_servers: list[dict[str, Any]]) -> list[str]:
    """RFC 9725 section 4.6 `Link` values for the configured STUN/TURN servers."""
    links = []
    for server in ice_servers:
        urls = server.get("urls", [])
        for url in [urls] if isinstance(urls, str) else urls:
            link = f'<{url}>; rel="ice-server"'
            if "username" in server and "credential" in server:
                link += f'; username="{server["username"]}"; credential="{server["credential"]}"'
                link += '; credential-type="password"'
            links.append(link)
    return links


async def read_sdp_offer(request: Request) -> str:
    """A WHEP request's body: an SDP offer, as text."""
    if request.headers.get("content-type", "").split(";")[0].strip() != SDP:
        raise UnsupportedMediaType(f"a WHEP offer is an SDP document: send Content-Type: {SDP}")
    try:
        return (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the SDP offer is not UTF-8 text") from None


def whep_router(check_token: Any, session_headers: Callable[[Any], dict[str, str]]) -> APIRouter:
    """The WHEP routes; `check_token` is the app's API-token dependency, `session_headers` what else a
    created session's 201 carries (its watch URL and token)."""
    router = APIRouter(prefix="/v1/whep", tags=["whep"], dependencies=[Depends(check_token)])

    @router.post("", status_code=201, response_class=Response)
    async def offer(request: Request) -> Response:
        state = request.app.state.worldrtc
        sdp = await read_sdp_offer(request)
        query = {k: v for k, v in request.query_params.items() if k in QUERY_FIELDS}
        try:
            body = CreateSessionRequest.model_validate(query)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise BadRequest(f"query parameter {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        session = await state.new_session(body, request)
        answer = await session.accept_offer(await state.local_offer(sdp))
        headers = {"Location": state.node_url(f"/v1/whep/{session.id}")} | session_headers(session)
        response = Response(answer, status_code=201, media_type=SDP, headers=headers)
        settings = state.settings
        for link in ice_server_links(ice_servers_for(settings.ice_servers, settings.turn, session.id)):
            response.headers.append("Link", link)
        return response

    @router.delete("/{session_id}")
    async def end(session_id: str, request: Request) -> Response:
        session = request.app.state.worldrtc.sessions.get(session_id)
        if session is None:
            raise NotFound(f"no WHEP session {session_id!r}")
        await session.close(EndReason.DELETED, "deleted")
        return Response(status_code=200)

    @router.patch("/{session_id}")
    async def trickle(session_id: str) -> Response:
        raise MethodNotAllowed("trickle ICE is not supported: put every candidate in the offer (wait for gathering)")

    return router
