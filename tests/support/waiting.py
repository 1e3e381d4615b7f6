"""Wait for an observed condition under a deadline instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.05


def wait_until(condition: Callable[[], T], timeout_s: float, what: str, poll_s: float = POLL_S) -> T:
    """Poll `condition` until it returns something truthy (returned); AssertionError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


async def wait_until_async(
    condition: Callable[[], T | Awaitable[T]], timeout_s: float, what: str, poll_s: float = POLL_S
) -> T:
    """As `wait_until`, on the event loop; `condition` may be a coroutine function."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(poll_s)
