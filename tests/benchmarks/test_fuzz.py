"""The fuzz generator: deterministic, every mutation and category reachable, and invalid messages invalid."""

from __future__ import annotations

import collections

import pytest

from benchmarks.reliability.fuzz import (
    CONTROL_CATEGORIES,
    OFFER_MUTATIONS,
    FuzzMessage,
    control_message,
    control_messages,
    regressions,
    sdp_offer,
    sdp_offers,
    seed_offers,
)
from server.wire.protocol import MAX_CONTROL_MESSAGE_BYTES, ProtocolError, parse_client_message


def test_seed_offers_are_the_captured_ones() -> None:
    offers = seed_offers()
    assert set(offers) == {"aiortc", "chromium"}
    for sdp in offers.values():
        assert sdp.startswith("v=0\r\n")
        assert sdp.endswith("\r\n")
        assert "\n" not in sdp.replace("\r\n", "")  # CRLF throughout, as the browser wrote it
        assert "m=video" in sdp and "m=application" in sdp and "a=recvonly" in sdp


def test_offers_are_deterministic() -> None:
    first = list(sdp_offers(seed=1, n=300))
    assert first == list(sdp_offers(seed=1, n=300))
    assert first != list(sdp_offers(seed=2, n=300))
    assert sdp_offer(1, 123) == first[123]  # one item rebuilt alone, for replaying a failure


def test_every_mutation_appears() -> None:
    counts = collections.Counter(name for offer in sdp_offers(seed=0, n=2000) for name in offer.mutations)
    assert set(counts) == set(OFFER_MUTATIONS)


@pytest.mark.parametrize("max_bytes", [32 * 1024, 8 * 1024])
def test_oversize_offers_exceed_max_bytes_and_many_sections_do_not(max_bytes: int) -> None:
    offers = list(sdp_offers(seed=3, n=2000, max_bytes=max_bytes))
    oversize = [o for o in offers if "oversize" in o.mutations]
    assert oversize
    assert all(len(o.body) > max_bytes for o in oversize)
    sections = [o for o in offers if o.mutation == "many_m_sections"]
    assert sections
    assert all(len(o.body) <= max_bytes for o in sections)


def test_utf8_flag_is_truthful() -> None:
    flags: collections.Counter[bool] = collections.Counter()
    for offer in sdp_offers(seed=4, n=2000):
        try:
            offer.body.decode("utf-8")
            decodes = True
        except UnicodeDecodeError:
            decodes = False
        assert offer.utf8 == decodes, offer.mutation
        flags[offer.utf8] += 1
    assert flags[True] and flags[False]


def test_five_thousand_offers_generate() -> None:
    offers = list(sdp_offers(seed=5, n=5000))
    assert len(offers) == 5000
    assert all(isinstance(o.body, bytes) for o in offers)


def test_messages_are_deterministic() -> None:
    first = list(control_messages(seed=1, n=300, oversize_bytes=8192))
    assert first == list(control_messages(seed=1, n=300, oversize_bytes=8192))
    assert first != list(control_messages(seed=2, n=300, oversize_bytes=8192))
    assert control_message(1, 77, oversize_bytes=8192) == first[77]


def test_every_message_is_refused_and_every_category_appears() -> None:
    categories: collections.Counter[str] = collections.Counter()
    for message in control_messages(seed=0, n=3000):
        with pytest.raises(ProtocolError):
            parse_client_message(message.payload)
        categories[message.category] += 1
    assert set(categories) == set(CONTROL_CATEGORIES)


def test_oversize_and_binary_messages() -> None:
    messages = list(control_messages(seed=6, n=2000, oversize_bytes=256 * 1024))
    oversize = [m for m in messages if m.category == "oversize"]
    sizes = [len(m.payload.encode() if isinstance(m.payload, str) else m.payload) for m in oversize]
    assert all(size > MAX_CONTROL_MESSAGE_BYTES for size in sizes)
    assert max(sizes) >= 256 * 1024
    assert min(sizes) <= MAX_CONTROL_MESSAGE_BYTES + 64
    assert all(isinstance(m.payload, bytes) for m in messages if m.category == "binary")


@pytest.mark.parametrize("gap", regressions(), ids=lambda g: g.category)
def test_payloads_the_parser_once_let_through_are_refused(gap: FuzzMessage) -> None:
    with pytest.raises(ProtocolError):
        parse_client_message(gap.payload)
