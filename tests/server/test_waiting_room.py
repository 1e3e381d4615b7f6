"""The waiting room's line, tokens, drops and estimate, on a clock the test drives (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from server.common.errors import NotFound, QueueFull, RateLimited, TicketGone, Unauthorized
from server.waiting_room.admission import Admission
from server.waiting_room.line import GONE_KEEP_S, DropReason, QueueConfig, TicketState, WaitingRoom, estimate_wait_s
from server.wire.protocol import CreateSessionRequest

CONFIG = QueueConfig(max_waiting=3, per_client=2, silence_s=30, connect_window_s=60)


def admission(client: str = "10.0.0.1") -> Admission:
    return Admission(CreateSessionRequest(), client, "main-street", np.zeros((4, 4, 3), np.uint8))


def test_tickets_wait_in_arrival_order_and_a_failed_connect_goes_back_to_the_head_once() -> None:
    room = WaitingRoom(CONFIG)
    a, _ = room.join(admission("a"), "a", 0.0)
    b, _ = room.join(admission("b"), "b", 1.0)
    c, _ = room.join(admission("c"), "c", 2.0)
    assert [room.position(t) for t in (a, b, c)] == [1, 2, 3] and len(room) == 3
    room.seat(a, "s1", 5.0)
    assert a.state is TicketState.READY and a.session_id == "s1"
    assert [room.position(t) for t in (a, b, c)] == [0, 1, 2]
    assert room.requeue(a) and room.head() is a and a.state is TicketState.WAITING
    room.seat(a, "s2", 6.0)
    assert not room.requeue(a), "a second failed connect does not go back"


def test_the_line_is_bounded_in_length_and_per_address() -> None:
    room = WaitingRoom(CONFIG)
    room.join(admission(), "10.0.0.1", 0.0)
    room.join(admission(), "10.0.0.1", 0.0)
    with pytest.raises(QueueFull, match="already holds 2 tickets"):
        room.join(admission(), "10.0.0.1", 0.0)
    room.join(admission(), "10.0.0.2", 0.0)
    with pytest.raises(QueueFull, match="3 people are waiting"):
        room.join(admission(), "10.0.0.3", 0.0)


def test_a_ticket_opens_with_its_own_token_only_and_keeps_only_its_hash() -> None:
    room = WaitingRoom(CONFIG)
    ticket, token = room.join(admission(), "a", 0.0)
    assert token.encode() not in ticket.token_sha256 and len(ticket.token_sha256) == 32
    assert room.open(ticket.id, token, 1.0) is ticket and ticket.last_poll_t == 1.0
    for wrong in ("", "x" * 32):
        with pytest.raises(Unauthorized):
            room.open(ticket.id, wrong, 1.0)
    with pytest.raises(Unauthorized):  # no oracle: an unknown ticket with a token is 401 as well
        room.open("0123456789abcdef", token, 1.0)
    with pytest.raises(NotFound):  # the API token (None) learns it does not exist
        room.open("0123456789abcdef", None, 1.0)
    assert room.open(ticket.id, None, 1.0) is ticket


def test_polls_are_rate_limited_per_ticket() -> None:
    room = WaitingRoom(CONFIG)
    ticket, token = room.join(admission(), "a", 0.0)
    for _ in range(CONFIG.poll_burst):
        room.open(ticket.id, token, 10.0)
    with pytest.raises(RateLimited) as refused:
        room.open(ticket.id, token, 10.0)
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1
    room.open(ticket.id, token, 10.0 + 1 / CONFIG.poll_rate_per_s)  # a token came back


def test_a_silent_ticket_is_dropped_and_its_next_poll_says_why_then_it_is_forgotten() -> None:
    room = WaitingRoom(CONFIG)
    quiet, quiet_token = room.join(admission("a"), "a", 0.0)
    polled, polled_token = room.join(admission("b"), "b", 0.0)
    room.open(polled.id, polled_token, 25.0)
    assert room.silent(31.0) == [quiet]
    room.drop(quiet, DropReason.SILENT, 31.0)
    assert room.position(polled) == 1 and len(room) == 1
    with pytest.raises(TicketGone, match="not polled for 30 s"):
        room.open(quiet.id, quiet_token, 32.0)
    room.join(admission("c"), "c", 31.0 + GONE_KEEP_S + 1)  # a join forgets tickets dropped long ago
    with pytest.raises(Unauthorized):
        room.open(quiet.id, quiet_token, 31.0 + GONE_KEEP_S + 2)


def test_the_estimate_counts_the_slots_time_left_and_a_turn_per_round_of_the_line() -> None:
    # Two slots held 10 s and 50 s of a 60 s turn: they free in 10 s and 50 s.
    assert estimate_wait_s(1, [50.0, 10.0], 0, 60.0) == 10.0
    assert estimate_wait_s(2, [50.0, 10.0], 0, 60.0) == 50.0
    assert estimate_wait_s(3, [50.0, 10.0], 0, 60.0) == 70.0  # the second round
    assert estimate_wait_s(1, [50.0], 1, 60.0) == 0.0  # a free slot is its at once
    assert estimate_wait_s(1, [90.0], 0, 60.0) == 0.0  # past a typical turn: any moment now


def test_the_typical_turn_is_measured_once_turns_have_ended() -> None:
    room = WaitingRoom(QueueConfig(3, 2, 30, 60, max_turn_s=20))
    assert room.turns.typical_s == 20  # the operator's cap, until a turn has ended
    for held_s in (21.0, 23.0, 22.0):
        room.turns.ended(held_s)
    assert room.turns.typical_s == 22.0
    ticket, _ = room.join(admission(), "a", 0.0)
    assert room.estimate_s(ticket, [2.0], 0) == 20.0
