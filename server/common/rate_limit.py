"""Token buckets: a session's control-message rate, and session creation per client address.

A bucket holds up to `burst` tokens and gains `rate_per_s` a second; a request takes one or is
refused, and is told how long until the next token (`Retry-After`). Clocks are passed in, so tests
drive them without sleeping.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from starlette.requests import Request


@dataclass
class TokenBucket:
    rate_per_s: float
    burst: float
    tokens: float
    updated_t: float

    @classmethod
    def full(cls, rate_per_s: float, burst: float, now: float) -> TokenBucket:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate_per_s > 0 and burst >= 1")
        return cls(rate_per_s, burst, burst, now)

    def take(self, now: float) -> bool:
        """Take a token if there is one."""
        self._refill(now)
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def wait_s(self, now: float) -> float:
        """Seconds until a token is there (0 if one is)."""
        self._refill(now)
        return max(0.0, (1 - self.tokens) / self.rate_per_s)

    def is_full(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= self.burst

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.updated_t) * self.rate_per_s)
        self.updated_t = now


class PerClientLimiter:
    """One bucket per client key (an address). The table is bounded: when it is full, buckets that
    have refilled (clients that stopped) go first, then the least recently used."""

    def __init__(self, rate_per_s: float, burst: float, max_clients: int = 10_000) -> None:
        TokenBucket.full(rate_per_s, burst, 0.0)  # validates
        self.rate_per_s, self.burst, self.max_clients = rate_per_s, burst, max_clients
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, client: str, now: float) -> float | None:
        """None if the client may go ahead; otherwise whole seconds to wait (for Retry-After)."""
        bucket = self._buckets.get(client)
        if bucket is None:
            self._make_room(now)
            bucket = self._buckets[client] = TokenBucket.full(self.rate_per_s, self.burst, now)
        self._buckets.move_to_end(client)
        if bucket.take(now):
            return None
        return float(max(1, math.ceil(bucket.wait_s(now))))

    def __len__(self) -> int:
        return len(self._buckets)

    def _make_room(self, now: float) -> None:
        if len(self._buckets) < self.max_clients:
            return
        for key in [k for k, b in self._buckets.items() if b.is_full(now)]:
            del self._buckets[key]
        while len(self._buckets) >= self.max_clients:
            self._buckets.popitem(last=False)


def client_address(request: Request) -> str:
    """Who is calling, for per-client limits: the peer address as uvicorn reports it (behind a
    trusted proxy, uvicorn's --forwarded-allow-ips makes that the forwarded client)."""
    return request.client.host if request.client is not None else "unknown"
