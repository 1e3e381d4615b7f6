"""Loopback-only ICE and the fixed UDP port range, with two real aiortc peers on 127.0.0.1."""

from __future__ import annotations

import asyncio

from aiortc import RTCPeerConnection

from server.ice import keep_loopback_candidates, use_loopback_candidates, use_udp_port_range


def candidate_ports(sdp: str) -> list[tuple[str, int]]:
    out = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            parts = line.split()
            out.append((parts[4], int(parts[5])))
    return out


async def test_loopback_candidates_in_port_range() -> None:
    use_loopback_candidates(True)
    use_udp_port_range((41000, 41009))
    try:
        a, b = RTCPeerConnection(), RTCPeerConnection()
        opened = asyncio.Event()
        channel = a.createDataChannel("control")
        channel.on("open", opened.set)
        await a.setLocalDescription(await a.createOffer())
        await b.setRemoteDescription(a.localDescription)
        await b.setLocalDescription(await b.createAnswer())
        await a.setRemoteDescription(b.localDescription)
        await asyncio.wait_for(opened.wait(), 10)
        for sdp in (a.localDescription.sdp, b.localDescription.sdp):
            cands = candidate_ports(sdp)
            assert cands and all(host == "127.0.0.1" for host, _ in cands), cands
            assert all(41000 <= port <= 41009 for _, port in cands), cands
        await a.close()
        await b.close()
    finally:
        use_udp_port_range(None)
        use_loopback_candidates(False)


def test_offer_candidates_filtered_to_loopback() -> None:
    sdp = (
        "v=0\r\n"
        "a=candidate:1 1 udp 2130706431 10.1.2.3 5000 typ host\r\n"
        "a=candidate:2 1 udp 2130706431 127.0.0.1 5001 typ host\r\n"
        "a=candidate:3 1 udp 2130706431 abcd.local 5002 typ host\r\n"
        "a=end-of-candidates\r\n"
    )
    kept = keep_loopback_candidates(sdp)
    assert "10.1.2.3" not in kept and "abcd.local" not in kept
    assert "127.0.0.1 5001" in kept and kept.endswith("a=end-of-candidates\r\n")
