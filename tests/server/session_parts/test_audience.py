"""The audience (server/session/audience.py) on its own: the per-session limit refused and counted before any
connection is made, revoking ends the holders of that token only and is remembered, one token at a
time, broadcasts reach every spectator and the last chunks are kept for a spectator who joins late."""

from __future__ import annotations

import pytest

from server.common.errors import Busy
from server.common.metrics import Metrics
from server.common.settings import Settings
from server.media.fanout import VideoFanout
from server.media.pacer import Pacer
from server.session.audience import CATCH_UP_CHUNKS, Audience
from server.wire.protocol import EndReason, ReadyMsg
from workers.controls import client_contract


class FakeSpectator:
    """Test double for a Spectator: its token, what it was sent, how it ended."""

    def __init__(self, spectator_id: str, token: str) -> None:
        self.id, self.token = spectator_id, token
        self.sent: list[str] = []
        self.ended: EndReason | None = None

    def send_text(self, text: str) -> None:
        self.sent.append(text)

    async def close(self, code: EndReason, reason: str) -> None:
        self.ended = code


def audience_of(**settings: int) -> tuple[Audience, Metrics]:
    metrics = Metrics()
    return Audience("s1", VideoFanout(Pacer(16, max_frames=8), 16), Settings(**settings), metrics), metrics


def seat(audience: Audience, spectator: FakeSpectator) -> None:
    audience.spectators[spectator.id] = spectator  # type: ignore[assignment]


def ready() -> ReadyMsg:
    return ReadyMsg(
        session_id="s1",
        model="m",
        weights="w",
        width=8,
        height=8,
        fps=16,
        chunk_frames=12,
        dispatch="jit",
        controls=client_contract(),
        idle_timeout_s=None,
        max_duration_s=None,
        role="spectator",
    )


async def test_a_full_session_refuses_before_any_connection_and_counts_it() -> None:
    audience, metrics = audience_of(max_spectators_per_session=2)
    token = audience.watch_token
    assert token is not None
    seat(audience, FakeSpectator("a", token))
    seat(audience, FakeSpectator("b", token))
    with pytest.raises(Busy, match="has 2 spectators, the most it takes"):
        await audience.add("not even an offer", token, ready())
    assert metrics.watch_refused.labels("full")._value.get() == 1
    assert len(audience) == 2 and audience.joined == 0


async def test_revoking_ends_that_tokens_spectators_and_is_remembered() -> None:
    audience, _ = audience_of()
    old = audience.watch_token
    assert old is not None
    holders = [FakeSpectator("a", old), FakeSpectator("b", old)]
    operator = FakeSpectator("c", "the api token")
    for s in (*holders, operator):
        seat(audience, s)
    with pytest.raises(AssertionError):
        audience.issue_token()  # one token at a time: revoke first
    assert await audience.revoke() == 2
    assert [s.ended for s in holders] == [EndReason.REVOKED, EndReason.REVOKED] and operator.ended is None
    assert audience.watch_token is None and list(audience.revoked_watch_tokens) == [old]
    assert await audience.revoke() == 0  # nothing to revoke
    new = audience.issue_token()
    assert new not in (None, old) and audience.watch_token == new


async def test_broadcasts_reach_everyone_and_the_last_chunks_are_kept_for_latecomers() -> None:
    audience, _ = audience_of()
    first = FakeSpectator("a", "t")
    seat(audience, first)
    audience.send_text("stats")
    for i in range(CATCH_UP_CHUNKS + 2):
        audience.send_text(f"chunk {i}", chunk=True)
    assert first.sent[0] == "stats" and len(first.sent) == CATCH_UP_CHUNKS + 3
    assert audience.catch_up() == [f"chunk {i}" for i in range(2, CATCH_UP_CHUNKS + 2)]
    await audience.close_all(EndReason.DRIVER_LEFT, "the session ended")
    assert first.ended is EndReason.DRIVER_LEFT
