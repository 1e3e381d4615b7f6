"""Closed sessions' memory: collections are shared by sessions that close close together."""

from __future__ import annotations

import asyncio
import gc

import pytest

from server.common.memory import MemoryReclaimer


async def test_sessions_closing_together_share_one_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    collected: list[float] = []

    def counting_collect(*_: object) -> int:  # a test double for the real collector: records when
        collected.append(asyncio.get_running_loop().time())
        return 0

    monkeypatch.setattr(gc, "collect", counting_collect)
    monkeypatch.setattr(MemoryReclaimer, "MIN_INTERVAL_S", 0.2)
    r = MemoryReclaimer()
    first = r.session_closed()
    assert first is not None
    await first
    assert len(collected) == 1  # the first close is collected at once
    second = r.session_closed()
    assert second is not None
    assert r.session_closed() is None and r.session_closed() is None  # they wait for the same one
    await second
    assert len(collected) == 2
    assert collected[1] - collected[0] >= 0.19  # not before the interval has passed
