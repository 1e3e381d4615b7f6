"""The waiting room: tickets for a session slot, in arrival order, and how long each will wait.

When every slot is taken, a REST create may wait here instead of being refused (server/waiting_room/usher.py
seats the tickets; server/http/routes/tickets.py is their REST face):

    waiting ──a slot frees, this ticket at the head──▶ ready ──its holder offers──▶ served
       │                                                 │
       │                                                 └── no offer within connect_window_s ──▶ dropped (no_show)
       └── not polled for silence_s (silent) / DELETE (left) / the server stops (server_shutdown) ──▶ dropped

A ticket is a capability like a session: its token is shown once, in the 202, and kept here only
as a SHA-256 hash. A dropped ticket stays known for `GONE_KEEP_S`, so that its holder's next poll
learns why (410 with the reason) rather than a bare 404.

The estimate of a ticket's wait comes from measured turns (`TurnLengths`): how long sessions held
their slot, and how long the current ones have held theirs. Clocks are passed in (monotonic
seconds), so the tests drive them without sleeping.
"""

from __future__ import annotations

import hashlib
import secrets
import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from server.common.errors import NotFound, QueueFull, RateLimited, TicketGone, Unauthorized
from server.common.rate_limit import TokenBucket

if TYPE_CHECKING:
    from server.waiting_room.admission import Admission

GONE_KEEP_S = 300.0  # a dropped ticket's reason is told for this long, then it is forgotten
# Before any turn has ended, a turn is guessed at this long (or at max_turn_s when turns are on).
PRIOR_TURN_S = 120.0


@dataclass(frozen=True)
class QueueConfig:
    max_waiting: int  # tickets waiting at once; one more gets 429 queue_full
    per_client: int  # tickets one client address may hold at once
    silence_s: float  # a waiting ticket not polled for this long is dropped
    connect_window_s: float  # a ready ticket's holder must offer within this
    poll_rate_per_s: float = 2.0  # polls per ticket; faster ones get 429 with Retry-After
    poll_burst: int = 5
    max_turn_s: float | None = None  # the operator's cap on a turn while someone waits


class TicketState(StrEnum):
    WAITING = "waiting"
    READY = "ready"
    SERVED = "served"
    DROPPED = "dropped"


class DropReason(StrEnum):
    """Why a ticket was dropped: the 410's message, and `worldrtc_queue_dropped_total{reason}`."""

    SILENT = "silent"  # not polled for silence_s
    LEFT = "left"  # its holder left the line (DELETE)
    NO_SHOW = "no_show"  # ready, and no offer within the connect window
    SERVER_SHUTDOWN = "server_shutdown"  # the server stopped while it waited
    FAILED = "failed"  # its session could not be created (the 410's message says why)


DROP_MESSAGES = {
    DropReason.SILENT: "the ticket was not polled for {silence_s:g} s and gave up its place",
    DropReason.LEFT: "the ticket left the line",
    DropReason.NO_SHOW: "the ticket's session got no offer within {connect_window_s:g} s and passed the slot on",
    DropReason.SERVER_SHUTDOWN: "the server stopped",
    DropReason.FAILED: "its session could not start",
}


@dataclass
class Ticket:
    id: str
    token_sha256: bytes
    client: str
    admission: Admission  # what its session starts from, checked and decoded at the create
    joined_t: float
    last_poll_t: float
    poll_bucket: TokenBucket
    state: TicketState = TicketState.WAITING
    ready_t: float | None = None
    session_id: str | None = None  # once ready: the session created for it
    requeued: bool = False  # a failed connect goes back to the head once
    dropped: DropReason | None = None
    dropped_t: float | None = None
    detail: str = ""  # what the 410 adds (a failed create's reason)

    def opens_with(self, token: str) -> bool:
        return secrets.compare_digest(self.token_sha256, _sha256(token))


@dataclass
class TurnLengths:
    """How long sessions hold a slot: the last `keep` finished turns, and a prior until there are any."""

    prior_s: float
    keep: int = 20
    ended_s: deque[float] = field(default_factory=deque)

    def ended(self, held_s: float) -> None:
        self.ended_s.append(held_s)
        while len(self.ended_s) > self.keep:
            self.ended_s.popleft()

    @property
    def typical_s(self) -> float:
        return statistics.median(self.ended_s) if self.ended_s else self.prior_s


def estimate_wait_s(position: int, held_s: list[float], free_slots: int, turn_s: float) -> float:
    """Seconds until the ticket at `position` (1: the head) gets a slot: the slots free in order of
    how long each has left of a typical turn (`turn_s`), and each next round of the line takes one
    more turn. `held_s`: how long each taken slot has been held."""
    if position <= free_slots:
        return 0.0
    slots = max(1, len(held_s) + free_slots)
    frees_in = sorted([0.0] * free_slots + [max(0.0, turn_s - h) for h in held_s])
    behind = position - 1
    return frees_in[behind % slots] + (behind // slots) * turn_s


class WaitingRoom:
    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self._line: deque[Ticket] = deque()  # waiting, in order (a requeued one at the head)
        self._tickets: OrderedDict[str, Ticket] = OrderedDict()  # every known ticket by id
        self.turns = TurnLengths(prior_s=config.max_turn_s or PRIOR_TURN_S)

    # ---- what it tells ----

    def __len__(self) -> int:
        """Tickets waiting now."""
        return len(self._line)

    def position(self, ticket: Ticket) -> int:
        """1 for the head; 0 when the ticket is not waiting."""
        for i, t in enumerate(self._line):
            if t is ticket:
                return i + 1
        return 0

    def head(self) -> Ticket | None:
        return self._line[0] if self._line else None

    def waiting(self) -> list[Ticket]:
        return list(self._line)

    def ready(self) -> list[Ticket]:
        return [t for t in self._tickets.values() if t.state is TicketState.READY]

    def estimate_s(self, ticket: Ticket, held_s: list[float], free_slots: int) -> float:
        return estimate_wait_s(self.position(ticket), held_s, free_slots, self.turns.typical_s)

    # ---- transitions ----

    def join(self, admission: Admission, client: str, now: float) -> tuple[Ticket, str]:
        """A new ticket at the back of the line, and its token (shown once)."""
        self._forget_old(now)
        if len(self._line) >= self.config.max_waiting:
            raise QueueFull(
                f"all session slots are in use and {len(self._line)} people are waiting (the most this server "
                "lets wait); retry later",
                retry_after_s=30,
            )
        held = sum(
            t.client == client and t.state in (TicketState.WAITING, TicketState.READY) for t in self._tickets.values()
        )
        if held >= self.config.per_client:
            raise QueueFull(
                f"{client} already holds {held} tickets in the waiting room (at most {self.config.per_client})",
                retry_after_s=30,
            )
        token = secrets.token_urlsafe(24)
        bucket = TokenBucket.full(self.config.poll_rate_per_s, self.config.poll_burst, now)
        ticket = Ticket(secrets.token_hex(8), _sha256(token), client, admission, now, now, bucket)
        self._tickets[ticket.id] = ticket
        self._line.append(ticket)
        return ticket, token

    def open(self, ticket_id: str, token: str | None, now: float) -> Ticket:
        """The ticket, for its own token (or the server's API token: `token` None), as a poll: it
        counts as a sign of life, within the poll rate. 401 for any other token, known ticket or not
        (no oracle); 410 with the reason for a dropped one."""
        ticket = self._tickets.get(ticket_id)
        if token is not None and (ticket is None or not ticket.opens_with(token)):
            raise Unauthorized("send 'Authorization: Bearer <ticket token>' (from the 202 that made the ticket)")
        if ticket is None:
            raise NotFound(f"no ticket {ticket_id!r} (dropped more than {GONE_KEEP_S:g} s ago, or never made)")
        if ticket.dropped is not None:
            message = DROP_MESSAGES[ticket.dropped].format(**vars(self.config))
            raise TicketGone(f"{message}{': ' + ticket.detail if ticket.detail else ''}; create a new session")
        if not ticket.poll_bucket.take(now):
            raise RateLimited(
                f"poll at most {self.config.poll_rate_per_s:g} times a second",
                retry_after_s=max(1.0, ticket.poll_bucket.wait_s(now)),
            )
        ticket.last_poll_t = now
        return ticket

    def seat(self, ticket: Ticket, session_id: str, now: float) -> None:
        """The head ticket has a session: its holder may offer within the connect window."""
        self._line.remove(ticket)
        ticket.state, ticket.session_id, ticket.ready_t = TicketState.READY, session_id, now

    def served(self, ticket: Ticket) -> None:
        ticket.state = TicketState.SERVED

    def requeue(self, ticket: Ticket) -> bool:
        """A ready ticket whose connect failed goes back to the head, once; False the second time."""
        if ticket.requeued:
            return False
        ticket.requeued = True
        ticket.state, ticket.session_id, ticket.ready_t = TicketState.WAITING, None, None
        self._line.appendleft(ticket)
        return True

    def drop(self, ticket: Ticket, reason: DropReason, now: float, detail: str = "") -> None:
        if ticket in self._line:
            self._line.remove(ticket)
        ticket.state, ticket.dropped, ticket.dropped_t, ticket.detail = TicketState.DROPPED, reason, now, detail

    def silent(self, now: float) -> list[Ticket]:
        """Waiting tickets not polled for silence_s."""
        return [t for t in self._line if now - t.last_poll_t > self.config.silence_s]

    def _forget_old(self, now: float) -> None:
        for tid in [
            tid
            for tid, t in self._tickets.items()
            if (t.dropped_t is not None and now - t.dropped_t > GONE_KEEP_S)
            or (t.state is TicketState.SERVED and t.ready_t is not None and now - t.ready_t > GONE_KEEP_S)
        ]:
            del self._tickets[tid]

    def describe(self, ticket: Ticket) -> dict[str, Any]:
        return {"ticket_id": ticket.id, "position": self.position(ticket), "waiting": len(self._line)}


def _sha256(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
