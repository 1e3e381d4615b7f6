"""ICE for a server bound to loopback: media stays on this machine, and any local client connects.

A server bound to 127.0.0.1 only serves this machine. It gathers a single loopback host candidate
(aioice leaves 127.0.0.1 out of its own gathering) and keeps the offer's candidates whose address
belongs to this host: loopback and every interface address (a stock client offers its LAN address;
127.0.0.1 ↔ this host's own address works). A browser that hides its addresses behind mDNS names
(`<uuid>.local`) is on this host too, so each such candidate is kept once per interface address,
with its port. Candidates naming any other host are dropped, so media never leaves the machine. A
server bound to a routable address uses aioice's normal gathering and the configured STUN/TURN
servers. An optional UDP port range pins the host candidates' ports (for NAT rules and containers).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
from typing import Any

import aioice.ice

_original_get_host_addresses = aioice.ice.get_host_addresses
_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ (\S+) \d+ typ ", re.IGNORECASE)


def use_loopback_candidates(enabled: bool) -> None:
    """Process-wide (aioice gathers through a module function): loopback-only host candidates or the default."""

    def loopback_only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return ["127.0.0.1"] if use_ipv4 else []

    aioice.ice.get_host_addresses = loopback_only if enabled else _original_get_host_addresses


def host_addresses() -> frozenset[str]:
    """This host's addresses: loopback and every interface's (IPv4 and IPv6)."""
    return frozenset({"127.0.0.1", "::1", *_original_get_host_addresses(True, True)})


def keep_local_candidates(sdp: str, own: frozenset[str]) -> str:
    """The offer with only candidates on this host (`own` addresses; line endings preserved)."""
    out = []
    for line in sdp.splitlines(keepends=True):
        match = _CANDIDATE.match(line.strip())
        if match is None:
            out.append(line)
            continue
        host = match.group(1)
        if host.lower().endswith(".local"):
            # An mDNS name stands for one of this host's addresses (the client is on this machine).
            end = line[len(line.rstrip("\r\n")) :]
            body = line.rstrip("\r\n")
            lan = sorted(a for a in own if ":" not in a and not ipaddress.ip_address(a).is_loopback)
            out += [body.replace(f" {host} ", f" {addr} ", 1) + end for addr in lan]
        elif _address(host) in own:
            out.append(line)
    return "".join(out)


def _address(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


class _PortRange:
    """Bind ICE host sockets to ports in [lo, hi] (for NAT rules and container port mappings).

    aioice binds each host candidate with `create_datagram_endpoint(local_addr=(ip, 0))`; while an
    ICE connection gathers, that call on the running loop is routed through a binder that tries the
    range's ports in turn. Installed per gathering (reference-counted), so nothing else is affected
    once gathering ends.
    """

    def __init__(self, lo: int, hi: int) -> None:
        if not 1 <= lo <= hi <= 65535:
            raise ValueError(f"bad UDP port range {lo}-{hi}")
        self.lo, self.hi = lo, hi
        self._next = lo
        self._active = 0

    def ports(self) -> list[int]:
        span = self.hi - self.lo + 1
        start = self._next - self.lo
        self._next = self.lo + (start + 1) % span  # rotate so sessions do not all probe the same port first
        return [self.lo + (start + i) % span for i in range(span)]

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._active == 0:
            original = type(loop).create_datagram_endpoint.__get__(loop)

            async def bounded(factory: Any, local_addr: Any = None, **kw: Any) -> Any:
                if local_addr is None or local_addr[1] != 0:
                    return await original(factory, local_addr=local_addr, **kw)
                for port in self.ports():
                    try:
                        return await original(factory, local_addr=(local_addr[0], port), **kw)
                    except OSError:
                        continue
                raise OSError(f"no free UDP port in {self.lo}-{self.hi} on {local_addr[0]}")

            loop.create_datagram_endpoint = bounded  # type: ignore[method-assign,assignment]
        self._active += 1

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        self._active -= 1
        if self._active == 0:
            del loop.create_datagram_endpoint  # back to the class's method


def use_udp_port_range(port_range: tuple[int, int] | None) -> None:
    """Process-wide: ICE host candidates bind inside `port_range`, or anywhere (None)."""
    ranged = None if port_range is None else _PortRange(*port_range)

    async def get_component_candidates(self: Any, component: int, addresses: list[str], timeout: int = 5) -> Any:
        if ranged is None:
            return await _original_gather(self, component, addresses, timeout)
        loop = asyncio.get_running_loop()
        ranged.install(loop)
        try:
            return await _original_gather(self, component, addresses, timeout)
        finally:
            ranged.uninstall(loop)

    aioice.ice.Connection.get_component_candidates = get_component_candidates  # type: ignore[method-assign]


_original_gather = aioice.ice.Connection.get_component_candidates
