"""The waiting room's REST face (server/waiting_room/line.py keeps the line, server/waiting_room/usher.py seats it).

    POST   /v1/sessions            with every slot taken: 202 TicketInfo, with its ticket_token
    GET    /v1/tickets/{id}        the ticket's token (or the API token): where it stands; once ready,
                                   the session a 201 create returns and the seconds left to offer
    DELETE /v1/tickets/{id}        leave the line (a ready ticket's session is closed, its slot passed on)

A poll is the ticket's sign of life: one not polled for WORLDRTC_TICKET_SILENCE_S is dropped, and
the next poll answers 410 with the reason. While the server drains, polls answer 503 with
Retry-After: the line is not seated any more.
"""

import time
from typing import Any

from fastapi import APIRouter, Request

from server.common.errors import Draining
from server.common.phase import Phase
from server.http.dependencies import StateDep, bearer_is
from server.http.routes.created import created_body
from server.http.routes.watch import watch_url
from server.session.session import ACTIVE, ServerSession, SessionState
from server.state import AppState
from server.waiting_room.line import DropReason, Ticket, TicketState
from server.wire.protocol import EndReason, TicketInfo

router = APIRouter(prefix="/v1/tickets", tags=["waiting room"])


def ticket_body(state: AppState, ticket: Ticket, now: float) -> dict[str, Any]:
    """Where `ticket` stands, as TicketInfo: waiting (place, estimate, the world to watch), ready
    (the session and its connect deadline) or served."""
    room = state.waiting_room
    body: dict[str, Any] = room.describe(ticket) | {
        "state": ticket.state.value,
        "estimated_wait_s": 0.0,
        "poll_url": state.node_url(f"/v1/tickets/{ticket.id}"),
    }
    if ticket.state is TicketState.WAITING:
        body["estimated_wait_s"] = round(room.estimate_s(ticket, held_s(state, now), state.free_slots()), 1)
        target = watch_target(state)
        if target is not None:
            body |= {"watch_url": watch_url(state, target), "watch_token": target.audience.watch_token}
    elif ticket.session_id is not None and (session := state.sessions.get(ticket.session_id)) is not None:
        body["session"] = created_body(state, session)
        if ticket.state is TicketState.READY and ticket.ready_t is not None:
            body["connect_by_s"] = round(max(0.0, ticket.ready_t + room.config.connect_window_s - now), 1)
    return TicketInfo.model_validate(body).model_dump(exclude_none=True)


def held_s(state: AppState, now: float) -> list[float]:
    """How long each taken slot has been held (the estimate counts the rest of a typical turn)."""
    return [now - s.created_t for s in state.sessions.values() if s.state in ACTIVE]


def watch_target(state: AppState) -> ServerSession | None:
    """The world people in line watch (WORLDRTC_QUEUE_WATCH): the longest-streaming session that
    admits spectators."""
    settings = state.settings
    if not settings.queue_watch or settings.max_spectators_per_session == 0:
        return None
    streaming = [s for s in state.sessions.values() if s.state is SessionState.STREAMING and s.audience.watch_token]
    return min(streaming, key=lambda s: s.created_t, default=None)


def ticket_for(ticket_id: str, request: Request, state: AppState) -> Ticket:
    """The ticket, for its own token or the API token; a poll (the ticket's sign of life)."""
    api_token = state.settings.api_token
    by_api = api_token is not None and bearer_is(request, api_token)
    given = request.headers.get("authorization", "").removeprefix("Bearer ")
    return state.waiting_room.open(ticket_id, None if by_api else given, time.monotonic())


@router.get("/{ticket_id}", response_model=TicketInfo, response_model_exclude_none=True)
async def poll(ticket_id: str, request: Request, state: StateDep) -> dict[str, Any]:
    ticket = ticket_for(ticket_id, request, state)
    if state.phase is not Phase.SERVING:
        raise Draining("the server is shutting down and seats nobody more; try another instance", retry_after_s=5)
    return ticket_body(state, ticket, time.monotonic())


@router.delete("/{ticket_id}", response_model=TicketInfo, response_model_exclude_none=True)
async def leave(ticket_id: str, request: Request, state: StateDep) -> dict[str, Any]:
    ticket = ticket_for(ticket_id, request, state)
    now = time.monotonic()
    body = ticket_body(state, ticket, now)
    session = state.sessions.get(ticket.session_id or "")
    was_ready = ticket.state is TicketState.READY
    if ticket.state in (TicketState.WAITING, TicketState.READY):
        state.waiting_room.drop(ticket, DropReason.LEFT, now)
        state.metrics.queue_dropped.labels(DropReason.LEFT.value).inc()
        state.metrics.queue_length.set(len(state.waiting_room))
        if was_ready and session is not None:
            await session.close(EndReason.DELETED, "its ticket left the line")
    return body
