"""The RGB to yuv420p conversion, codec preference and bitrate limits (the fan-out: test_fanout.py).

The conversion's cost and the bitrate an encoder reaches are figures: `python -m benchmarks.components`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from aiortc import RTCPeerConnection
from aiortc.codecs import get_encoder
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from server.media import codecs
from server.media.video_track import rgb_to_video_frame

H, W = 480, 832  # the 14B preset's geometry


def gradient_chunk(n: int, h: int = H, w: int = W) -> np.ndarray:
    """[n, h, w, 3] smooth moving gradients (survive 4:2:0 subsampling, so round trips are checkable)."""
    y, x = np.mgrid[0:h, 0:w]
    frames = np.empty((n, h, w, 3), np.uint8)
    for t in range(n):
        frames[t, ..., 0] = (x + 8 * t) * 255 // (w + 8 * n)
        frames[t, ..., 1] = y * 255 // h
        frames[t, ..., 2] = 128
    return frames


# ---- the conversion ----


def test_conversion_keeps_the_picture() -> None:
    chunk = gradient_chunk(2)
    frame = rgb_to_video_frame(chunk[1][:, ::-1])  # not contiguous: copied first
    assert (frame.width, frame.height, frame.format.name) == (W, H, "yuv420p")
    back = frame.to_ndarray(format="rgb24").astype(np.int16)
    assert np.abs(back - chunk[1][:, ::-1]).mean() < 3.0  # BT.601 limited range, 4:2:0


# ---- codecs ----


@pytest.fixture
def restore_encoder_settings() -> Iterator[None]:
    before = codecs.video_encoder_settings()
    yield
    codecs.restore_video_encoder_settings(before)


async def test_prefer_codecs_puts_h264_constrained_baseline_first() -> None:
    pc = RTCPeerConnection()
    try:
        transceiver = pc.addTransceiver("video", direction="sendonly")
        chosen = codecs.prefer_codecs(transceiver)
        names = [c.name for c in chosen]
        assert names[0] == "H264" and chosen[0].parameters["profile-level-id"] == "42e01f"
        assert str(chosen[0].parameters["packetization-mode"]) == "1"
        assert names.index("VP8") > max(i for i, n in enumerate(names) if n == "H264")
        assert names[-1] == "rtx"
        offer = await pc.createOffer()
        m_video = next(line for line in offer.sdp.splitlines() if line.startswith("m=video"))
        first_pt = m_video.split()[3]
        assert f"a=rtpmap:{first_pt} H264/90000" in offer.sdp
        assert f"a=fmtp:{first_pt} level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f" in offer.sdp

        vp8_only = codecs.ordered_video_codecs(("VP8",))
        assert [c.name for c in vp8_only] == ["VP8", "rtx"]
        with pytest.raises(ValueError, match="AV1"):
            codecs.ordered_video_codecs(("AV1",))
    finally:
        await pc.close()


def test_set_video_bitrate_sets_process_wide_limits(restore_encoder_settings: None) -> None:
    from aiortc.codecs import h264, vpx

    codecs.set_video_bitrate(800_000, fps=16)
    for mod in (h264, vpx):
        assert (mod.DEFAULT_BITRATE, mod.MIN_BITRATE, mod.MAX_BITRATE) == (800_000, 200_000, 800_000)
    assert h264.MAX_FRAME_RATE == 16
    enc = get_encoder(RTCRtpCodecParameters(mimeType="video/VP8", clockRate=90000, payloadType=96))
    assert enc.target_bitrate == 800_000
    enc.target_bitrate = 10_000_000  # a generous REMB estimate is clamped to the configured ceiling
    assert enc.target_bitrate == 800_000
    enc.target_bitrate = 1_000
    assert enc.target_bitrate == 200_000
    with pytest.raises(ValueError, match="min_bps <= bps <= max_bps"):
        codecs.set_video_bitrate(1_000_000, max_bps=500_000)
    with pytest.raises(ValueError, match="min_bps <= bps <= max_bps"):
        codecs.set_video_bitrate(0)
