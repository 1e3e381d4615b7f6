"""A session's clocks: the deadlines that end it on their own, and its stats tick.

    created    ── offer_timeout_s without an offer ──────────────▶ close(NO_OFFER)
    streaming  ── idle_timeout_s without a control ──────────────▶ close(IDLE)
               ── max_duration_s after generation started ───────▶ close(MAX_DURATION)
               ── every stats_interval_s ──▶ tick()   (the session's `stats` message)

Each runs as one of the session's owned tasks, so the session's close cancels them. A deadline
calls `close`, which is idempotent: one that fires while the session is already closing does
nothing more. The offer deadline asks the session whether it is still waiting for one (an offer may
have come and failed: the session is then closed already, or connecting).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from server.common.owned_tasks import OwnedTasks
from server.wire.protocol import EndReason

Close = Callable[[EndReason, str], Awaitable[None]]


class SessionTimers:
    def __init__(self, tasks: OwnedTasks, close: Close) -> None:
        self._tasks, self._close = tasks, close

    def expect_offer(self, within_s: float, waiting: Callable[[], bool]) -> None:
        self._tasks.spawn(self._no_offer(within_s, waiting), "offer-timeout")

    def streaming(
        self,
        idle_s: float | None,
        last_control_t: Callable[[], float],
        max_duration_s: float | None,
        stats_interval_s: float,
        tick: Callable[[], None],
    ) -> None:
        """Generation started: the idle and duration deadlines (each off when None or 0) and the tick."""
        if idle_s:
            self._tasks.spawn(self._idle(idle_s, last_control_t), "idle")
        self._tasks.spawn(self._tick(stats_interval_s, tick), "stats")
        if max_duration_s:
            self._tasks.spawn(self._max_duration(max_duration_s), "max-duration")

    async def _no_offer(self, within_s: float, waiting: Callable[[], bool]) -> None:
        await asyncio.sleep(within_s)
        if waiting():
            await self._close(EndReason.NO_OFFER, f"no offer within {within_s:g} s")

    async def _idle(self, idle_s: float, last_control_t: Callable[[], float]) -> None:
        while (left := last_control_t() + idle_s - time.monotonic()) > 0:
            await asyncio.sleep(left)
        await self._close(EndReason.IDLE, f"no control for {idle_s:g} s")

    async def _max_duration(self, after_s: float) -> None:
        await asyncio.sleep(after_s)
        await self._close(EndReason.MAX_DURATION, f"the session reached its maximum duration of {after_s:g} s")

    @staticmethod
    async def _tick(interval_s: float, tick: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            tick()
