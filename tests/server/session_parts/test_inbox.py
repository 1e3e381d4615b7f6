"""The driver's inbox (server/session/inbox.py) on its own: typed messages through, a flood dropped and answered
once a second, invalid messages answered one by one and, at the abuse limit, reported."""

from __future__ import annotations

from server.common.metrics import Metrics
from server.common.settings import Settings
from server.session.inbox import Inbox
from server.wire.protocol import PingMsg
from workers.controls import ControlMsg


class Outbox:
    """Test double for the driver's channel and the session: what the inbox said and reported."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []
        self.abuse: list[str] = []


def inbox(**settings: float) -> tuple[Inbox, Outbox]:
    out = Outbox()
    box = Inbox(
        Settings(**settings),
        Metrics(),
        now=0.0,
        send_error=lambda code, message: out.errors.append((code, message)),
        on_abuse=out.abuse.append,
    )
    return box, out


def test_valid_messages_come_out_typed_and_counted() -> None:
    box, out = inbox()
    assert isinstance(box.receive('{"type": "ping", "seq": 1, "t": 5}', 0.0), PingMsg)
    msg = box.receive('{"type": "control", "key": "w", "action": "press", "seq": 2}', 0.0)
    assert isinstance(msg, ControlMsg) and msg.key == "w"
    assert box.counts == {"accepted": 2, "rate_limited": 0, "invalid": 0} and out.errors == []


def test_a_flood_is_dropped_and_answered_once_a_second() -> None:
    box, out = inbox(control_rate_per_s=10)
    got = [box.receive('{"type": "ping"}', 0.0) for _ in range(30)]
    assert sum(m is not None for m in got) == 10  # the burst: one second's worth
    assert box.counts["rate_limited"] == 20 and box.refused == 20
    assert [code for code, _ in out.errors] == ["rate_limited"]
    assert box.receive('{"type": "ping"}', 0.05) is None  # half a token back: still refused, not answered
    assert len(out.errors) == 1
    for _ in range(30):
        box.receive('{"type": "ping"}', 1.2)
    assert [code for code, _ in out.errors] == ["rate_limited", "rate_limited"]  # a second later, once more


def test_invalid_messages_are_answered_and_too_many_are_abuse() -> None:
    box, out = inbox(abuse_limit=3, abuse_window_s=10)
    assert box.receive("{not json", 0.0) is None
    assert box.receive('{"type": "fly"}', 1.0) is None
    assert out.abuse == [] and len(out.errors) == 2 and box.counts["invalid"] == 2
    assert box.receive('{"type": "control", "key": "w", "action": "hover"}', 2.0) is None
    assert out.abuse == ["3 invalid messages in 10 s"]


def test_invalid_messages_outside_the_window_are_forgotten() -> None:
    box, out = inbox(abuse_limit=3, abuse_window_s=1)
    for t in (0.0, 2.0, 4.0, 6.0):
        box.receive("{not json", t)
    assert out.abuse == [] and box.counts["invalid"] == 4


def test_prompts_have_their_own_rate_and_a_flood_is_answered_once_a_second() -> None:
    box, out = inbox(prompt_rate_per_s=4)
    got = [box.receive(f'{{"type": "prompt", "text": "p{i}", "transition_chunks": 2}}', 0.0) for i in range(7)]
    accepted = [m for m in got if m is not None]
    assert [(m.text, m.transition_chunks) for m in accepted] == [(f"p{i}", 2) for i in range(4)]  # the burst
    assert [code for code, _ in out.errors] == ["prompt_rate_limited"] and "'p4' was not applied" in out.errors[0][1]
    assert box.counts["rate_limited"] == 3
    assert box.receive('{"type": "ping"}', 0.0) is not None  # controls keep their own budget
    assert box.receive('{"type": "prompt", "text": "later"}', 0.25) is not None  # a token back after 0.25 s
    assert box.receive('{"type": "prompt", "text": "again"}', 1.1) is not None
    for bad in (
        '{"type": "prompt", "text": "x", "transition_chunks": 0}',
        '{"type": "prompt", "text": "x", "transition_chunks": 17}',
    ):
        assert box.receive(bad, 1.1) is None
    assert [code for code, _ in out.errors][1:] == ["bad_message", "bad_message"]
