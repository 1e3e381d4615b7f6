"""A fake clock for code that takes `clock` and `sleep` (pacer, track, dispatch): time moves only when told."""

from __future__ import annotations

import asyncio


class FakeClock:
    """Time moves only when the code under test sleeps (or the test calls `advance`)."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt

    async def sleep(self, dt: float) -> None:
        self.sleeps.append(dt)
        self.t += dt
        await asyncio.sleep(0)
