"""Encode once, send to every viewer (server/media/fanout.py, server/media/shared_encoder.py): one encode per frame
whatever the number of viewers, viewers start at keyframes, forced keyframes are rate-limited, a viewer
that stops pulling drops for itself only, and teardown leaves no thread or task."""

from __future__ import annotations

import asyncio
import threading
from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc import RTCPeerConnection
from aiortc.codecs import h264
from aiortc.mediastreams import MediaStreamError

from server.media import codecs
from server.media.fanout import ENCODE_THREAD_PREFIX, VideoFanout, ViewerTrack
from server.media.pacer import Pacer
from server.media.shared_encoder import H264, VP8, SharedEncoder
from server.media.video_track import rgb_to_video_frame
from tests.server.test_video_track import gradient_chunk
from tests.support.clock import FakeClock

FPS = 16
STEP = 90_000 // FPS


class PacedClock(FakeClock):
    """Fake time for the pacer and the fan-out, with a real 2 ms pause per tick so that readers keep up."""

    async def sleep(self, dt: float) -> None:
        self.sleeps.append(dt)
        self.t += dt
        await asyncio.sleep(0.002)


def encode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(ENCODE_THREAD_PREFIX)]


def decode(packets: list[av.Packet], codec: str = "h264") -> list[av.VideoFrame]:
    ctx = av.CodecContext.create(codec, "r")
    return [f for p in packets for f in ctx.decode(p)]


def make_fanout(frames: int = 48, **kwargs: object) -> tuple[VideoFanout, Pacer, PacedClock]:
    clock = PacedClock()
    pacer = Pacer(FPS, frames, clock, sleep=clock.sleep)
    pacer.push(gradient_chunk(frames, 64, 96), chunk_index=0, first_frame_index=0)
    return VideoFanout(pacer, FPS, clock=clock, **kwargs), pacer, clock  # type: ignore[arg-type]


async def read(track: ViewerTrack, n: int) -> list[av.Packet]:
    return [await asyncio.wait_for(track.recv(), 10.0) for _ in range(n)]


# ---- the shared encoder ----


@pytest.mark.parametrize(("mime", "decoder"), [(H264, "h264"), (VP8, "vp8")])
def test_shared_encoder_packets_decode_with_session_pts(mime: str, decoder: str) -> None:
    encoder = SharedEncoder(mime, FPS)
    chunk = gradient_chunk(6, 64, 96)
    out = [encoder.encode(rgb_to_video_frame(chunk[i]), i * STEP, keyframe=i == 4) for i in range(6)]
    assert all(e is not None for e in out)
    encoded = [e for e in out if e is not None]
    assert [e.pts for e in encoded] == [i * STEP for i in range(6)]
    assert all(e.packet.time_base == Fraction(1, 90_000) and e.packet.pts == e.pts for e in encoded)
    assert [e.keyframe for e in encoded] == [True, False, False, False, True, False]  # the first, and forced
    frames = decode([e.packet for e in encoded], decoder)
    assert len(frames) == 6 and {(f.width, f.height) for f in frames} == {(96, 64)}
    back = frames[3].to_ndarray(format="rgb24").astype(np.int16)
    assert np.abs(back - chunk[3]).mean() < 6.0


def test_shared_encoder_bitrate_follows_the_configured_limits() -> None:
    before = codecs.set_video_bitrate(800_000, fps=FPS)
    try:
        encoder = SharedEncoder(H264, FPS)
        assert encoder.target_bps == h264.DEFAULT_BITRATE == 800_000
        encoder.target_bps = 10_000_000  # a generous receiver estimate stops at the ceiling
        assert encoder.target_bps == 800_000
        encoder.target_bps = 1_000
        assert encoder.target_bps == 200_000
    finally:
        codecs.restore_video_encoder_settings(before)
    with pytest.raises(ValueError, match="video/H264 or video/VP8"):
        SharedEncoder("video/AV1", FPS)


# ---- the fan-out ----


async def test_every_viewer_gets_the_same_packets_from_one_encode() -> None:
    fanout, pacer, _ = make_fanout()
    viewers = [fanout.add() for _ in range(3)]
    for v in viewers:
        fanout.bind(v, H264)
    encoder = fanout.encoders[H264]
    try:
        got = await asyncio.gather(*(read(v, 20) for v in viewers))
    finally:
        await fanout.close()
    # Shared objects: the same packet went to every viewer, and each tick was encoded once, not thrice.
    firsts = [{id(p) for p in packets[:10]} for packets in got]
    assert len(firsts[0] & firsts[1] & firsts[2]) >= 5
    assert 20 <= encoder.frames <= pacer.sent
    for packets in got:
        pts = [p.pts for p in packets]
        assert pts == list(range(pts[0], pts[0] + 20 * STEP, STEP)), "a viewer that keeps up misses no frame"
        assert len(decode(packets)) == 20  # starts at a keyframe: every packet decodes
    assert encode_threads() == []
    assert all(v.readyState == "ended" for v in viewers)


async def test_a_viewer_that_stops_pulling_drops_for_itself_only() -> None:
    fanout, _, _ = make_fanout(frames=64)
    steady, stuck = fanout.add(), fanout.add()
    fanout.bind(steady, H264)
    fanout.bind(stuck, H264)
    try:
        await read(stuck, 1)  # connected, then its sender stalls
        packets = await read(steady, 60)
    finally:
        await fanout.close()
    pts = [p.pts for p in packets]
    assert pts == list(range(pts[0], pts[0] + 60 * STEP, STEP))
    assert steady.overflows == 0 and steady.skipped == 0
    assert stuck.overflows >= 1 and stuck.skipped > 0  # it restarts at the next keyframe, on its own
    with pytest.raises(MediaStreamError):
        await stuck.recv()


async def test_keyframe_requests_are_rate_limited_and_never_lost() -> None:
    fanout, _, clock = make_fanout(frames=64, keyframe_min_interval_s=0.5)
    viewer = fanout.add()
    fanout.bind(viewer, H264)
    keyframes: list[float] = []
    try:
        await read(viewer, 1)
        t0 = clock.t
        for _ in range(48):  # three seconds of video, a keyframe request at every frame
            fanout.request_keyframe()
            packet = await asyncio.wait_for(viewer.recv(), 10.0)
            if is_idr(packet):
                keyframes.append(clock.t - t0)
        late_request_t = clock.t
        fanout.request_keyframe()  # inside the interval: kept, served once it has passed
        served = [await asyncio.wait_for(viewer.recv(), 10.0) for _ in range(12)]
    finally:
        await fanout.close()
    assert 5 <= len(keyframes) <= 7, keyframes  # one per 0.5 s of the 3 s, not 48
    assert any(is_idr(p) for p in served), f"the request at {late_request_t} was dropped"


def is_idr(packet: av.Packet) -> bool:
    """An H.264 keyframe: the access unit holds an IDR slice (NAL type 5)."""
    data = bytes(packet)
    return b"\x00\x00\x01\x65" in data or b"\x00\x00\x00\x01\x65" in data


async def test_a_second_codec_gets_its_own_encoder_only_while_someone_uses_it() -> None:
    fanout, _, _ = make_fanout()
    h, v = fanout.add(), fanout.add()
    fanout.bind(h, H264)
    assert fanout.codecs_in_use() == [H264]
    fanout.bind(v, VP8)
    try:
        got_h, got_v = await asyncio.gather(read(h, 8), read(v, 8))
        assert fanout.codecs_in_use() == [H264, VP8]
        assert len(decode(got_h)) == 8 and len(decode(got_v, "vp8")) == 8
        v.stop()
        assert fanout.codecs_in_use() == [H264] and set(fanout.encoders) == {H264}
    finally:
        await fanout.close()
    await fanout.close()  # idempotent


async def test_close_wakes_a_viewer_waiting_for_its_first_frame() -> None:
    fanout = VideoFanout(Pacer(FPS, 20), FPS)  # no frame ever arrives
    track = fanout.add()
    fanout.bind(track, H264)
    pending = asyncio.create_task(track.recv())
    await asyncio.sleep(0.05)
    assert not pending.done()
    await fanout.close()
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(pending, 1.0)
    assert encode_threads() == []
    assert asyncio.all_tasks() == {asyncio.current_task()}
    with pytest.raises(RuntimeError, match="ended"):
        fanout.bind(fanout.add(), H264)


async def test_two_loopback_peers_decode_the_shared_stream() -> None:
    """Real aiortc senders packetize the shared packets; real receivers decode them."""
    pacer = Pacer(FPS, 40)
    fanout = VideoFanout(pacer, FPS)
    pairs = [(RTCPeerConnection(), RTCPeerConnection()) for _ in range(2)]
    received: list[asyncio.Queue[av.VideoFrame]] = [asyncio.Queue(), asyncio.Queue()]
    drains: list[asyncio.Task[None]] = []
    try:
        for (sender_pc, receiver_pc), queue in zip(pairs, received, strict=True):

            def on_track(remote, queue=queue) -> None:  # type: ignore[no-untyped-def]
                async def drain() -> None:
                    while True:
                        try:
                            queue.put_nowait(await remote.recv())
                        except MediaStreamError:
                            return

                drains.append(asyncio.create_task(drain()))

            receiver_pc.on("track", on_track)
            track = fanout.add()
            transceiver = sender_pc.addTransceiver(track, direction="sendonly")
            codecs.prefer_codecs(transceiver, ("H264",))
            fanout.rtcp_hook(transceiver.sender, driver=True)
            fanout.bind(track, H264)
            await sender_pc.setLocalDescription(await sender_pc.createOffer())
            await receiver_pc.setRemoteDescription(sender_pc.localDescription)
            await receiver_pc.setLocalDescription(await receiver_pc.createAnswer())
            await sender_pc.setRemoteDescription(receiver_pc.localDescription)
        pacer.push(gradient_chunk(32, 96, 128), chunk_index=0, first_frame_index=0)
        for queue in received:
            got = [await asyncio.wait_for(queue.get(), 10.0) for _ in range(3)]
            assert {(f.width, f.height) for f in got} == {(128, 96)}
        assert set(fanout.encoders) == {H264} and fanout.encoders[H264].frames < 40  # once, not per peer
    finally:
        for sender_pc, receiver_pc in pairs:
            await sender_pc.close()
            await receiver_pc.close()
        await fanout.close()
        await asyncio.gather(*drains)
    assert encode_threads() == []
