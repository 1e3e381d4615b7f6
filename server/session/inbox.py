"""The driver's data-channel messages before they mean anything: rate, parse, abuse.

    text ──token bucket──▶ parse ──▶ a typed client message (to the session)
              │              └── invalid: an `error` (its code) to the driver, counted; abuse_limit
              │                  of them within abuse_window_s: on_abuse (the session closes)
              ├── over control_rate_per_s (burst: one second's worth): dropped, counted, and answered
              │   with at most one `rate_limited` error a second: a flood must not be answered in kind
              └── a prompt over prompt_rate_per_s (burst: one second's worth): dropped, counted as
                  rate_limited, answered with at most one `prompt_rate_limited` a second. Below it,
                  prompts faster than chunks cost nothing: the engine keeps only the latest

Counts by result (accepted, rate_limited, invalid) go to the session's figures and to
`worldrtc_control_messages_total{result}`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from server.common.metrics import Metrics
from server.common.rate_limit import TokenBucket
from server.common.settings import Settings
from server.wire.protocol import ClientMessage, PromptMsg, ProtocolError, parse_client_message

RATE_NOTICE_S = 1.0  # at most one `rate_limited` (and one `prompt_rate_limited`) error a second


class Inbox:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        now: float,
        send_error: Callable[[str, str], None],
        on_abuse: Callable[[str], None],
    ) -> None:
        self._settings, self._metrics = settings, metrics
        self._send_error, self._on_abuse = send_error, on_abuse
        rate = settings.control_rate_per_s
        self._bucket = TokenBucket.full(rate, burst=rate, now=now)
        prompts = settings.prompt_rate_per_s
        self._prompts = TokenBucket.full(prompts, burst=max(1.0, prompts), now=now)
        self._rate_notice_t = self._prompt_notice_t = -math.inf
        self._invalid_t: deque[float] = deque()  # arrival times of invalid messages within abuse_window_s
        self.counts = {"accepted": 0, "rate_limited": 0, "invalid": 0}

    @property
    def refused(self) -> int:
        return self.counts["rate_limited"] + self.counts["invalid"]

    def receive(self, data: str | bytes, now: float) -> ClientMessage | None:
        """The message, or None when it was refused (and answered as the module docstring says)."""
        if not self._bucket.take(now):
            self._count("rate_limited")
            if now - self._rate_notice_t >= RATE_NOTICE_S:
                self._rate_notice_t = now
                self._error("rate_limited", f"more than {self._settings.control_rate_per_s:g} messages/s; slow down")
            return None
        try:
            msg = parse_client_message(data)
        except ProtocolError as exc:
            self._count("invalid")
            self._error(exc.code, str(exc))
            self._note_invalid(now)
            return None
        if isinstance(msg, PromptMsg) and not self._prompts.take(now):
            self._count("rate_limited")
            if now - self._prompt_notice_t >= RATE_NOTICE_S:
                self._prompt_notice_t = now
                limit = self._settings.prompt_rate_per_s
                self._error("prompt_rate_limited", f"more than {limit:g} prompts/s: {msg.text[:40]!r} was not applied")
            return None
        self._count("accepted")
        return msg

    def _count(self, result: str) -> None:
        self.counts[result] += 1
        self._metrics.control_messages.labels(result).inc()

    def _error(self, code: str, message: str) -> None:
        self._metrics.errors.labels(code).inc()
        self._send_error(code, message)

    def _note_invalid(self, now: float) -> None:
        window, settings = self._invalid_t, self._settings
        window.append(now)
        while window and window[0] < now - settings.abuse_window_s:
            window.popleft()
        if len(window) >= settings.abuse_limit:
            self._on_abuse(f"{len(window)} invalid messages in {settings.abuse_window_s:g} s")
