"""ICE for a server that is bound to loopback: keep every candidate on 127.0.0.1.

aioice leaves 127.0.0.1 out of its host candidates, and browsers offer their LAN addresses. A
server bound to 127.0.0.1 only serves this machine, so it gathers a loopback host candidate and
ignores non-loopback candidates in offers: media then never touches another interface. A server
bound to a routable address uses aioice's normal gathering and the configured STUN/TURN servers.
"""

from __future__ import annotations

import ipaddress
import re

import aioice.ice

_original_get_host_addresses = aioice.ice.get_host_addresses
_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ (\S+) \d+ typ ", re.IGNORECASE)


def use_loopback_candidates(enabled: bool) -> None:
    """Process-wide (aioice gathers through a module function): loopback-only host candidates or the default."""

    def loopback_only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return ["127.0.0.1"] if use_ipv4 else []

    aioice.ice.get_host_addresses = loopback_only if enabled else _original_get_host_addresses  # type: ignore[assignment]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # mDNS (.local) names and anything else unresolvable here


def keep_loopback_candidates(sdp: str) -> str:
    """Drop the offer's candidates that are not on loopback (line endings preserved)."""
    lines = sdp.splitlines(keepends=True)
    kept = [line for line in lines if not (m := _CANDIDATE.match(line.strip())) or _is_loopback(m.group(1))]
    return "".join(kept)
