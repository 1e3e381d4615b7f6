"""A session's clocks (server/session/timers.py) on their own, in milliseconds: each deadline closes
with its reason, the idle one moves with the last control, a session no longer waiting for an offer
is left alone, the tick ticks, and the owner's close cancels them all."""

from __future__ import annotations

import asyncio
import time

from server.common.owned_tasks import OwnedTasks
from server.session.timers import SessionTimers
from server.wire.protocol import EndReason
from tests.support.waiting import wait_until_async

WAIT_S = 5.0  # a deadline that has passed closes within this (a busy loop may run late, not never)


class CloseLog:
    """Test double for the session's close: the reasons it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[EndReason, str]] = []

    async def __call__(self, code: EndReason, reason: str) -> None:
        self.calls.append((code, reason))


async def settle(tasks: OwnedTasks, s: float) -> None:
    await asyncio.sleep(s)
    await tasks.cancel_all()


async def test_no_offer_closes_only_a_session_still_waiting_for_one() -> None:
    tasks, close = OwnedTasks("t"), CloseLog()
    SessionTimers(tasks, close).expect_offer(0.02, lambda: True)
    await wait_until_async(lambda: close.calls, WAIT_S, "the no-offer close")
    await tasks.cancel_all()
    assert close.calls == [(EndReason.NO_OFFER, "no offer within 0.02 s")]

    tasks, close = OwnedTasks("t"), CloseLog()
    SessionTimers(tasks, close).expect_offer(0.02, lambda: False)
    await settle(tasks, 0.08)  # well past the deadline: nothing may happen
    assert close.calls == []


async def test_idle_follows_the_last_control_and_the_duration_caps_the_session() -> None:
    tasks, close = OwnedTasks("t"), CloseLog()
    last = [time.monotonic()]
    ticks: list[float] = []
    timers = SessionTimers(tasks, close)
    timers.streaming(0.3, lambda: last[0], None, 0.01, lambda: ticks.append(time.monotonic()))
    for _ in range(10):  # a control every 40 ms keeps the session alive past its 300 ms idle time
        await asyncio.sleep(0.04)
        last[0] = time.monotonic()
    assert close.calls == [] and len(ticks) >= 5
    await wait_until_async(lambda: close.calls, WAIT_S, "the idle close")
    assert close.calls == [(EndReason.IDLE, "no control for 0.3 s")]
    await tasks.cancel_all()

    tasks, close = OwnedTasks("t"), CloseLog()
    SessionTimers(tasks, close).streaming(None, time.monotonic, 0.03, 1.0, lambda: None)
    await wait_until_async(lambda: close.calls, WAIT_S, "the duration's close")
    await tasks.cancel_all()
    assert close.calls == [(EndReason.MAX_DURATION, "the session reached its maximum duration of 0.03 s")]


async def test_the_owners_close_cancels_every_clock() -> None:
    tasks, close = OwnedTasks("t"), CloseLog()
    ticks: list[int] = []
    timers = SessionTimers(tasks, close)
    timers.expect_offer(0.05, lambda: True)
    timers.streaming(0.05, time.monotonic, 0.05, 0.01, lambda: ticks.append(1))
    await settle(tasks, 0.02)
    seen = len(ticks)
    await asyncio.sleep(0.08)
    assert close.calls == [] and len(ticks) == seen
