"""Loopback-only ICE and the fixed UDP port range, with two real aiortc peers on 127.0.0.1."""

from __future__ import annotations

import asyncio

from aiortc import RTCPeerConnection

from server.peers.ice import host_addresses, keep_local_candidates, use_loopback_candidates, use_udp_port_range


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


def test_offer_keeps_only_candidates_on_this_host() -> None:
    own = frozenset({"127.0.0.1", "::1", "192.0.2.2", "fd00::2"})
    sdp = (
        "v=0\r\n"
        "a=candidate:1 1 udp 2130706431 10.1.2.3 5000 typ host\r\n"  # another machine: dropped
        "a=candidate:2 1 udp 2130706431 127.0.0.1 5001 typ host\r\n"
        "a=candidate:3 1 udp 2130706431 192.0.2.2 5002 typ host\r\n"  # this host's LAN address
        "a=candidate:4 1 udp 2130706431 fd00::2 5003 typ host\r\n"
        "a=candidate:5 1 udp 2130706431 abcd-1234.local 5004 typ host\r\n"  # a browser's mDNS name
        "a=candidate:6 1 udp 1694498815 203.0.113.9 5005 typ srflx raddr 0.0.0.0 rport 0\r\n"
        "a=end-of-candidates\r\n"
    )
    kept = keep_local_candidates(sdp, own)
    assert "10.1.2.3" not in kept and "203.0.113.9" not in kept and ".local" not in kept
    for line in ("127.0.0.1 5001", "192.0.2.2 5002", "fd00::2 5003", "a=candidate:5 1 udp 2130706431 192.0.2.2 5004"):
        assert line in kept, line
    assert "127.0.0.1 5004" not in kept  # an mDNS name stands for an interface address, not loopback
    assert kept.startswith("v=0\r\n") and kept.endswith("a=end-of-candidates\r\n")


def test_host_addresses_include_loopback_and_interfaces() -> None:
    own = host_addresses()
    assert {"127.0.0.1", "::1"} <= own and len(own) >= 2
