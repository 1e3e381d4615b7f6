"""PacedVideoTrack (frames, pts, teardown, conversion off the loop), codec preference and bitrate limits.

The conversion's cost and the bitrate an encoder reaches are figures: `python -m benchmarks.components`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc import RTCPeerConnection
from aiortc.codecs import get_encoder
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from server import codecs, video_track
from server.pacer import Pacer
from server.video_track import CONVERT_THREAD_PREFIX, PacedVideoTrack, rgb_to_video_frame
from tests.support.clock import FakeClock

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


async def settle() -> None:
    """Let every ready task run until it blocks (a few loop passes; no wall-clock wait)."""
    for _ in range(5):
        await asyncio.sleep(0)


def convert_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(CONVERT_THREAD_PREFIX)]


# ---- the track ----


async def test_recv_returns_yuv_frames_with_increasing_pts() -> None:
    clock = FakeClock()
    pacer = Pacer(16, 20, clock, sleep=clock.sleep)
    track = PacedVideoTrack(pacer)
    chunk = gradient_chunk(16)
    pacer.push(chunk, chunk_index=0, first_frame_index=0)
    frames = [await track.recv() for _ in range(20)]  # 16 generated + 4 repeats
    track.stop()

    assert all(isinstance(f, av.VideoFrame) for f in frames)
    assert {(f.width, f.height, f.format.name) for f in frames} == {(W, H, "yuv420p")}
    assert all(f.time_base == Fraction(1, 90000) for f in frames)
    assert [f.pts for f in frames] == [n * 5625 for n in range(20)]
    assert pacer.repeated == 4 and pacer.sent == 20
    for i in (0, 7, 15):  # content survives the conversion (BT.601 limited range, 4:2:0)
        back = frames[i].to_ndarray(format="rgb24").astype(np.int16)
        assert np.abs(back - chunk[i]).mean() < 3.0
    assert track.last is not None and track.last.repeated


async def test_stop_leaves_no_threads_or_tasks() -> None:
    clock = FakeClock()
    pacer = Pacer(16, 20, clock, sleep=clock.sleep)
    track = PacedVideoTrack(pacer)
    pacer.push(gradient_chunk(4, 48, 64), chunk_index=0, first_frame_index=0)
    for _ in range(4):
        await track.recv()
    assert convert_threads()  # the pool is in use
    pending = asyncio.create_task(track.recv())  # starved -> a repeat, served at the next tick
    await pending
    idle_track = PacedVideoTrack(Pacer(16, 20))
    waiting = asyncio.create_task(idle_track.recv())  # no frame ever: waits
    await settle()
    assert not waiting.done()

    track.stop()
    track.stop()  # idempotent
    assert track.readyState == "ended" and pacer.closed
    assert convert_threads() == []
    with pytest.raises(MediaStreamError):
        await track.recv()
    waiting.cancel()  # aiortc cancels its sender task the same way
    with pytest.raises(asyncio.CancelledError):
        await waiting
    idle_track.stop()
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_stop_wakes_a_recv_waiting_for_the_first_frame() -> None:
    track = PacedVideoTrack(Pacer(16, 20))
    pending = asyncio.create_task(track.recv())
    await settle()
    assert not pending.done()
    track.stop()
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(pending, 1.0)
    assert convert_threads() == []


async def test_conversion_runs_off_the_loop_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    pacer = Pacer(16, 20, clock, sleep=clock.sleep)
    track = PacedVideoTrack(pacer)
    seen: list[str] = []

    def spy(rgb: np.ndarray) -> av.VideoFrame:
        seen.append(threading.current_thread().name)
        return rgb_to_video_frame(rgb)

    monkeypatch.setattr(video_track, "rgb_to_video_frame", spy)
    pacer.push(gradient_chunk(2, 48, 64), chunk_index=0, first_frame_index=0)
    try:
        await track.recv()
    finally:
        track.stop()
    assert len(seen) == 1 and seen[0].startswith(CONVERT_THREAD_PREFIX)


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


# ---- end to end over a loopback peer connection ----


async def test_loopback_peer_connection_receives_paced_h264() -> None:
    pacer = Pacer(16, 20)
    track = PacedVideoTrack(pacer)
    sender_pc, receiver_pc = RTCPeerConnection(), RTCPeerConnection()
    received: asyncio.Queue[av.VideoFrame] = asyncio.Queue()
    drains: list[asyncio.Task[None]] = []

    @receiver_pc.on("track")
    def on_track(remote) -> None:  # type: ignore[no-untyped-def]
        async def drain() -> None:
            while True:
                try:
                    received.put_nowait(await remote.recv())
                except MediaStreamError:
                    return

        drains.append(asyncio.create_task(drain()))

    try:
        transceiver = sender_pc.addTransceiver(track, direction="sendonly")
        codecs.prefer_codecs(transceiver)
        pacer.push(gradient_chunk(16, 96, 128), chunk_index=0, first_frame_index=0)
        await sender_pc.setLocalDescription(await sender_pc.createOffer())
        await receiver_pc.setRemoteDescription(sender_pc.localDescription)
        await receiver_pc.setLocalDescription(await receiver_pc.createAnswer())
        await sender_pc.setRemoteDescription(receiver_pc.localDescription)
        got = [await asyncio.wait_for(received.get(), 10.0) for _ in range(3)]
        assert {(f.width, f.height) for f in got} == {(128, 96)}
        answer = receiver_pc.localDescription.sdp
        first_pt = next(line for line in answer.splitlines() if line.startswith("m=video")).split()[3]
        assert f"a=rtpmap:{first_pt} H264/90000" in answer  # the codec the sender encodes with
    finally:
        await sender_pc.close()
        await receiver_pc.close()
        track.stop()
        await asyncio.gather(*drains)  # the remote track ends with the connection
    assert convert_threads() == []
