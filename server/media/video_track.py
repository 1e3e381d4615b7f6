"""RGB frames to what the video encoders take: yuv420p `av.VideoFrame`s.

Measured on the 2-core dev box at 832×480 (`python -m benchmarks.components`): wrapping the array is
free (`from_numpy_buffer`, ~3 µs) but swscale rgb24 → yuv420p costs 0.8–1.0 ms median and 1–3 ms p90
once other processes compete for the cores. That is not reliably under 1 ms and would be paid on the
loop at every tick of every session, so a session's fan-out (`server/media/fanout.py`) converts on its
encoder thread, together with the encode (swscale and the encoders release the GIL).
"""

from __future__ import annotations

import numpy as np
from av import VideoFrame


def rgb_to_video_frame(rgb: np.ndarray) -> VideoFrame:
    """[H, W, 3] uint8 RGB -> a yuv420p VideoFrame that owns its memory (the input may be reused after)."""
    if not rgb.flags.c_contiguous:
        rgb = np.ascontiguousarray(rgb)
    # from_numpy_buffer wraps without copying; reformat writes the one copy we need, in yuv420p.
    return VideoFrame.from_numpy_buffer(rgb, format="rgb24").reformat(format="yuv420p")
