"""The REST session routes: create and list sessions, read one (its info, its stage timeline), its
recording and its video as generated, end it, and answer its SDP offer.

    POST   /v1/sessions                         the API token; 201 SessionInfo with the session's token,
                                                or 202 with a waiting-room ticket (server/http/routes/tickets.py)
    GET    /v1/sessions                         the API token
    GET    /v1/sessions/{id}[/timeline]         the session's token or the API token, as every route below
    GET    /v1/sessions/{id}/recording          what regenerates it (server/media/recording.py)
    GET    /v1/sessions/{id}/video.mp4          its frames as generated, while it runs
    DELETE /v1/sessions/{id}                    ends it (`deleted`)
    POST   /v1/sessions/{id}/offer              the SDP offer -> answer; streaming starts once connected
"""

import asyncio
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from server.common.errors import Conflict, NotFound
from server.http.dependencies import SessionDep, StateDep, require_token
from server.http.routes.created import created_body
from server.http.routes.tickets import ticket_body
from server.media.growing_file import growing_file_response
from server.session.info import session_info
from server.state import Queued
from server.wire.protocol import AnswerResponse, CreateSessionRequest, EndReason, OfferRequest, SessionInfo, TicketInfo

router = APIRouter()


@router.post(
    "/v1/sessions",
    status_code=201,
    response_model=SessionInfo,
    dependencies=[Depends(require_token)],
    responses={202: {"model": TicketInfo, "description": "every slot is taken: a ticket in the waiting room"}},
)
async def create_session(
    request: Request, state: StateDep, body: CreateSessionRequest | None = None
) -> dict[str, Any] | JSONResponse:
    admitted = await state.admit(body or CreateSessionRequest(), request, may_wait=True)
    if isinstance(admitted, Queued):
        ticket = ticket_body(state, admitted.ticket, time.monotonic()) | {"ticket_token": admitted.token}
        return JSONResponse(ticket, status_code=202, headers={"Location": ticket["poll_url"]})
    return created_body(state, admitted)


@router.get("/v1/sessions", dependencies=[Depends(require_token)])
async def list_sessions(state: StateDep) -> dict[str, Any]:
    return {"sessions": [session_info(s) for s in state.sessions.values()]}


@router.get("/v1/sessions/{session_id}", response_model=SessionInfo)
async def get_session(session: SessionDep) -> dict[str, Any]:
    return session_info(session)


@router.get("/v1/sessions/{session_id}/timeline")
async def get_timeline(
    session: SessionDep,
    window_s: Annotated[float | None, Query(gt=0, le=3600, description="only the last this many seconds")] = None,
) -> dict[str, Any]:
    """The session's recent stage timeline; `python -m benchmarks.timeline URL-or-file` draws it."""
    return session.timeline_report(window_s)


@router.get("/v1/sessions/{session_id}/recording")
async def get_recording(session: SessionDep, state: StateDep) -> Response:
    """What regenerates the session (server/media/recording.py): `python -m benchmarks.replay --recording`."""
    if not state.settings.record:
        raise NotFound("this server keeps no recordings (WORLDRTC_RECORD=false)")
    record = await asyncio.to_thread(session.line.recording_record)  # encodes the start image, off the loop
    if record is None:
        raise Conflict(f"session {session.id} has not started generating; it has nothing recorded yet")
    body = json.dumps(record, separators=(",", ":"))
    disposition = f'attachment; filename="worldrtc-{session.id}.json"'
    return Response(body, media_type="application/json", headers={"Content-Disposition": disposition})


@router.get("/v1/sessions/{session_id}/video.mp4")
async def get_video(session: SessionDep, state: StateDep) -> StreamingResponse:
    """The frames as generated (not as streamed), as an MP4 that plays while the session runs."""
    if not state.settings.record:
        raise NotFound("this server keeps no recordings (WORLDRTC_RECORD=false)")
    path = session.line.video_path()
    if path is None or not path.is_file():
        raise NotFound(f"session {session.id} has no video (not started, or removed to keep the quota)")
    # The recorder may append a fragment while this is sent: serve the file as it is now.
    return growing_file_response(path, "video/mp4", f"worldrtc-{session.id}.mp4")


@router.delete("/v1/sessions/{session_id}", response_model=SessionInfo)
async def delete_session(session: SessionDep) -> dict[str, Any]:
    await session.close(EndReason.DELETED, "deleted")
    return session_info(session)


@router.post("/v1/sessions/{session_id}/offer", response_model=AnswerResponse)
async def offer(body: OfferRequest, session: SessionDep, state: StateDep) -> dict[str, str]:
    return {"sdp": await session.accept_offer(await state.local_offer(body.sdp)), "type": "answer"}
