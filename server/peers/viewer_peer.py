"""What a driver's and a spectator's peer connection share: answering a viewer's offer with a send-only
video track, reading which codec that answer chose, and noticing a viewer that has gone silent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc import sdp as aiortc_sdp
from aiortc.mediastreams import MediaStreamTrack

from server.common.metrics import Metrics
from server.media.codecs import prefer_codecs
from server.peers.offer import OfferError

log = logging.getLogger("worldrtc.peer")

PEER_POLL_S = 0.5  # how often RTCP reports are looked at: a vanished peer is noticed within timeout + this


def new_peer_connection(ice_servers: list[dict[str, Any]]) -> RTCPeerConnection:
    return RTCPeerConnection(configuration=RTCConfiguration(iceServers=[RTCIceServer(**s) for s in ice_servers]))


async def answer_viewer(
    pc: RTCPeerConnection, sdp: str, track: MediaStreamTrack, codec_order: Sequence[str]
) -> tuple[RTCRtpSender, str]:
    """Answer a (validated) offer with `track` on its first video section, send-only, codecs in
    `codec_order` (names, e.g. "H264"); returns the video sender and the codec the answer chose."""
    await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
    transceivers = pc.getTransceivers()
    if any(t.receiver.transport is None for t in transceivers) or (pc.sctp is not None and pc.sctp.transport is None):
        raise OfferError("a media section of the offer got no transport (check its BUNDLE group)")
    video = [t for t in transceivers if t.kind == "video"]
    if not video:
        raise OfferError("the offer must include a video section (recvonly)")
    video[0].sender.replaceTrack(track)
    video[0].direction = "sendonly"
    prefer_codecs(video[0], codec_order)
    # aiortc gathers all candidates inside setLocalDescription: the answer is complete (no trickle).
    await pc.setLocalDescription(await pc.createAnswer())
    return video[0].sender, negotiated_video_codec(pc.localDescription.sdp, video[0].mid)


async def close_peer_connection(pc: RTCPeerConnection, metrics: Metrics) -> None:
    """Close a viewer's connection and count it gone, even if aiortc trips over a half-built one."""
    try:
        await pc.close()
    except Exception as exc:  # the viewer still ends: its connection is let go either way
        log.warning("closing a peer connection failed: %s: %s", type(exc).__name__, exc)
    finally:
        metrics.peer_connections.dec()


def send_on(channel: Any, text: str) -> None:
    """Send on a data channel if it is open (None: the viewer opened none)."""
    if channel is None or channel.readyState != "open":
        return
    with contextlib.suppress(Exception):  # a channel closing under us is not an error worth raising
        channel.send(text)


def negotiated_video_codec(answer_sdp: str, mid: str | None) -> str:
    """The mime type ("video/H264") the answer's video section sends with: its first payload type."""
    parsed = aiortc_sdp.SessionDescription.parse(answer_sdp)
    for media in parsed.media:
        if media.kind == "video" and (mid is None or media.rtp.muxId == mid) and media.rtp.codecs:
            return str(media.rtp.codecs[0].mimeType)
    raise OfferError("the offer shares no video codec with the server (it sends H264 or VP8)")


async def wait_until_silent(sender: RTCRtpSender, sending: Callable[[], bool], timeout_s: float) -> None:
    """Return once the viewer has sent no RTCP receiver report for `timeout_s` while video flows
    (`sending()`); any WebRTC client reports about every second. No application heartbeat."""
    last_report: object = None
    heard_t = time.monotonic()
    while True:
        await asyncio.sleep(PEER_POLL_S)
        now = time.monotonic()
        if not sending():
            heard_t = now  # nothing sent yet: nothing to report on
            continue
        stats = await sender.getStats()
        report = next((s.timestamp for s in stats.values() if s.type == "remote-inbound-rtp"), None)
        if report != last_report:
            last_report, heard_t = report, now
        elif now - heard_t > timeout_s:
            return
