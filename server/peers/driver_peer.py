"""The driver's connection: its peer connection, its control data channel, and its liveness.

    offer ──answer (video from the fan-out)──▶ connecting ──control channel open──▶ on_ready
                                                   └── watch-only (no data channel): ICE connected ──▶ on_ready
    raw data-channel messages ──▶ on_message (the session's inbox)
    connection failed / closed, control channel closed,
    disconnected past disconnected_grace_s, ICE never connected in ice_timeout_s,
    no RTCP receiver report for peer_timeout_s once video flows ──▶ on_gone(code, reason)

Liveness comes from the connection alone, no application heartbeat: any WebRTC client sends RTCP
receiver reports for the video it gets about every second. A "disconnected" connection is given
disconnected_grace_s to come back (ICE restarts after a network change) before it counts as gone.
It never closes the session itself: it says why the driver is gone, and the session decides; its
own timers are cancelled when it closes. A second data channel, or one not labelled "control", is
closed on arrival.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiortc import RTCPeerConnection, RTCRtpSender

from server.common.metrics import Metrics
from server.common.owned_tasks import OwnedTasks
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
from server.wire.protocol import EndReason, ServerMessage, VideoStartMsg

log = logging.getLogger("worldrtc.session")

DRIVER_CODECS = ("H264", "VP8")  # in order of preference


class DriverPeer:
    def __init__(
        self,
        session_id: str,
        settings: Settings,
        metrics: Metrics,
        fanout: VideoFanout,
        on_ready: Callable[[], None],
        on_message: Callable[[str | bytes], None],
        on_gone: Callable[[EndReason, str], None],
    ) -> None:
        self._session_id, self._settings, self._metrics, self._fanout = session_id, settings, metrics, fanout
        self._on_ready, self._on_message, self._on_gone = on_ready, on_message, on_gone
        self.pc: RTCPeerConnection | None = None
        self.channel: Any = None
        self.track: ViewerTrack | None = None
        self.video_sender: RTCRtpSender | None = None
        self.watch_only = False
        self._ready = False
        self._ever_connected = False
        self._tasks = OwnedTasks(f"session-{session_id}-peer")

    async def answer(self, sdp: str) -> str:
        """The SDP answer to the driver's offer; OfferError (in words for the viewer) if there is none."""
        validate_offer(sdp)
        # A viewer that opens no control channel only watches: it streams once ICE connects.
        self.watch_only = "m=application" not in sdp
        self.pc = pc = new_peer_connection(self._settings.ice_servers)
        self._metrics.peer_connections.inc()
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)
        self.track = self._fanout.add(on_start=lambda pts: self.send(VideoStartMsg(pts=pts)))
        try:
            self.video_sender, codec = await answer_viewer(pc, sdp, self.track, DRIVER_CODECS)
        except OfferError:
            raise
        except Exception as exc:  # aiortc raises ValueError, AssertionError, … for offers it cannot use
            log.info("offer refused: %s: %s", type(exc).__name__, exc, extra={"session_id": self._session_id})
            raise OfferError(
                "the SDP offer cannot be answered (its media sections do not fit a recvonly viewer)"
            ) from None
        self._fanout.bind(self.track, codec)
        self._fanout.rtcp_hook(self.video_sender, driver=True)
        self._tasks.spawn(self._fail_if_never_connected(), "ice-timeout")
        return str(pc.localDescription.sdp)

    def send(self, message: ServerMessage) -> None:
        self.send_text(message.to_json())

    def send_text(self, text: str) -> None:
        send_on(self.channel, text)

    async def close(self) -> None:
        """Its timers cancelled and its connection closed; idempotent."""
        await self._tasks.cancel_all()
        pc, self.pc = self.pc, None
        if pc is not None:
            await close_peer_connection(pc, self._metrics)
        self.track, self.video_sender, self.channel = None, None, None

    # ---- events ----

    def _became_ready(self) -> None:
        if self._ready:
            return
        self._ready = True
        self._tasks.spawn(self._watch_liveness(), "liveness")
        self._on_ready()

    def _on_connection_state(self) -> None:
        if self.pc is None:
            return  # closed: the session has let go of it
        state = self.pc.connectionState
        if state == "connected":
            self._ever_connected = True
            if self.watch_only:
                self._became_ready()
        elif state == "failed":
            self._on_gone(EndReason.PEER_GONE, "connection failed")
        elif state == "closed":
            self._on_gone(EndReason.CONNECTION_CLOSED, "connection closed")
        elif state == "disconnected":
            self._tasks.spawn(self._gone_unless_reconnected(), "disconnect-grace")

    def _on_datachannel(self, channel: Any) -> None:
        if channel.label != "control" or self.channel is not None:
            channel.close()
            return
        self.channel = channel
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._on_gone(EndReason.CONNECTION_CLOSED, "control channel closed"))
        if channel.readyState == "open":
            self._became_ready()
        else:
            channel.on("open", self._became_ready)

    # ---- timers ----

    async def _gone_unless_reconnected(self) -> None:
        await asyncio.sleep(self._settings.disconnected_grace_s)
        if self.pc is not None and self.pc.connectionState == "disconnected":
            self._on_gone(EndReason.PEER_GONE, "connection lost")

    async def _fail_if_never_connected(self) -> None:
        await asyncio.sleep(self._settings.ice_timeout_s)
        if not self._ever_connected:
            self._on_gone(EndReason.ICE_TIMEOUT, f"ICE did not connect within {self._settings.ice_timeout_s:g} s")

    async def _watch_liveness(self) -> None:
        timeout = self._settings.peer_timeout_s
        track, sender = self.track, self.video_sender
        assert track is not None and sender is not None
        await wait_until_silent(sender, lambda: track.delivered > 0, timeout)
        self._on_gone(EndReason.PEER_GONE, f"the viewer sent no RTCP receiver report for {timeout:g} s")
