"""The background tasks one object owns (a session, a spectator): each kept until it is done, and
all of them cancelled and awaited when the owner closes, except the task doing the closing."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class OwnedTasks:
    def __init__(self, prefix: str) -> None:
        self._prefix = prefix  # task names: "{prefix}-{name}", for the loop's task dumps
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self._prefix}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel_all(self) -> None:
        current = asyncio.current_task()
        others = [t for t in self._tasks if t is not current]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
