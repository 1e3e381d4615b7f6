"""Who watches a session, and with what.

    watch token (a capability: watch this session, never steer) ──WHEP offer──▶ Spectator
    the session's broadcasts (chunk, stats, done) ──▶ every spectator's data channel
    the last CATCH_UP_CHUNKS `chunk` messages ──▶ a spectator as its channel opens

A spectator holds no generation slot and no encoder: it reads the session's fan-out
(`server/media/fanout.py`). Limits are enforced where spectators join: max_spectators_per_session here
(429, counted as `full`), the node's max_spectators in `server/http/routes/watch.py`. Revoking the watch token
ends the spectators who joined with it (`done` revoked); the last REVOKED_TOKENS_KEPT revoked tokens
are remembered so that a revoked link is answered 403 "revoked" rather than 401 "wrong".
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque

from server.common.errors import Busy
from server.common.metrics import Metrics
from server.common.settings import Settings
from server.media.fanout import VideoFanout
from server.peers.spectator import Spectator
from server.wire.protocol import EndReason, ReadyMsg

# A spectator joins with frames of the last chunks still queued ahead of it: their `chunk` messages
# (sent before it came) are sent again as it connects, so it can place every frame it receives.
CATCH_UP_CHUNKS = 3
REVOKED_TOKENS_KEPT = 64


def new_watch_token() -> str:
    return secrets.token_urlsafe(24)


class Audience:
    def __init__(self, session_id: str, fanout: VideoFanout, settings: Settings, metrics: Metrics) -> None:
        self._session_id, self._fanout = session_id, fanout
        self._settings, self._metrics = settings, metrics
        self.watch_token: str | None = new_watch_token()
        self.revoked_watch_tokens: deque[str] = deque(maxlen=REVOKED_TOKENS_KEPT)
        self.spectators: dict[str, Spectator] = {}
        self.joined = 0
        self._recent_chunks: deque[str] = deque(maxlen=CATCH_UP_CHUNKS)  # as sent

    def __len__(self) -> int:
        return len(self.spectators)

    async def add(self, sdp: str, token: str, ready: ReadyMsg) -> tuple[Spectator, str]:
        """A spectator watching with `token` (checked by the caller), and its SDP answer."""
        limit = self._settings.max_spectators_per_session
        if len(self.spectators) >= limit:
            self._metrics.watch_refused.labels("full").inc()
            why = f"session {self._session_id} has {limit} spectators, the most it takes; retry later"
            raise Busy(why, retry_after_s=5)
        spectator = Spectator(
            self._session_id,
            token,
            self._fanout,
            ready,
            self.catch_up,
            self._settings,
            self._metrics,
            on_closed=self._left,
        )
        self.spectators[spectator.id] = spectator
        answer = await spectator.accept_offer(sdp)  # closes itself (and leaves the table) on a bad offer
        self.joined += 1
        self._metrics.spectator_joins.inc()
        return spectator, answer

    def catch_up(self) -> list[str]:
        """The last `chunk` messages, as sent: what a spectator gets as its channel opens."""
        return list(self._recent_chunks)

    def issue_token(self) -> str:
        """A new watch token, after `revoke` (one token at a time)."""
        assert self.watch_token is None, "revoke the current watch token first"
        self.watch_token = new_watch_token()
        return self.watch_token

    async def revoke(self) -> int:
        """No watching with the current token any more; its spectators end. Returns how many ended."""
        token, self.watch_token = self.watch_token, None
        if token is None:
            return 0
        self.revoked_watch_tokens.append(token)
        holders = [s for s in self.spectators.values() if s.token == token]
        await asyncio.gather(*(s.close(EndReason.REVOKED, "the driver revoked the watch link") for s in holders))
        return len(holders)

    def send_text(self, text: str, *, chunk: bool = False) -> None:
        """A message the session broadcasts (JSON already); `chunk` ones are kept for catch-up."""
        if chunk:
            self._recent_chunks.append(text)
        for spectator in self.spectators.values():
            spectator.send_text(text)

    async def close_all(self, code: EndReason, reason: str) -> None:
        await asyncio.gather(*(s.close(code, reason) for s in list(self.spectators.values())))

    def _left(self, spectator: Spectator) -> None:
        self.spectators.pop(spectator.id, None)
