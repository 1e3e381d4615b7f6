"""Per-session frame pacing: whole chunks in (bursty), one frame per tick out (steady).

The engine hands over a chunk of 16 frames about once a second, early or late; the browser wants one
frame every 1/fps with evenly spaced timestamps. The pacer sits between them:

    push(chunk [T, H, W, 3] uint8)  ──▶  bounded deque of per-frame views  ──▶  wait_next() at the tick

Schedule. Frame n after the anchor is due at `anchor_s + n / fps`. The anchor is the moment the first
frame goes out. RTP pts (90 kHz) advance by exactly 90000 / fps per emitted frame, repeats included,
so the browser's jitter buffer sees a perfectly regular stream whatever the engine does.

Policies (every buffer has a bound and an overflow policy):
- Overflow: the queue holds at most `max_frames` (about one chunk); a push beyond that drops the
  oldest queued frames (`dropped`). Latency stays bounded at max_frames / fps.
- Starvation: the next tick repeats the last frame (`repeated`, frame_index None) and the clock keeps
  running, so the stream never stalls and never has to catch up.
- Before the first frame ever arrives there is nothing honest to show: `next_frame()` returns None and
  `wait_next()` waits for the first push. The video therefore sends nothing rather than garbage.
- Start: `wait_next()` sends the first frame once `start_frames` are queued, or `start_wait_s` after
  the first push, whichever comes first. A stream whose first chunk is shorter than the wait for the
  next one would otherwise show it and then repeat its last frame until the next chunk comes; a
  player buffers before it plays for the same reason. The default (1) starts at the first frame.
- Consumer stall: if a tick is served more than `max_lateness_frames` intervals after it was due (the
  event loop or the session's encoder thread stalled), the schedule is
  re-anchored at now (`reanchors`) instead of bursting the backlog out back to back. Smaller lateness
  is absorbed by serving the late ticks at once, which keeps the long-run rate exact.

History: with `history_frames` > 0 the pacer keeps, per emitted frame, (emit time, frames queued
after it, repeated) for the last `history_frames` ticks (drop-oldest): the buffer-level lane of the
stage timeline (server/media/timeline.py).

Threading: all methods run on the event loop thread; the engine's thread hands chunks over with
`loop.call_soon_threadsafe(pacer.push, ...)`. The pacer keeps references (views), not copies: the
caller must not overwrite an array after pushing it (copy out of a reusable shared-memory ring first).
Every operation is O(1) per frame.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

VIDEO_CLOCK_HZ = 90_000  # RTP video clock
START_POLL_S = 0.005  # how often a waiting start looks at the queue again

EmitHook = Callable[[int, int, float], None]  # (chunk_index, frame_index, emit_time_s)


class PacerClosed(Exception):
    """wait_next() on a pacer that was closed (the session or its track is going away)."""


@dataclass(frozen=True, slots=True)
class PacedFrame:
    frame: np.ndarray  # [H, W, 3] uint8, a view into the pushed chunk
    pts: int  # 90 kHz units
    frame_index: int | None  # index in the session's video; None when this tick repeats the last frame
    repeated: bool
    chunk_index: int  # chunk the frame came from (for a repeat: the repeated frame's chunk)
    due_s: float  # when the schedule wanted it out (clock units)
    emit_s: float  # when it was actually taken


@dataclass(frozen=True, slots=True)
class PacerStats:
    sent: int  # every emitted frame, repeats included
    dropped: int  # queued frames discarded by drop-oldest, never sent
    repeated: int  # ticks served by repeating the last frame
    reanchors: int  # schedule restarts after a consumer stall
    depth: int  # frames queued now
    max_depth_seen: int


class Pacer:
    """Bounded per-session frame queue with a fixed-rate emit schedule (see module docstring)."""

    def __init__(
        self,
        fps: int,
        max_frames: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        max_lateness_frames: float = 2.0,
        on_emit: EmitHook | None = None,
        history_frames: int = 0,
        start_frames: int = 1,
        start_wait_s: float = 1.0,
    ) -> None:
        if not isinstance(fps, int) or fps < 1 or VIDEO_CLOCK_HZ % fps:
            raise ValueError(
                f"fps must be a positive integer that divides {VIDEO_CLOCK_HZ} (e.g. 16, 24, 30), got {fps!r}"
            )
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1 (about one chunk, e.g. 16-20), got {max_frames}")
        if max_lateness_frames <= 0:
            raise ValueError(f"max_lateness_frames must be > 0 (e.g. 2.0), got {max_lateness_frames}")
        if not 1 <= start_frames <= max_frames or start_wait_s < 0:
            raise ValueError(
                f"start_frames must be in 1..max_frames ({max_frames}) and start_wait_s >= 0, "
                f"got {start_frames} and {start_wait_s}"
            )
        self.fps = fps
        self.max_frames = max_frames
        self.pts_step = VIDEO_CLOCK_HZ // fps
        self._clock = clock
        self._sleep = sleep
        self._max_lateness_s = max_lateness_frames / fps
        self.on_emit = on_emit
        self.history: deque[tuple[float, int, bool]] = deque(maxlen=history_frames)
        self.start_frames = start_frames
        self.start_wait_s = start_wait_s

        self._queue: deque[tuple[np.ndarray, int, int]] = deque()  # (frame [H, W, 3], chunk, frame index)
        self._last: tuple[np.ndarray, int] | None = None  # (frame, chunk) most recently emitted
        self._anchor_s: float | None = None  # None until the first frame goes out
        self._ticks = 0  # frames emitted since the anchor
        self._next_pts = 0
        self._arrived = asyncio.Event()  # set by the first push (and by close)
        self._first_push_s: float | None = None
        self._closed = False

        self.sent = 0
        self.dropped = 0
        self.repeated = 0
        self.reanchors = 0
        self.max_depth_seen = 0

    # ---- producer side ----

    def push(self, frames: np.ndarray, chunk_index: int, first_frame_index: int) -> None:
        """Queue a chunk's frames [T, H, W, 3] uint8 (views, no copy); drop the oldest beyond max_frames."""
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {tuple(frames.shape)}")
        if self._closed:
            return  # teardown raced a late chunk; nobody will read it
        for t in range(frames.shape[0]):
            self._queue.append((frames[t], chunk_index, first_frame_index + t))
        overflow = len(self._queue) - self.max_frames
        for _ in range(max(overflow, 0)):
            self._queue.popleft()
        if overflow > 0:
            self.dropped += overflow
        self.max_depth_seen = max(self.max_depth_seen, len(self._queue))
        if frames.shape[0]:
            if self._first_push_s is None:
                self._first_push_s = self._clock()
            self._arrived.set()

    def discard_queued(self) -> int:
        """Forget the frames not yet sent (a rewind: they belong to a future that will not happen).
        Not counted as dropped; the schedule and the pts go on. Returns how many went."""
        n = len(self._queue)
        self._queue.clear()
        return n

    # ---- consumer side ----

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def started(self) -> bool:
        """True once the first frame has gone out (the schedule is anchored)."""
        return self._anchor_s is not None

    @property
    def next_due_s(self) -> float | None:
        """When the next tick is due; None before the first frame (which is due as soon as it exists)."""
        if self._anchor_s is None:
            return None
        return self._anchor_s + self._ticks / self.fps

    def next_frame(self, now: float | None = None) -> PacedFrame | None:
        """Take the frame for the current tick now; None only if no frame has ever arrived."""
        if self._last is None and not self._queue:
            return None
        now = self._clock() if now is None else now
        if self._anchor_s is None:
            self._anchor_s, self._ticks = now, 0
        due = self._anchor_s + self._ticks / self.fps
        if now - due > self._max_lateness_s:
            self._anchor_s, self._ticks, due = now, 0, now
            self.reanchors += 1
        if self._queue:
            frame, chunk, index = self._queue.popleft()
            self._last = (frame, chunk)
            out = PacedFrame(frame, self._next_pts, index, False, chunk, due, now)
        else:
            assert self._last is not None
            frame, chunk = self._last
            self.repeated += 1
            out = PacedFrame(frame, self._next_pts, None, True, chunk, due, now)
        self._ticks += 1
        self._next_pts += self.pts_step
        if self.history.maxlen:
            self.history.append((now, len(self._queue), out.repeated))
        self.sent += 1
        if out.frame_index is not None and self.on_emit is not None:
            # Frames go out in order, so the first call per chunk is that chunk's first visible frame.
            self.on_emit(out.chunk_index, out.frame_index, now)
        return out

    async def wait_next(self) -> PacedFrame:
        """Sleep until the next tick is due, then take its frame; waits for the first frame ever.

        Raises PacerClosed once `close()` has been called (noticed within one frame interval).
        """
        while True:
            if self._closed:
                raise PacerClosed("pacer closed")
            if self._last is None and not self._queue:
                await self._arrived.wait()
                continue
            starting_in = self._starting_in_s()
            if starting_in > 0:
                await self._sleep(min(starting_in, START_POLL_S))
                continue
            due = self.next_due_s
            if due is not None:
                delay = due - self._clock()
                if delay > 0:
                    await self._sleep(delay)
                    if self._closed:
                        raise PacerClosed("pacer closed")
            frame = self.next_frame(self._clock())
            assert frame is not None
            return frame

    def _starting_in_s(self) -> float:
        """How long the first frame still waits for `start_frames` to queue (0: go)."""
        if self._anchor_s is not None or len(self._queue) >= self.start_frames or self._first_push_s is None:
            return 0.0
        return max(0.0, self._first_push_s + self.start_wait_s - self._clock())

    def close(self) -> None:
        """Release queued frames and wake a waiter (it raises PacerClosed). Idempotent."""
        self._closed = True
        self._queue.clear()
        self._arrived.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> PacerStats:
        return PacerStats(self.sent, self.dropped, self.repeated, self.reanchors, self.depth, self.max_depth_seen)
