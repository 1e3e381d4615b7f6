"""Encode once, send to every viewer: a session's paced frames fanned out to its driver and spectators.

    pacer ──wait_next──▶ pump ──(encoder thread: rgb → yuv420p, one encode per codec in use)──▶
        EncodedFrame ──▶ each viewer's ViewerTrack (bounded queue) ──recv──▶ its aiortc RTP sender

One pump per session pulls the pacer at its tick, converts the frame and encodes it once per codec
that some viewer negotiated (`server/media/shared_encoder.py`; viewers are steered to the codec already in
use, so that is one encode). Each viewer's sender packetizes the shared packet itself.

Keyframes. A viewer starts at a keyframe, and after a drop restarts at one: it asks the fan-out,
which forces the next frame to be a keyframe for every viewer. Requests come from new viewers, from
a viewer's own overflow, and from any receiver's PLI/FIR (`rtcp_hook`); they are rate-limited to one
forced keyframe per `keyframe_min_interval_s` (a request inside the interval is kept and served when
it ends, never dropped), so a viewer that keeps losing pictures cannot flood everyone's bitrate.

Isolation. Each viewer's queue holds at most `queue_frames` frames. A viewer whose sender falls
behind (its task starved, its transport stuck) overflows only its own queue: the queue is emptied, it
skips frames until the next keyframe, and nobody else waits. The pump never awaits a viewer.

Bitrate. The driver's receiver estimate (REMB) sets the shared encoder's target, within the
configured limits; spectators' estimates are not applied (a congested spectator loses frames for
itself rather than lowering everyone's quality).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RTCP_PSFB_APP, RTCP_PSFB_FIR, RTCP_PSFB_PLI, RtcpPsfbPacket, unpack_remb_fci

from server.media.pacer import Pacer, PacerClosed
from server.media.shared_encoder import H264, VP8, EncodedFrame, SharedEncoder
from server.media.video_track import rgb_to_video_frame

log = logging.getLogger("worldrtc.fanout")

ENCODE_THREAD_PREFIX = "worldrtc-encode"
QUEUE_FRAMES = 8  # half a second at 16 fps: a sender further behind than this restarts at a keyframe
KEYFRAME_MIN_INTERVAL_S = 0.5


class ViewerTrack(MediaStreamTrack):
    """One viewer's video: shared encoded frames, queued for its RTP sender (bounded, drops for itself)."""

    kind = "video"

    def __init__(self, fanout: VideoFanout, max_frames: int, on_start: Callable[[int], None] | None) -> None:
        super().__init__()
        self.codec: str | None = None  # the negotiated codec's mime type, once bound
        self._fanout = fanout
        self._max_frames = max_frames
        self._queue: deque[EncodedFrame] = deque()
        self._arrived = asyncio.Event()
        self._pulling = False  # its sender has asked for a frame: it is connected
        self._waiting_keyframe = True
        self._on_start = on_start
        self.delivered = 0  # frames handed to the sender
        self.skipped = 0  # frames this viewer did not get (before a keyframe, or after its overflow)
        self.overflows = 0

    def offer(self, frame: EncodedFrame) -> None:
        """A new frame from the pump (loop thread); never blocks."""
        if not self._pulling or self.readyState != "live":
            return
        if len(self._queue) >= self._max_frames:
            self._queue.clear()
            self.overflows += 1
            self._waiting_keyframe = True
            self._fanout.request_keyframe()
        if self._waiting_keyframe and not frame.keyframe:
            self.skipped += 1
            return
        self._waiting_keyframe = False
        self._queue.append(frame)
        self._arrived.set()

    async def recv(self) -> av.Packet[Any]:
        if not self._pulling:
            self._pulling = True
            self._fanout.request_keyframe()  # start at a picture it can decode
        while not self._queue:
            if self.readyState != "live":
                raise MediaStreamError
            self._arrived.clear()
            await self._arrived.wait()
        if self.readyState != "live":
            raise MediaStreamError
        frame = self._queue.popleft()
        if self.delivered == 0 and self._on_start is not None:
            self._on_start(frame.pts)
        self.delivered += 1
        return frame.packet

    def stop(self) -> None:
        super().stop()
        self._queue.clear()
        self._arrived.set()  # wake a waiting recv(): it raises
        self._fanout.remove(self)


class VideoFanout:
    """A session's pump from its pacer to every viewer's track (see the module docstring)."""

    def __init__(
        self,
        pacer: Pacer,
        fps: int,
        *,
        queue_frames: int = QUEUE_FRAMES,
        keyframe_min_interval_s: float = KEYFRAME_MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pacer, self.fps = pacer, fps
        self._queue_frames = queue_frames
        self._min_interval_s = keyframe_min_interval_s
        self._clock = clock
        self.viewers: list[ViewerTrack] = []
        self.encoders: dict[str, SharedEncoder] = {}
        self._keyframe_wanted = False
        self._last_forced_t = -math.inf
        self.keyframe_requests = 0
        self.forced_keyframes = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=ENCODE_THREAD_PREFIX)
        self._task: asyncio.Task[None] | None = None
        self._encoding: Future[dict[str, EncodedFrame | None]] | None = None  # the encode in flight
        self._closed = False

    # ---- viewers ----

    def add(self, on_start: Callable[[int], None] | None = None) -> ViewerTrack:
        """A track for a new viewer; it gets frames once `bind` names its codec and its sender pulls.
        `on_start(pts)`: the session pts of the first frame it sends (its receiver counts from there)."""
        track = ViewerTrack(self, self._queue_frames, on_start)
        self.viewers.append(track)
        return track

    def bind(self, track: ViewerTrack, mime: str) -> None:
        """The viewer's negotiated codec (from the answer): share that codec's encoder, start the pump."""
        if self._closed:
            raise RuntimeError("the session's video has ended")
        track.codec = mime
        if mime not in self.encoders:
            self.encoders[mime] = SharedEncoder(mime, self.fps)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pump(), name="video-fanout")

    def remove(self, track: ViewerTrack) -> None:
        if track in self.viewers:
            self.viewers.remove(track)
        in_use = {v.codec for v in self.viewers}
        for mime in [m for m in self.encoders if m not in in_use]:
            del self.encoders[mime]  # a codec nobody receives any more stops being encoded

    def codecs_in_use(self) -> list[str]:
        """The codecs being encoded now, H.264 first: a new viewer is steered to these."""
        return sorted(self.encoders, key=lambda m: (m != H264, m != VP8, m))

    # ---- feedback from receivers ----

    def request_keyframe(self) -> None:
        self.keyframe_requests += 1
        self._keyframe_wanted = True

    def rtcp_hook(self, sender: Any, *, driver: bool) -> None:
        """Route a sender's keyframe requests (PLI/FIR) to the shared encoder, and, for the driver's
        sender, its bitrate estimate (REMB). aiortc's own handling stays: for a pre-encoded track
        its keyframe flag is unused and its encoder only packetizes."""
        original = sender._handle_rtcp_packet

        async def handle(packet: Any) -> None:
            if isinstance(packet, RtcpPsfbPacket):
                if packet.fmt in (RTCP_PSFB_PLI, RTCP_PSFB_FIR):
                    self.request_keyframe()
                elif packet.fmt == RTCP_PSFB_APP and driver:
                    try:
                        bitrate, ssrcs = unpack_remb_fci(packet.fci)
                    except ValueError:
                        bitrate, ssrcs = 0, []
                    if sender._ssrc in ssrcs:
                        for encoder in self.encoders.values():
                            encoder.target_bps = bitrate
            await original(packet)

        sender._handle_rtcp_packet = handle  # the transport looks the handler up on the instance

    # ---- the pump ----

    def _take_keyframe(self) -> bool:
        if not self._keyframe_wanted:
            return False
        now = self._clock()
        if now - self._last_forced_t < self._min_interval_s:
            return False  # kept: served once the interval has passed
        self._keyframe_wanted = False
        self._last_forced_t = now
        self.forced_keyframes += 1
        return True

    async def _pump(self) -> None:
        try:
            while True:
                paced = await self.pacer.wait_next()
                encoders = list(self.encoders.values())
                if not encoders:
                    continue
                keyframe = self._take_keyframe()
                self._encoding = self._executor.submit(_encode_all, encoders, paced.frame, paced.pts, keyframe)
                encoded = await asyncio.wrap_future(self._encoding)
                for track in list(self.viewers):
                    frame = encoded.get(track.codec or "")
                    if frame is not None:
                        track.offer(frame)
        except PacerClosed:
            pass
        except Exception:
            log.exception("the video fan-out stopped")
        finally:
            for track in list(self.viewers):
                track.stop()

    async def close(self) -> None:
        """End every viewer's track and the pump, and join the encoder thread. Idempotent."""
        self._closed = True
        for track in list(self.viewers):
            track.stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        # At most one encode (a few ms) can be in flight: it is awaited here, off the loop's time, so
        # that joining the encoder thread after it is immediate and leaves no thread behind.
        if self._encoding is not None and not self._encoding.done():
            await asyncio.wait([asyncio.wrap_future(self._encoding)])  # its outcome is nobody's now
        self._executor.shutdown(wait=True, cancel_futures=True)


def _encode_all(encoders: list[SharedEncoder], rgb: Any, pts: int, keyframe: bool) -> dict[str, EncodedFrame | None]:
    """On the encoder thread: one conversion, then one encode per codec in use."""
    frame = rgb_to_video_frame(rgb)
    return {e.mime: e.encode(frame, pts, keyframe) for e in encoders}
