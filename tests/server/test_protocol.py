"""Data-channel message parsing: typed messages in, clear error codes out."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.wire.protocol import (
    ChunkMsg,
    DoneMsg,
    EndReason,
    PingMsg,
    ProtocolError,
    ReadyMsg,
    parse_client_message,
)
from workers.controls import ControlMsg, ControlState, ControlStateMsg, LookMsg


def test_messages_parse_to_types() -> None:
    m = parse_client_message(json.dumps({"type": "control", "key": "ArrowUp", "action": "press", "seq": 3, "t": 1.5}))
    assert isinstance(m, ControlMsg) and (m.key, m.action, m.seq) == ("ArrowUp", "press", 3)
    # TeleFuser's field names are accepted as aliases.
    m = parse_client_message(json.dumps({"type": "control", "control": "w", "event": "release"}))
    assert isinstance(m, ControlMsg) and (m.key, m.action) == ("w", "release")
    assert isinstance(parse_client_message('{"type": "control_state", "controls": ["w", "a"]}'), ControlStateMsg)
    assert isinstance(parse_client_message('{"type": "look", "dx": 3, "dy": -2}'), LookMsg)
    assert isinstance(parse_client_message('{"type": "ping"}'), PingMsg)


def test_parsed_messages_drive_the_control_state() -> None:
    state = ControlState()
    for raw in ('{"type":"control","key":"w","action":"press","seq":1}', '{"type":"look","dx":10,"seq":2}'):
        msg = parse_client_message(raw)
        assert isinstance(msg, ControlMsg | LookMsg)
        state.apply(msg)
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


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_any_payload_parses_or_gets_a_code(data: str | bytes) -> None:
    try:
        parse_client_message(data)
    except ProtocolError as exc:
        assert exc.code in {"bad_json", "unknown_type", "bad_message", "message_too_large"}


@given(st.sampled_from(["control", "control_state", "look", "reset_pose", "prompt", "ping", "stop"]), JSON_VALUES)
def test_any_object_of_a_known_type_parses_or_says_what_is_wrong(kind: str, extra: object) -> None:
    body = {"type": kind, **(extra if isinstance(extra, dict) else {"value": extra})}
    body["type"] = kind
    try:
        msg = parse_client_message(json.dumps(body))
    except ProtocolError as exc:
        assert exc.code == "bad_message" and str(exc).startswith(kind)
    else:
        assert msg.type == kind


def test_server_messages_are_typed_json() -> None:
    ready = ReadyMsg(
        session_id="s",
        model="tiny",
        weights="w",
        width=128,
        height=128,
        fps=16,
        chunk_frames=16,
        dispatch="jit",
        controls={},
        idle_timeout_s=300.0,
        max_duration_s=None,
    )
    assert json.loads(ready.to_json())["type"] == "ready"
    chunk = ChunkMsg(
        index=1,
        first_frame=13,
        num_frames=16,
        pts_start=0,
        pts_end=15,
        parts=[(13, 0, 16)],
        applied_seq=None,
        applied_keys=[],
        timings={},
        stages={"dit": (0.1, 0.2)},
    )
    assert json.loads(chunk.to_json())["parts"] == [[13, 0, 16]]
    with pytest.raises(ValueError):
        ChunkMsg(index=1)  # type: ignore[call-arg]
    done = json.loads(DoneMsg(code=EndReason.IDLE, reason="no control for 300 s").to_json())
    assert done == {"type": "done", "code": "idle", "reason": "no control for 300 s"}
    assert EndReason.PEER_GONE.failed and not EndReason.DELETED.failed
