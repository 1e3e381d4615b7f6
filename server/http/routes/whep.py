"""WHEP (RFC 9725): any WebRTC player can watch, and steer if it opens a `control` data channel.

    POST   /v1/whep[?scene=&seed=&prompt=&dispatch=&snapshot=]   application/sdp offer
           -> 201 Created, application/sdp answer, Location: /v1/whep/{id}, ICE servers in Link headers
    DELETE /v1/whep/{id}                               ends the session
    PATCH  /v1/whep/{id}                               405: no trickle ICE; send every candidate in the offer

The 201 also carries the session's `Worldrtc-Watch-URL` and `Worldrtc-Watch-Token`: its spectators'
WHEP endpoint and the token that opens it (server/http/routes/watch.py).

The offer is the whole negotiation: a session is created from the query (the default scene, seed 0,
when it names none; `snapshot=ID` starts a branch from a snapshot, server/http/routes/snapshots.py), answered,
and starts streaming as soon as ICE connects (or, with a `control` data channel in the offer, once
that channel opens, exactly as REST sessions do). Where the server
has an API token, every request carries it as `Authorization: Bearer <token>`.
"""

from fastapi import APIRouter, Depends, Request, Response
from pydantic import ValidationError

from server.common.errors import BadRequest, MethodNotAllowed, NotFound
from server.common.turn_credentials import ice_servers_for
from server.http.dependencies import StateDep, require_token
from server.http.routes.watch import watch_headers
from server.peers.whep_http import SDP, ice_server_links, read_sdp_offer
from server.wire.protocol import CreateSessionRequest, EndReason

QUERY_FIELDS = ("scene", "seed", "prompt", "dispatch", "snapshot")

router = APIRouter(prefix="/v1/whep", tags=["whep"], dependencies=[Depends(require_token)])


@router.post("", status_code=201, response_class=Response)
async def offer(request: Request, state: StateDep) -> Response:
    sdp = await read_sdp_offer(request)
    query = {k: v for k, v in request.query_params.items() if k in QUERY_FIELDS}
    try:
        body = CreateSessionRequest.model_validate(query)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadRequest(f"query parameter {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    session = await state.new_session(body, request)
    answer = await session.accept_offer(await state.local_offer(sdp))
    # The 201 also says where and how others watch the session (server/http/routes/watch.py).
    headers = {"Location": state.node_url(f"/v1/whep/{session.id}")} | watch_headers(state, session)
    response = Response(answer, status_code=201, media_type=SDP, headers=headers)
    settings = state.settings
    for link in ice_server_links(ice_servers_for(settings.ice_servers, settings.turn, session.id)):
        response.headers.append("Link", link)
    return response


@router.delete("/{session_id}")
async def end(session_id: str, state: StateDep) -> Response:
    session = state.sessions.get(session_id)
    if session is None:
        raise NotFound(f"no WHEP session {session_id!r}")
    await session.close(EndReason.DELETED, "deleted")
    return Response(status_code=200)


@router.patch("/{session_id}")
async def trickle(session_id: str) -> Response:
    raise MethodNotAllowed("trickle ICE is not supported: put every candidate in the offer (wait for gathering)")
