"""Frame stamps survive the codecs the server sends with, and nothing else reads as a stamp."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from aiortc.codecs import depayload, get_decoder, get_encoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from server.media.video_track import rgb_to_video_frame
from workers.frame_stamp import MAX_INDEX, read_stamp, stamp_frames


@pytest.mark.parametrize("mime", ["video/H264", "video/VP8"])
@pytest.mark.parametrize(("h", "w"), [(480, 832), (128, 128)])
def test_stamps_survive_encode_and_decode(mime: str, h: int, w: int) -> None:
    frames = np.empty((12, h, w, 3), np.uint8)
    stamp_frames(frames, first_index=70_000)
    codec = RTCRtpCodecParameters(mimeType=mime, clockRate=90000, payloadType=96)
    encoder, decoder = get_encoder(codec), get_decoder(codec)
    read = []
    for i, rgb in enumerate(frames):
        frame = rgb_to_video_frame(rgb)
        frame.pts, frame.time_base = i * 5625, Fraction(1, 90000)
        payloads, timestamp = encoder.encode(frame, force_keyframe=i == 0)
        data = b"".join(depayload(codec, p) for p in payloads)
        for out in decoder.decode(JitterFrame(data=data, timestamp=timestamp)):
            read.append(read_stamp(out.to_ndarray()[:h]))  # the Y plane
    assert read == list(range(70_000, 70_012))
    assert not np.array_equal(frames[0], frames[1])  # the picture moves, besides the stamp


def test_rgb_reads_too_and_unstamped_frames_read_as_none() -> None:
    frames = np.empty((2, 128, 128, 3), np.uint8)
    stamp_frames(frames, first_index=MAX_INDEX - 1)
    assert [read_stamp(f) for f in frames] == [MAX_INDEX - 1, MAX_INDEX]
    rng = np.random.default_rng(0)
    noise = [rng.integers(0, 256, (128, 128, 3), dtype=np.uint8) for _ in range(50)]
    assert sum(read_stamp(f) is not None for f in noise) <= 1  # an 8-bit CRC: about 1 in 256 passes
    assert read_stamp(np.zeros((128, 128), np.uint8)) is None  # all black
    assert read_stamp(np.full((128, 128), 255, np.uint8)) is None  # all white
    assert read_stamp(np.zeros((8, 8), np.uint8)) is None  # too small to hold one


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="uint8"):
        stamp_frames(np.zeros((1, 128, 128, 3), np.float32), 0)
    with pytest.raises(ValueError, match="indices"):
        stamp_frames(np.zeros((2, 128, 128, 3), np.uint8), MAX_INDEX)
    with pytest.raises(ValueError, match="too small"):
        stamp_frames(np.zeros((1, 16, 16, 3), np.uint8), 0)
