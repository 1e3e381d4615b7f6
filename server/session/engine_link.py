"""A session's link to the engine: its engine session, opened from the start image or from a
snapshot, replaced by a rewind, told of a new prompt, saved at a chunk boundary, closed with the
session.

    open ──▶ engine session ──chunks (scheduler thread)──▶ loop ──▶ on_chunk   (the current one only)
                    │        ──end with an error──────────▶ loop ──▶ on_failed  (the current one only)
                    └── rewind: closed, and another opened from the snapshot under the same session

The engine calls back on its scheduler thread; the link hands every callback to the event loop and
drops those of an engine session that is no longer current (a rewind's abandoned future), so the
session only ever hears about the frames it shows. The control source is read on the scheduler
thread itself (it locks what it shares with the loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from server.common.errors import Unavailable
from server.snapshots.snapshot import snapshot_error
from workers.runtime.engine import PipelineEngine
from workers.runtime.records import ChunkOutput
from workers.runtime.scheduled_session import ControlSource
from workers.runtime.snapshot_catalog import SnapshotEntry


class EngineLink:
    def __init__(
        self,
        engine: PipelineEngine,
        sample: ControlSource,
        on_chunk: Callable[[ChunkOutput], None],
        on_failed: Callable[[str], None],
    ) -> None:
        self.engine = engine
        self._loop = asyncio.get_running_loop()
        self._sample, self._on_chunk, self._on_failed = sample, on_chunk, on_failed
        self.current: str | None = None

    def open(self, image: np.ndarray, prompt: str, seed: int, chunk_latent_frames: int, snapshot: str | None) -> None:
        """Start generating (EngineError, ValueError or SnapshotGone if it cannot)."""
        assert self.current is None, "close the engine session first"
        self.current = self.engine.open_session(
            image,
            prompt,
            seed,
            self._sample,
            self._chunk_from_engine,
            self._end_from_engine,
            chunk_latent_frames=chunk_latent_frames,
            snapshot=snapshot,
        )

    def set_prompt(self, text: str, transition_chunks: int) -> None:
        if self.current is not None:
            self.engine.set_prompt(self.current, text, transition_chunks)

    def close(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            self.engine.close_session(current)

    async def save(self, wait_s: float) -> SnapshotEntry:
        """The engine session's state saved at its next chunk boundary, or what the client is told
        if that fails or takes over `wait_s`."""
        assert self.current is not None
        done: asyncio.Future[SnapshotEntry] = self._loop.create_future()

        def on_done(entry: SnapshotEntry | None, error: str | None) -> None:  # scheduler thread
            def settle() -> None:
                if done.done():
                    return
                if entry is None:
                    done.set_exception(snapshot_error(error or "unknown"))
                else:
                    done.set_result(entry)

            self._loop.call_soon_threadsafe(settle)

        self.engine.take_snapshot(self.current, on_done)
        try:
            return await asyncio.wait_for(done, wait_s)
        except TimeoutError:
            raise Unavailable(f"the snapshot did not complete in {wait_s:g} s", retry_after_s=2) from None

    # The engine's callbacks (scheduler thread), handed to the loop.

    def _chunk_from_engine(self, out: ChunkOutput) -> None:
        self._loop.call_soon_threadsafe(self._chunk, out)

    def _end_from_engine(self, session_id: str, error: str | None) -> None:
        self._loop.call_soon_threadsafe(self._ended, session_id, error)

    def _chunk(self, out: ChunkOutput) -> None:
        if out.session_id == self.current:
            self._on_chunk(out)

    def _ended(self, session_id: str, error: str | None) -> None:
        if error is not None and session_id == self.current:
            self._on_failed(error)
