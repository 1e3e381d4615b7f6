"""One video encoder per session and codec, whose packets every viewer of that session sends.

aiortc builds an encoder per RTP sender, so N viewers of one world would encode every frame N times.
Instead the session encodes once (per codec in use, in practice H.264 only) and hands each viewer's
sender the encoded frame as an `av.Packet`; aiortc's sender then only packetizes it for RTP
(`Encoder.pack`), which is what it does for any pre-encoded track.

The settings are aiortc's own (`aiortc.codecs.h264.H264Encoder`, `aiortc.codecs.vpx.Vp8Encoder`):
x264 constrained baseline at level 3.1 with `zerolatency`, libvpx in CBR realtime mode; so what a
browser receives is what it received from aiortc's per-sender encoders. The bitrate limits are the
process-wide ones `server/media/codecs.py` sets; like aiortc's, a target that moves by over 10 % reopens
the codec (the next frame is then a keyframe). The frame rate x264 budgets for is the session's.

Not thread-safe: a session's fan-out calls `encode` from its one encoder thread.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
from aiortc.codecs import h264, vpx
from av.video.codeccontext import VideoCodecContext

from server.media.pacer import VIDEO_CLOCK_HZ

VIDEO_TIME_BASE = Fraction(1, VIDEO_CLOCK_HZ)
H264, VP8 = "video/H264", "video/VP8"
REOPEN_RATIO = 0.1  # aiortc's: a bitrate change under this keeps the open codec


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """One frame, encoded once and shared by every viewer of its codec (never mutated)."""

    packet: av.Packet[Any]  # the whole access unit; pts in 90 kHz units (VIDEO_TIME_BASE)
    keyframe: bool  # a viewer may start (or restart after a drop) here
    pts: int  # the session's pts for this frame (90 kHz)


class SharedEncoder:
    """Encodes a session's frames for one codec (`H264` or `VP8`)."""

    def __init__(self, mime: str, fps: int) -> None:
        if mime not in (H264, VP8):
            raise ValueError(f"no shared encoder for {mime!r}; the server sends {H264} or {VP8}")
        self.mime, self.fps = mime, fps
        self._module = h264 if mime == H264 else vpx
        self._codec: VideoCodecContext | None = None
        self._target_bps = int(self._module.DEFAULT_BITRATE)
        self.frames = 0
        self.keyframes = 0

    @property
    def target_bps(self) -> int:
        return self._target_bps

    @target_bps.setter
    def target_bps(self, bps: int) -> None:
        """What the driver's receiver estimate (REMB) asks for, clamped to the configured limits."""
        self._target_bps = max(int(self._module.MIN_BITRATE), min(int(bps), int(self._module.MAX_BITRATE)))

    def encode(self, frame: av.VideoFrame, pts: int, keyframe: bool) -> EncodedFrame | None:
        """`frame` (yuv420p) at the session's `pts` (90 kHz) -> its packet; None if the codec held it back."""
        codec = self._open(frame)
        frame.pts = pts // (VIDEO_CLOCK_HZ // self.fps)  # frames at the session rate: x264's rate control counts them
        frame.time_base = codec.time_base
        frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        packets = codec.encode(frame)
        if not packets:
            return None
        packet = av.Packet(b"".join(bytes(p) for p in packets))
        packet.pts = pts
        packet.time_base = VIDEO_TIME_BASE
        is_key = any(p.is_keyframe for p in packets)
        self.frames += 1
        self.keyframes += is_key
        return EncodedFrame(packet, is_key, pts)

    def _open(self, frame: av.VideoFrame) -> VideoCodecContext:
        codec = self._codec
        if codec is not None and (
            frame.width != codec.width
            or frame.height != codec.height
            or abs(self._target_bps - (codec.bit_rate or 1)) / (codec.bit_rate or 1) > REOPEN_RATIO
        ):
            codec = None
        if codec is None:
            codec = self._codec = self._create(frame.width, frame.height)
        return codec

    def _create(self, width: int, height: int) -> VideoCodecContext:
        bps = self._target_bps
        if self.mime == H264:
            codec = av.CodecContext.create("libx264", "w")
            codec.options = {"level": "31", "tune": "zerolatency"}
            codec.profile = "Baseline"
        else:
            codec = av.CodecContext.create("libvpx", "w")
            codec.gop_size = 3000
            codec.qmin, codec.qmax = 2, 56
            codec.options = {
                "bufsize": str(bps),
                "cpu-used": "-6",
                "deadline": "realtime",
                "lag-in-frames": "0",
                "minrate": str(bps),  # minrate = maxrate = bit_rate: CBR
                "maxrate": str(bps),
                "noise-sensitivity": "4",
                "overshoot-pct": "15",
                "partitions": "0",
                "static-thresh": "1",
                "undershoot-pct": "100",
            }
            codec.thread_count = vpx.number_of_threads(width * height, multiprocessing.cpu_count())
        assert isinstance(codec, VideoCodecContext)
        codec.width, codec.height = width, height
        codec.bit_rate = bps
        codec.pix_fmt = "yuv420p"
        codec.framerate = Fraction(self.fps, 1)
        codec.time_base = Fraction(1, self.fps)
        return codec
