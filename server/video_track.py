"""The WebRTC video track: pulls paced frames and hands aiortc yuv420p `av.VideoFrame`s.

aiortc's RTP sender calls `recv()` in a loop and encodes each frame in its own executor. Our part is
the RGB → yuv420p conversion (the encoders want yuv420p). Measured on the 2-core dev box at 832×480
(`test_conversion_cost`): wrapping the array is free (`from_numpy_buffer`, ~3 µs) but swscale
rgb24 → yuv420p costs 0.8–1.0 ms median and 1–3 ms p90 once other processes compete for the cores.
That is not reliably under 1 ms and would be paid on the loop 16 times a second per session, so it
runs on a small dedicated thread pool instead (swscale releases the GIL); the executor hop itself
costs ~30 µs. The pool is per track and shut down in `stop()`.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
from aiortc import VideoStreamTrack
from aiortc.mediastreams import MediaStreamError
from av import VideoFrame

from server.pacer import VIDEO_CLOCK_HZ, PacedFrame, Pacer, PacerClosed

VIDEO_TIME_BASE = Fraction(1, VIDEO_CLOCK_HZ)
CONVERT_THREAD_PREFIX = "worldrtc-rgb2yuv"


def rgb_to_video_frame(rgb: np.ndarray) -> VideoFrame:
    """[H, W, 3] uint8 RGB -> a yuv420p VideoFrame that owns its memory (the input may be reused after)."""
    if not rgb.flags.c_contiguous:
        rgb = np.ascontiguousarray(rgb)
    # from_numpy_buffer wraps without copying; reformat writes the one copy we need, in yuv420p.
    return VideoFrame.from_numpy_buffer(rgb, format="rgb24").reformat(format="yuv420p")


class PacedVideoTrack(VideoStreamTrack):
    """A video track fed by a Pacer: one frame per tick, pts from the pacer's 90 kHz schedule."""

    def __init__(self, pacer: Pacer, *, convert_threads: int = 1) -> None:
        super().__init__()
        if convert_threads < 1:
            raise ValueError(f"convert_threads must be >= 1, got {convert_threads}")
        self.pacer = pacer
        self.last: PacedFrame | None = None  # the frame most recently handed to aiortc
        self._executor = ThreadPoolExecutor(max_workers=convert_threads, thread_name_prefix=CONVERT_THREAD_PREFIX)

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        try:
            paced = await self.pacer.wait_next()
        except PacerClosed:
            self.stop()
            raise MediaStreamError from None
        if self.readyState != "live":  # stopped while we slept
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        frame = await loop.run_in_executor(self._executor, rgb_to_video_frame, paced.frame)
        if self.readyState != "live":
            raise MediaStreamError
        frame.pts = paced.pts
        frame.time_base = VIDEO_TIME_BASE
        self.last = paced
        return frame

    def stop(self) -> None:
        """End the track, close the pacer and join the conversion thread(s). Idempotent."""
        super().stop()
        self.pacer.close()
        # At most one conversion (~1 ms) can be in flight; waiting for it leaves no thread behind.
        self._executor.shutdown(wait=True, cancel_futures=True)
