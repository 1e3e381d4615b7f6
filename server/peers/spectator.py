"""One spectator of a session: a peer connection that receives the session's shared video and, if it
opens a data channel, the session's ready/chunk/stats/done messages; it cannot steer.

    connecting ──first frame sent──▶ watching ──▶ closed
        └── ICE not connected in ice_timeout_s / connection failed / no RTCP reports ──▶ failed

A spectator holds no generation slot and no encoder: its track is one more reader of the session's
fan-out (`server/media/fanout.py`), with a bounded queue that drops for itself only. It ends with its
session (`done` driver_left), when the driver revokes the watch token it joined with (`revoked`),
on its WHEP DELETE (`deleted`), or when its peer goes (`peer_gone`, `connection_closed`). Every task
is owned here and cancelled on close; `close()` is idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from aiortc import RTCRtpSender

from server.common.errors import BadRequest
from server.common.metrics import Metrics
from server.common.owned_tasks import OwnedTasks
from server.common.rate_limit import TokenBucket
from server.common.settings import Settings
from server.media.fanout import VideoFanout, ViewerTrack
from server.peers.offer import OfferError, validate_offer
from server.peers.viewer_peer import (
    answer_viewer,
    close_peer_connection,
    new_peer_connection,
    send_on,
    wait_until_silent,
)
from server.wire.protocol import (
    DoneMsg,
    EndReason,
    ErrorMsg,
    PingMsg,
    PongMsg,
    ProtocolError,
    ReadyMsg,
    VideoStartMsg,
    parse_client_message,
)

log = logging.getLogger("worldrtc.spectator")

READ_ONLY_NOTICE_S = 1.0  # at most one read_only error a second


class SpectatorState(StrEnum):
    CONNECTING = "connecting"
    WATCHING = "watching"
    CLOSED = "closed"
    FAILED = "failed"


class Spectator:
    def __init__(
        self,
        session_id: str,
        token: str,
        fanout: VideoFanout,
        ready: ReadyMsg,
        catch_up: Callable[[], list[str]],
        settings: Settings,
        metrics: Metrics,
        on_closed: Callable[[Spectator], None],
    ) -> None:
        self.id = secrets.token_hex(8)
        self.session_id, self.token = session_id, token  # the watch token it joined with
        self.settings, self.metrics = settings, metrics
        self.state = SpectatorState.CONNECTING
        self.created_t = time.monotonic()
        self.first_frame_s: float | None = None  # offer -> its first frame handed to its sender
        self.ended: EndReason | None = None
        self._fanout = fanout
        self._ready = ready
        self._catch_up = catch_up  # the session's recent `chunk` messages, sent when the channel opens
        self._on_closed = on_closed
        self.pc = new_peer_connection(settings.ice_servers)
        self.channel: Any = None
        self.track: ViewerTrack | None = None
        self.sender: RTCRtpSender | None = None
        self._start_pts: int | None = None
        rate = settings.control_rate_per_s
        self._bucket = TokenBucket.full(rate, burst=rate, now=time.monotonic())
        self._notice_t = -math.inf
        self._tasks = OwnedTasks(f"spectator-{self.id}")
        self._closing = False
        self._closed = asyncio.Event()

    def info(self) -> dict[str, Any]:
        track = self.track
        return {
            "spectator_id": self.id,
            "state": self.state.value,
            "first_frame_s": self.first_frame_s,
            "frames_sent": 0 if track is None else track.delivered,
            "frames_skipped": 0 if track is None else track.skipped,
            "overflows": 0 if track is None else track.overflows,
        }

    async def accept_offer(self, sdp: str) -> str:
        """The SDP answer; a bad offer closes the spectator and raises BadRequest."""
        self.metrics.peer_connections.inc()
        pc = self.pc
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)
        # The session's codec first: a viewer that can take it shares the encoder already running.
        in_use = [m.split("/")[1] for m in self._fanout.codecs_in_use()]
        order = [*in_use, *(c for c in ("H264", "VP8") if c not in in_use)]
        self.track = self._fanout.add(on_start=self._video_started)
        try:
            validate_offer(sdp)
            self.sender, codec = await answer_viewer(pc, sdp, self.track, order)
            self._fanout.bind(self.track, codec)
        except Exception as exc:  # aiortc raises ValueError, AssertionError, … for offers it cannot use
            why = str(exc) if isinstance(exc, OfferError) else "the SDP offer cannot be answered by a send-only viewer"
            await self.close(EndReason.BAD_OFFER, f"bad offer: {why}")
            raise BadRequest(why) from None
        self._fanout.rtcp_hook(self.sender, driver=False)
        self._tasks.spawn(self._fail_if_not_connected(), "ice-timeout")
        self._tasks.spawn(self._watch_peer(), "peer")
        return str(pc.localDescription.sdp)

    def send_text(self, text: str) -> None:
        """A message the session broadcasts (already JSON), if the spectator has a channel open."""
        if not self._closing:
            send_on(self.channel, text)

    async def close(self, code: EndReason, reason: str) -> None:
        """Idempotent: `done` to the spectator, its track off the fan-out, its connection closed."""
        if self._closing:
            await self._closed.wait()
            return
        self.send_text(DoneMsg(code=code, reason=reason).to_json())
        self._closing = True
        self.ended = code
        if self.track is not None:
            self.metrics.spectator_frames_skipped.inc(self.track.skipped)
            self.track.stop()
        await self._tasks.cancel_all()
        await close_peer_connection(self.pc, self.metrics)
        self.state = SpectatorState.FAILED if code.failed else SpectatorState.CLOSED
        log.info(
            "spectator %s of session %s %s: %s",
            self.id,
            self.session_id,
            self.state.value,
            reason,
            extra={"session_id": self.session_id, "state": self.state.value, "reason": reason},
        )
        self._on_closed(self)
        self._closed.set()

    # ---- connection ----

    def _video_started(self, pts: int) -> None:
        self._start_pts = pts
        if self.state is SpectatorState.CONNECTING:
            self.state = SpectatorState.WATCHING
            self.first_frame_s = time.monotonic() - self.created_t
        self.send_text(VideoStartMsg(pts=pts).to_json())

    def _on_connection_state(self) -> None:
        if self._closing:
            return
        state = self.pc.connectionState
        if state == "failed":
            self._tasks.spawn(self.close(EndReason.PEER_GONE, "connection failed"), "close")
        elif state == "closed":
            self._tasks.spawn(self.close(EndReason.CONNECTION_CLOSED, "connection closed"), "close")

    def _on_datachannel(self, channel: Any) -> None:
        if self.channel is not None:
            channel.close()
            return
        self.channel = channel
        channel.on("message", self._on_message)

        def opened() -> None:
            self.send_text(self._ready.to_json())
            for text in self._catch_up():
                self.send_text(text)
            if self._start_pts is not None:
                self.send_text(VideoStartMsg(pts=self._start_pts).to_json())

        if channel.readyState == "open":
            opened()
        else:
            channel.on("open", opened)

    def _on_message(self, data: str | bytes) -> None:
        if not self._bucket.take(time.monotonic()):
            return  # a flood gets no answer; the session's own messages still go out
        try:
            msg = parse_client_message(data)
        except ProtocolError as exc:
            self._notice(exc.code, str(exc))
            return
        if isinstance(msg, PingMsg):
            self.send_text(PongMsg(seq=msg.seq, t=msg.t, server_t=time.time() * 1000).to_json())
        else:
            self._notice("read_only", "this is a spectator's view: it cannot steer the world")

    def _notice(self, code: str, message: str) -> None:
        now = time.monotonic()
        if now - self._notice_t >= READ_ONLY_NOTICE_S:
            self._notice_t = now
            self.metrics.errors.labels(code).inc()
            self.send_text(ErrorMsg(code=code, message=message).to_json())

    async def _fail_if_not_connected(self) -> None:
        await asyncio.sleep(self.settings.ice_timeout_s)
        if self.pc.connectionState != "connected":
            await self.close(EndReason.ICE_TIMEOUT, f"ICE did not connect within {self.settings.ice_timeout_s:g} s")

    async def _watch_peer(self) -> None:
        assert self.sender is not None
        timeout = self.settings.peer_timeout_s
        await wait_until_silent(self.sender, lambda: self.track is not None and self.track.delivered > 0, timeout)
        await self.close(EndReason.PEER_GONE, f"the spectator sent no RTCP receiver report for {timeout:g} s")
