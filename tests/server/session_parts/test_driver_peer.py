"""The driver's peer (server/peers/driver_peer.py) on its own: a real aiortc viewer on loopback gets an answer,
its control channel makes the driver ready once and carries its messages, and its close says the driver
is gone; with fakes for the connection and channels, each way of going reports its reason, a
disconnected connection gets its grace, and stray data channels are closed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from server.common.metrics import Metrics
from server.common.settings import Settings
from server.media.fanout import VideoFanout
from server.media.pacer import Pacer
from server.peers.driver_peer import DriverPeer
from server.peers.offer import OfferError
from server.wire.protocol import EndReason
from tests.support.waiting import wait_until_async


class Reports:
    """Test double for the session: what the peer reported."""

    def __init__(self) -> None:
        self.ready = 0
        self.messages: list[str | bytes] = []
        self.gone: list[tuple[EndReason, str]] = []
        self.ready_event = asyncio.Event()

    def on_ready(self) -> None:
        self.ready += 1
        self.ready_event.set()

    def on_gone(self, code: EndReason, reason: str) -> None:
        self.gone.append((code, reason))


class FakeChannel:
    """Test double for an aiortc data channel."""

    def __init__(self, label: str, ready_state: str = "open") -> None:
        self.label, self.readyState = label, ready_state
        self.handlers: dict[str, Callable[..., Any]] = {}
        self.closed = False
        self.sent: list[str] = []

    def on(self, event: str, handler: Callable[..., Any]) -> None:
        self.handlers[event] = handler

    def close(self) -> None:
        self.closed = True

    def send(self, text: str) -> None:
        self.sent.append(text)


class FakeConnection:
    """Test double for an RTCPeerConnection's state."""

    def __init__(self, state: str) -> None:
        self.connectionState = state


class FakeTrack:
    """Test double for the driver's video track: nothing delivered yet, so no report is due."""

    delivered = 0


def with_fake_media(peer: DriverPeer) -> DriverPeer:
    peer.track, peer.video_sender = FakeTrack(), object()  # type: ignore[assignment]
    return peer


def peer_of(reports: Reports, **settings: float) -> DriverPeer:
    fanout = VideoFanout(Pacer(16, max_frames=8), 16)
    return DriverPeer(
        "s1", Settings(**settings), Metrics(), fanout, reports.on_ready, reports.messages.append, reports.on_gone
    )


async def test_a_real_viewer_connects_talks_and_leaves() -> None:
    reports = Reports()
    peer = peer_of(reports)
    viewer = RTCPeerConnection()
    channel = viewer.createDataChannel("control")
    viewer.addTransceiver("video", direction="recvonly")
    await viewer.setLocalDescription(await viewer.createOffer())
    answer = await peer.answer(viewer.localDescription.sdp)
    assert "a=sendonly" in answer and not peer.watch_only
    await viewer.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    await asyncio.wait_for(reports.ready_event.wait(), 10)
    channel.send('{"type": "ping", "seq": 1}')
    for _ in range(200):
        if reports.messages:
            break
        await asyncio.sleep(0.01)
    assert reports.messages == ['{"type": "ping", "seq": 1}'] and reports.ready == 1
    channel.close()
    for _ in range(200):
        if reports.gone:
            break
        await asyncio.sleep(0.01)
    assert reports.gone[0] == (EndReason.CONNECTION_CLOSED, "control channel closed")
    await peer.close()
    await viewer.close()
    assert peer.pc is None and peer.channel is None


async def test_an_offer_without_video_is_refused_in_words() -> None:
    peer = peer_of(Reports())
    viewer = RTCPeerConnection()
    viewer.createDataChannel("control")
    await viewer.setLocalDescription(await viewer.createOffer())
    with pytest.raises(OfferError, match="video"):
        await peer.answer(viewer.localDescription.sdp)
    await peer.close()
    await viewer.close()


async def test_only_the_first_control_channel_counts_and_readiness_comes_once() -> None:
    reports = Reports()
    peer = with_fake_media(peer_of(reports))
    other = FakeChannel("chat")
    peer._on_datachannel(other)
    assert other.closed and peer.channel is None
    control = FakeChannel("control", ready_state="connecting")
    peer._on_datachannel(control)
    assert reports.ready == 0
    control.readyState = "open"
    control.handlers["open"]()
    second = FakeChannel("control")
    peer._on_datachannel(second)
    assert second.closed and reports.ready == 1
    control.handlers["message"]("hello")
    assert reports.messages == ["hello"]
    peer.send_text("to the driver")
    assert control.sent == ["to the driver"]
    await peer.close()


@pytest.mark.parametrize(
    ("state", "code", "reason"),
    [
        ("failed", EndReason.PEER_GONE, "connection failed"),
        ("closed", EndReason.CONNECTION_CLOSED, "connection closed"),
    ],
)
async def test_each_way_of_going_reports_its_reason(state: str, code: EndReason, reason: str) -> None:
    reports = Reports()
    peer = peer_of(reports)
    peer.pc = FakeConnection(state)  # type: ignore[assignment]
    peer._on_connection_state()
    assert reports.gone == [(code, reason)]
    peer.pc = None
    await peer.close()


async def test_a_disconnected_connection_gets_its_grace() -> None:
    reports = Reports()
    peer = peer_of(reports, disconnected_grace_s=0.3)
    connection = FakeConnection("disconnected")
    peer.pc = connection  # type: ignore[assignment]
    peer._on_connection_state()
    await asyncio.sleep(0.02)
    connection.connectionState = "connected"  # back within the grace (an ICE restart)
    await asyncio.sleep(0.4)  # past the grace: nothing may happen
    assert reports.gone == []
    connection.connectionState = "disconnected"
    peer._on_connection_state()
    await wait_until_async(lambda: reports.gone, 5.0, "the end of the grace")
    assert reports.gone == [(EndReason.PEER_GONE, "connection lost")]
    peer.pc = None
    await peer.close()


async def test_a_watch_only_viewer_is_ready_when_ice_connects() -> None:
    reports = Reports()
    peer = with_fake_media(peer_of(reports))
    peer.watch_only = True
    peer.pc = FakeConnection("connected")  # type: ignore[assignment]
    peer._on_connection_state()
    peer._on_connection_state()
    assert reports.ready == 1 and reports.gone == []
    peer.pc = None
    await peer.close()
