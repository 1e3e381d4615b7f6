"""The engine link (server/session/engine_link.py) on its own, against a fake engine that calls back from a
thread as the real scheduler does: callbacks reach the loop, those of a replaced engine session are
dropped, and a save waits, maps the engine's refusal, and gives up after its wait."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from server.common.errors import InsufficientStorage, Unavailable
from server.session.engine_link import EngineLink
from workers.runtime.records import ChunkOutput, ChunkRecord
from workers.runtime.snapshot_catalog import SnapshotEntry


class FakeEngine:
    """Test double for PipelineEngine: numbered engine sessions, callbacks from another thread."""

    def __init__(self) -> None:
        self.opened: list[dict[str, Any]] = []
        self.closed: list[str] = []
        self.snapshot_answer: tuple[SnapshotEntry | None, str | None] | None = None

    def open_session(
        self, image: Any, prompt: str, seed: int, sample: Any, on_chunk: Any, on_end: Any, **kw: Any
    ) -> str:
        session_id = f"e{len(self.opened)}"
        self.opened.append({"id": session_id, "on_chunk": on_chunk, "on_end": on_end, **kw})
        return session_id

    def close_session(self, session_id: str) -> None:
        self.closed.append(session_id)

    def take_snapshot(self, session_id: str, on_done: Callable[[SnapshotEntry | None, str | None], None]) -> str:
        if self.snapshot_answer is not None:
            threading.Thread(target=on_done, args=self.snapshot_answer).start()
        return "snap"

    def from_thread(self, index: int, call: str, *args: Any) -> None:
        t = threading.Thread(target=self.opened[index][call], args=args)
        t.start()
        t.join()


def chunk(session_id: str) -> ChunkOutput:
    return ChunkOutput(session_id, 0, np.zeros((1, 2, 2, 3), np.uint8), ChunkRecord(0))


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_only_the_current_engine_sessions_callbacks_reach_the_loop() -> None:
    engine = FakeEngine()
    chunks: list[str] = []
    failures: list[str] = []
    link = EngineLink(engine, lambda i: None, lambda out: chunks.append(out.session_id), failures.append)  # type: ignore[arg-type]
    image = np.zeros((2, 2, 3), np.uint8)
    link.open(image, "a town", 0, 3, snapshot=None)
    engine.from_thread(0, "on_chunk", chunk("e0"))
    await settle()
    assert chunks == ["e0"]
    link.close()  # a rewind: the old engine session goes, another opens from the snapshot
    link.open(image, "a town", 0, 3, snapshot="snap")
    assert engine.closed == ["e0"] and engine.opened[1]["snapshot"] == "snap"
    engine.from_thread(0, "on_chunk", chunk("e0"))  # late frames of the abandoned future
    engine.from_thread(0, "on_end", "e0", "dit stopped")
    engine.from_thread(1, "on_end", "e1", None)  # a clean end is no failure
    await settle()
    assert chunks == ["e0"] and failures == []
    engine.from_thread(1, "on_end", "e1", "decode stopped")
    await settle()
    assert failures == ["decode stopped"]
    link.close()
    link.close()
    assert engine.closed == ["e0", "e1"] and link.current is None


async def test_a_save_waits_for_the_engine_and_says_what_went_wrong() -> None:
    engine = FakeEngine()
    link = EngineLink(engine, lambda i: None, lambda out: None, lambda error: None)  # type: ignore[arg-type]
    link.open(np.zeros((2, 2, 3), np.uint8), "", 0, 3, snapshot=None)
    entry = SnapshotEntry.__new__(SnapshotEntry)
    engine.snapshot_answer = (entry, None)
    assert await link.save(wait_s=5) is entry
    engine.snapshot_answer = (None, "over the snapshot budget")
    with pytest.raises(InsufficientStorage, match="budget"):
        await link.save(wait_s=5)
    engine.snapshot_answer = None  # the engine never answers
    with pytest.raises(Unavailable, match=re.escape("did not complete in 0.05 s")):
        await link.save(wait_s=0.05)
