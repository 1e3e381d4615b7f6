"""The usher: seats the waiting room's tickets as slots free, and ends turns for the people waiting.

One task per app, woken by the app state's doorbell (a slot freed, a ticket joined) or every
`TICK_S`. Each round, in this order:

1. tickets not polled for ticket_silence_s are dropped (`silent`);
2. seated tickets are followed: a session that streams serves its ticket; one that got no offer
   within the connect window drops it (`no_show`, its slot passes on); one whose connect failed
   puts its ticket back at the head, once;
3. turns (max_turn_s): while someone waits, the longest-held sessions past their turn are told
   `turn_ending` turn_warning_s ahead, then end with `turn_over` when announced. With nobody
   waiting, turns go on. In the `continue` hand-over the world is saved first (a snapshot at the
   next chunk boundary, asked for two chunks ahead of the turn's end so that the end comes on time)
   and the next ticket's session branches from it: the same world, a new driver. A turn's end runs
   as a task of its own: the rounds go on while its snapshot is taken;
4. free slots go to the head of the line, each as a session whose offer deadline is the
   connect window.

The usher never waits on a person: every wait is a deadline checked on the next round. It reads
and calls only what `SeatingServer` names of the app's state, and is handed how a turn's world is
saved, so the waiting room does not import the state that holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from server.common.errors import ServerError
from server.common.metrics import Metrics
from server.common.phase import Phase
from server.common.settings import Settings, TurnHandover
from server.session.session import ServerSession, SessionState
from server.snapshots.snapshot import ServerSnapshot
from server.waiting_room.admission import Admission
from server.waiting_room.line import DropReason, Ticket, WaitingRoom
from server.wire.protocol import EndReason
from workers.chunk_geometry import video_frames
from workers.runtime.engine import PipelineEngine
from workers.runtime.snapshot_catalog import SnapshotGone

log = logging.getLogger("worldrtc.usher")

TICK_S = 0.25  # the longest a deadline waits past its time
SNAPSHOT_LEAD_CHUNKS = 2  # a snapshot waits for the next chunk boundary: at most this many chunks
# A connect that fails before the first frame (not a no-show, not the holder's own stop) sends the
# ticket back to the head once.
CONNECT_FAILURES = frozenset(
    {EndReason.ICE_TIMEOUT, EndReason.BAD_OFFER, EndReason.PEER_GONE, EndReason.CONNECTION_CLOSED}
)


class SeatingServer(Protocol):
    """What the usher reads and calls of the app's state (server/state.py's AppState)."""

    settings: Settings
    metrics: Metrics
    sessions: dict[str, ServerSession]
    waiting_room: WaitingRoom
    doorbell: asyncio.Event  # rung when a slot frees or a ticket joins
    phase: Phase
    ready: bool
    engine: PipelineEngine

    def free_slots(self) -> int: ...

    def open_session(self, admission: Admission, offer_timeout_s: float | None = None) -> ServerSession: ...


# A turn's world saved for the next driver (in memory only): a snapshot at the session's next chunk
# boundary, or what the client would be told why not.
SaveWorld = Callable[[ServerSession], Awaitable[ServerSnapshot]]


class Usher:
    def __init__(self, state: SeatingServer, save_world: SaveWorld) -> None:
        self.state = state
        self.save_world = save_world
        self.room = state.waiting_room
        self._ends_at: dict[str, float] = {}  # session id -> when its announced turn ends (monotonic)
        self._ending: dict[str, asyncio.Task[None]] = {}  # session id -> its turn's end under way
        # `continue`: the worlds of ended turns, each for the next ticket seated (oldest first).
        self._handovers: deque[ServerSnapshot] = deque()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="usher")

    async def stop(self) -> None:
        """At shutdown: no more seating; every ticket still in line or seated is told the server stopped."""
        tasks = [t for t in (self._task, *self._ending.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        now = time.monotonic()
        for ticket in [*self.room.waiting(), *self.room.ready()]:
            self._drop(ticket, DropReason.SERVER_SHUTDOWN, now)

    async def _run(self) -> None:
        bell = self.state.doorbell
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(bell.wait(), TICK_S)
            bell.clear()
            try:
                await self.round(time.monotonic())
            except Exception:  # a bug here must not stop the line: log it, go on next round
                log.exception("the usher's round failed")

    async def round(self, now: float) -> None:
        for ticket in self.room.silent(now):
            self._drop(ticket, DropReason.SILENT, now)
        self._follow_seated(now)
        await self._turns(now)
        self._seat(time.monotonic())
        self.state.metrics.queue_length.set(len(self.room))

    def _follow_seated(self, now: float) -> None:
        for ticket in self.room.ready():
            session = self.state.sessions.get(ticket.session_id or "")
            if session is None:
                self._drop(ticket, DropReason.FAILED, now, "its session is gone")
            elif session.first_frame_s is not None:
                self.room.served(ticket)
            elif session.state in (SessionState.CLOSED, SessionState.FAILED):
                if session.ended is EndReason.NO_OFFER:
                    self._drop(ticket, DropReason.NO_SHOW, now)
                elif session.ended in CONNECT_FAILURES and self.room.requeue(ticket):
                    log.info(
                        "ticket %s: its connect failed (%s); back at the head of the line", ticket.id, session.ended
                    )
                else:
                    self._drop(ticket, DropReason.FAILED, now, session.error or str(session.ended))

    async def _turns(self, now: float) -> None:
        settings = self.state.settings
        if settings.max_turn_s is None:
            return
        waiting = len(self.room)
        driving = sorted(
            (s for s in self.state.sessions.values() if s.state is SessionState.STREAMING), key=lambda s: s.created_t
        )
        # As many turns end as people wait, the longest-held first; the others (and every turn while
        # nobody waits) go on, their announcement forgotten.
        due, going_on = driving[:waiting], driving[waiting:]
        for session in going_on:
            if session.id not in self._ending:
                self._ends_at.pop(session.id, None)
        for session in due:
            if session.id in self._ending:
                continue
            ends_at = self._ends_at.get(session.id)
            if ends_at is None:
                turn_end = session.created_t + settings.max_turn_s
                if now >= turn_end - settings.turn_warning_s:
                    # Never less notice than the hand-over needs (a warning shorter than two chunks).
                    notice_s = max(settings.turn_warning_s, self._lead_s(session))
                    ends_at = self._ends_at[session.id] = max(turn_end, now + notice_s)
                    session.turn_ending(ends_at - now)
            elif now >= ends_at - self._lead_s(session):
                self._ending[session.id] = asyncio.get_running_loop().create_task(
                    self._end_turn(session, ends_at), name=f"usher-end-turn-{session.id}"
                )

    def _lead_s(self, session: ServerSession) -> float:
        """How long before its announced end a turn's hand-over starts: in `continue`, the snapshot
        waits for the next chunk boundary (up to SNAPSHOT_LEAD_CHUNKS chunks ahead), so it is asked for
        that much earlier and the turn still ends when announced."""
        if self.state.settings.turn_handover is not TurnHandover.CONTINUE:
            return 0.0
        spec = session.spec
        return SNAPSHOT_LEAD_CHUNKS * video_frames(spec.chunk_latent_frames, first_chunk=False) / spec.fps

    async def _end_turn(self, session: ServerSession, ends_at: float) -> None:
        """Its own task, so that the usher's rounds go on meanwhile (the snapshot may take chunks)."""
        try:
            if self.state.settings.turn_handover is TurnHandover.CONTINUE:
                try:
                    self._handovers.append(await self.save_world(session))
                except (ServerError, SnapshotGone) as exc:  # the next person starts their own world instead
                    log.warning("session %s: its world could not be saved for the next driver: %s", session.id, exc)
            await asyncio.sleep(max(0.0, ends_at - time.monotonic()))  # the driver keeps the time it was told
            self.state.metrics.turns_over.inc()
            await session.close(EndReason.TURN_OVER, "your turn is over: the next person in line takes the world")
        finally:
            self._ending.pop(session.id, None)
            self._ends_at.pop(session.id, None)
            self.state.doorbell.set()  # its slot is free: seat the head ticket now

    def _seat(self, now: float) -> None:
        state = self.state
        if state.phase is not Phase.SERVING or not state.ready or not state.engine.healthy:
            return
        while (ticket := self.room.head()) is not None and state.free_slots() > 0:
            admission = ticket.admission
            if self._handovers:  # the worlds of turns that ended, in the order they ended
                admission = admission.continuing(self._handovers.popleft())
            try:
                session = state.open_session(admission, offer_timeout_s=state.settings.connect_window_s)
            except (ServerError, ValueError) as exc:
                self._drop(ticket, DropReason.FAILED, now, str(exc))
                continue
            self.room.seat(ticket, session.id, now)
            state.metrics.queue_wait.observe(now - ticket.joined_t)
            log.info("ticket %s seated in session %s after %.1f s", ticket.id, session.id, now - ticket.joined_t)

    def _drop(self, ticket: Ticket, reason: DropReason, now: float, detail: str = "") -> None:
        self.room.drop(ticket, reason, now, detail)
        self.state.metrics.queue_dropped.labels(reason.value).inc()
