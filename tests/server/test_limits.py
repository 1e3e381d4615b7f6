"""The pieces that bound what a client can make the server do: token buckets, the per-client create
limiter, offer validation, access-log redaction and the session-length defaults."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from server.common.logs import redact_query
from server.common.rate_limit import PerClientLimiter, TokenBucket
from server.common.settings import DEFAULT_MAX_SESSION_S, Settings
from server.peers.offer import MAX_MEDIA_SECTIONS, OfferError, validate_offer

OFFERS = Path(__file__).parents[2] / "benchmarks" / "reliability" / "offers"


def test_bucket_starts_full_then_refills_at_its_rate() -> None:
    b = TokenBucket.full(rate_per_s=2.0, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.wait_s(0.0) == pytest.approx(0.5)
    assert b.take(0.5) and not b.take(0.5)
    assert b.is_full(100.0) and b.tokens == 3  # never above the burst


def test_bucket_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        TokenBucket.full(rate_per_s=0.0, burst=1, now=0.0)
    with pytest.raises(ValueError):
        TokenBucket.full(rate_per_s=1.0, burst=0.5, now=0.0)


def test_limiter_keeps_clients_apart_and_says_how_long_to_wait() -> None:
    lim = PerClientLimiter(rate_per_s=0.5, burst=2)
    assert lim.take("10.0.0.1", 0.0) is None and lim.take("10.0.0.1", 0.0) is None
    assert lim.take("10.0.0.1", 0.0) == 2.0  # whole seconds until one token at 0.5/s
    assert lim.take("10.0.0.2", 0.0) is None  # another client is unaffected
    assert lim.take("10.0.0.1", 2.0) is None


def test_limiter_table_is_bounded_and_drops_idle_clients_first() -> None:
    lim = PerClientLimiter(rate_per_s=1.0, burst=1, max_clients=3)
    lim.take("a", 0.0)
    lim.take("b", 0.0)
    lim.take("c", 9.0)  # a and b have refilled by t=9.5; c has not
    lim.take("d", 9.5)
    assert len(lim) <= 3
    assert lim.take("c", 9.5) == 1.0  # c kept its empty bucket: evicting it would reset its limit


def _real_offer(name: str) -> str:
    return (OFFERS / name).read_text()  # newlines become "\n"; aiortc's parser takes either


def _without(prefix: str) -> Callable[[str], str]:
    return lambda s: "\n".join(line for line in s.splitlines() if not line.startswith(prefix))


@pytest.mark.parametrize("name", ["chromium.sdp", "aiortc.sdp"])
def test_real_offers_are_accepted(name: str) -> None:
    validate_offer(_real_offer(name))


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (_without("a=fingerprint"), "DTLS"),
        (_without("a=ice-ufrag"), "ICE"),
        (lambda s: s.replace("m=video", "m=audio"), "video"),
        (lambda s: "v=0\r\n", "no media"),
        (lambda s: "v=0\nm=video 9 UDP/TLS/RTP/SAVPF x\n", "parse"),
    ],
)
def test_broken_offers_are_refused_with_a_reason(mutate: Callable[[str], str], reason: str) -> None:
    with pytest.raises(OfferError, match=reason):
        validate_offer(mutate(_real_offer("chromium.sdp")))


def test_too_many_media_sections_are_refused() -> None:
    offer = _real_offer("aiortc.sdp")
    _, _, rest = offer.partition("m=")
    section = "m=" + rest.split("m=")[0]
    crowded = offer + section * MAX_MEDIA_SECTIONS
    with pytest.raises(OfferError, match="media sections"):
        validate_offer(crowded)


def test_access_log_queries_lose_their_values() -> None:
    assert redact_query("/v1/sessions/abc?token=s3cret&x=1") == "/v1/sessions/abc?token=redacted&x=redacted"
    assert redact_query("/v1/sessions?") == "/v1/sessions"


def test_sessions_are_bounded_off_loopback_by_default() -> None:
    assert Settings().session_limit_s is None  # a developer's own machine
    public = Settings(host="0.0.0.0", api_token="t")
    assert public.session_limit_s == DEFAULT_MAX_SESSION_S
    assert Settings(host="0.0.0.0", api_token="t", max_session_s=0).session_limit_s is None
    assert Settings(host="0.0.0.0", api_token="t", max_session_s=30).session_limit_s == 30


def test_session_default_follows_a_host_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLDRTC_HOST", "0.0.0.0")
    monkeypatch.setenv("WORLDRTC_API_TOKEN", "t")
    assert Settings().session_limit_s == DEFAULT_MAX_SESSION_S
