"""Writing uint8 RGB frames to an MP4 with PyAV (H.264 where available, MPEG-4 Part 2 otherwise).

`fragmented`: a fragmented MP4 (an empty `moov` first, then a fragment per keyframe interval), which
players can open while it is still being written: what a session's video download serves before
the session ends."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import cast

import av
import numpy as np


class Mp4Writer:
    def __init__(
        self,
        path: str | Path,
        width_px: int,
        height_px: int,
        fps: int,
        crf: int = 18,
        fragmented: bool = False,
        threads: int | None = None,
    ) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        options = {"movflags": "frag_keyframe+empty_moov+default_base_moof"} if fragmented else {}
        self._container = av.open(str(path), mode="w", format="mp4", options=options)
        codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
        self._stream = cast(av.VideoStream, self._container.add_stream(codec, rate=Fraction(fps, 1)))
        self._stream.width = width_px
        self._stream.height = height_px
        self._stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            self._stream.options = {"crf": str(crf), "preset": "veryfast"}
        if fragmented:
            self._stream.gop_size = fps  # a keyframe, so a fragment a reader can play, every second
        if threads is not None:
            self._stream.codec_context.thread_count = threads
        self.frames_written = 0

    def write(self, frames: np.ndarray) -> None:
        """frames [T, H, W, 3] uint8."""
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
            self.frames_written += 1

    def close(self) -> None:
        if self._container is None:
            return
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()
        self._container = None  # type: ignore[assignment]

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
