"""Data-channel message parsing: typed messages in, clear error codes out."""

from __future__ import annotations

import json

import pytest

from server.protocol import (
    ControlMsg,
    ControlStateMsg,
    LookMsg,
    PingMsg,
    ProtocolError,
    as_control_dict,
    parse_client_message,
)
from workers.controls import ControlState


def test_messages_parse_to_types() -> None:
    m = parse_client_message(json.dumps({"type": "control", "key": "ArrowUp", "action": "press", "seq": 3, "t": 1.5}))
    assert isinstance(m, ControlMsg) and (m.key, m.action, m.seq) == ("ArrowUp", "press", 3)
    # TeleFuser's field names are accepted as aliases.
    m = parse_client_message(json.dumps({"type": "control", "control": "w", "event": "release"}))
    assert isinstance(m, ControlMsg) and (m.key, m.action) == ("w", "release")
    assert isinstance(parse_client_message('{"type": "control_state", "controls": ["w", "a"]}'), ControlStateMsg)
    assert isinstance(parse_client_message('{"type": "look", "dx": 3, "dy": -2}'), LookMsg)
    assert isinstance(parse_client_message(b'{"type": "ping"}'), PingMsg)


def test_parsed_messages_drive_the_control_state() -> None:
    state = ControlState()
    for raw in ('{"type":"control","key":"w","action":"press","seq":1}', '{"type":"look","dx":10,"seq":2}'):
        state.apply(as_control_dict(parse_client_message(raw)))
    control, reset = state.sample()
    assert control.keys == frozenset({"w"}) and control.look_dx_px == 10 and control.seq == 2 and not reset


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("not json", "bad_json"),
        ("[1, 2]", "bad_json"),
        ('{"type": "teleport"}', "unknown_type"),
        ('{"no": "type"}', "unknown_type"),
        ('{"type": "control", "key": "w", "action": "hold"}', "bad_message"),
        ('{"type": "control", "action": "press"}', "bad_message"),
        ('{"type": "look", "dx": "fast"}', "bad_message"),
        ('{"type": "look", "dx": 1e9}', "bad_message"),
        ('{"type": "control_state", "controls": "w"}', "bad_message"),
        ('{"type": "control_state", "controls": [' + ",".join(['"w"'] * 40) + "]}", "bad_message"),
        ('{"type": "ping", "pad": "' + "x" * 5000 + '"}', "message_too_large"),
    ],
)
def test_bad_messages_get_codes(raw: str, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_client_message(raw)
    assert info.value.code == code
    assert str(info.value)
