"""The control vocabulary: typed control messages, validated once, folded into the latest-wins state."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.controls import (
    KEY_ALIASES,
    MAX_KEYS,
    MAX_LOOK_PX,
    MOVE_KEYS,
    TURN_KEYS,
    ChunkControl,
    ControlError,
    ControlState,
    canonical_key,
    client_contract,
    parse_control,
)


def apply(state: ControlState, raw: dict[str, Any]) -> None:
    state.apply(parse_control(raw))


def press(key: str, seq: int | None = None) -> dict:
    msg = {"type": "control", "key": key, "action": "press"}
    return msg if seq is None else {**msg, "seq": seq}


def release(key: str, seq: int | None = None) -> dict:
    msg = {"type": "control", "key": key, "action": "release"}
    return msg if seq is None else {**msg, "seq": seq}


def test_press_and_release() -> None:
    state = ControlState()
    apply(state, press("w"))
    apply(state, press("l"))
    assert state.held == {"w", "l"}
    apply(state, release("w"))
    assert state.held == {"l"}
    apply(state, release("s"))  # releasing a key that is not held is harmless
    assert state.held == {"l"}
    control, reset = state.sample()
    assert control.keys == frozenset({"l"}) and reset is False


def test_pressing_twice_then_releasing_once_releases() -> None:
    state = ControlState()
    apply(state, press("w"))
    apply(state, press("W"))
    apply(state, release("KeyW"))
    assert state.held == set()


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("ArrowUp", "w"), ("ArrowDown", "s"), ("ArrowLeft", "a"), ("ArrowRight", "d"), ("KeyW", "w"), ("KeyJ", "j")],
)
def test_browser_key_names_are_canonicalised(name: str, canonical: str) -> None:
    assert canonical_key(name) == canonical
    assert ChunkControl.from_keys([name, "Space"], seq=3) == ChunkControl(frozenset({canonical}), seq=3)


def test_control_and_event_aliases() -> None:
    state = ControlState()
    apply(state, {"type": "control", "control": "ArrowUp", "event": "press", "seq": 4})
    assert state.held == {"w"} and state.last_seq == 4
    apply(state, {"type": "control", "control": "KeyW", "event": "release"})
    assert state.held == set()


def test_non_steering_keys_are_ignored_but_counted() -> None:
    state = ControlState()
    apply(state, press("Space", seq=3))
    apply(state, press("Shift", seq=4))
    assert state.held == set() and state.last_seq == 4


def test_control_state_replaces_held_keys() -> None:
    state = ControlState()
    apply(state, press("w"))
    apply(state, {"type": "control_state", "controls": ["ArrowLeft", "KeyI", "Enter"], "seq": 9})
    assert state.held == {"a", "i"} and state.last_seq == 9
    apply(state, {"type": "control_state", "controls": []})
    assert state.held == set()


def test_look_sums_until_sampled_and_reset_is_one_shot() -> None:
    state = ControlState()
    apply(state, {"type": "look", "dx": 10, "dy": -4})
    apply(state, {"type": "look", "dx": 2.5})
    apply(state, {"type": "look", "dy": MAX_LOOK_PX})
    apply(state, {"type": "reset_pose", "seq": 2})
    control, reset = state.sample()
    assert (control.look_dx_px, control.look_dy_px, reset, control.seq) == (12.5, MAX_LOOK_PX - 4, True, 2)
    again, reset_again = state.sample()
    assert (again.look_dx_px, again.look_dy_px, reset_again) == (0.0, 0.0, False)


@pytest.mark.parametrize(
    "message",
    [
        {"type": "control", "key": 87, "action": "press"},
        {"type": "control", "key": None, "action": "press"},
        {"type": "control", "action": "press"},
        {"type": "control", "key": "w", "action": "hold"},
        {"type": "control", "key": "w"},
        {"type": "control", "key": "w", "action": "PRESS"},
        {"type": "control", "key": "w", "action": "press", "seq": "9"},
        {"type": "control_state", "controls": "wasd"},
        {"type": "control_state", "controls": None},
        {"type": "control_state"},
        {"type": "control_state", "controls": ["w", 1]},
        {"type": "control_state", "controls": ["w"] * (MAX_KEYS + 1)},
        {"type": "look", "dx": math.nan, "dy": 0},
        {"type": "look", "dx": 0, "dy": math.inf},
        {"type": "look", "dx": MAX_LOOK_PX + 1},
        {"type": "look", "dx": "5"},
        {"type": "look", "dx": None},
        {"type": "prompt", "text": "not a control"},
        {"type": "something_new"},
        {"no_type": True},
    ],
)
def test_bad_messages_are_refused_with_a_reason(message: dict) -> None:
    with pytest.raises(ControlError) as info:
        parse_control(message)
    assert str(info.value)


def test_contract_published_to_clients() -> None:
    contract = client_contract()
    assert contract["move_keys"] == sorted(MOVE_KEYS) and contract["turn_keys"] == sorted(TURN_KEYS)
    assert contract["key_aliases"] == KEY_ALIASES and contract["max_look_px"] == MAX_LOOK_PX


# ---- properties ----

KEY_NAMES = st.sampled_from(["w", "a", "s", "d", "j", "l", "i", "k", "W", "KeyD", "ArrowUp", "ArrowLeft", "Space", "x"])
SEQ = st.one_of(st.none(), st.integers(0, 2**31))
MESSAGES = st.one_of(
    st.builds(
        lambda k, a, q: {"type": "control", "key": k, "action": a, "seq": q},
        KEY_NAMES,
        st.sampled_from(["press", "release"]),
        SEQ,
    ),
    st.builds(lambda ks, q: {"type": "control_state", "controls": ks, "seq": q}, st.lists(KEY_NAMES, max_size=6), SEQ),
    st.builds(
        lambda x, y, q: {"type": "look", "dx": x, "dy": y, "seq": q},
        st.floats(-MAX_LOOK_PX, MAX_LOOK_PX),
        st.floats(-MAX_LOOK_PX, MAX_LOOK_PX),
        SEQ,
    ),
    st.builds(lambda q: {"type": "reset_pose", "seq": q}, SEQ),
)


@given(st.lists(MESSAGES, max_size=40))
def test_folding_matches_a_plain_model_of_it(messages: list[dict]) -> None:
    """Held keys, summed look, the reset flag and the last seq equal a direct reading of the messages."""
    state = ControlState()
    held: set[str] = set()
    dx = dy = 0.0
    reset = False
    seq = None
    for raw in messages:
        apply(state, {k: v for k, v in raw.items() if v is not None})
        key = canonical_key(raw["key"]) if raw["type"] == "control" else None
        if raw["type"] == "control" and key is not None:
            (held.add if raw["action"] == "press" else held.discard)(key)
        elif raw["type"] == "control_state":
            held = {k for k in map(canonical_key, raw["controls"]) if k is not None}
        elif raw["type"] == "look":
            dx, dy = dx + raw["dx"], dy + raw["dy"]
        elif raw["type"] == "reset_pose":
            reset = True
        seq = raw["seq"] if raw["seq"] is not None else seq
    control, got_reset = state.sample()
    assert control.keys == frozenset(held) and held <= set(MOVE_KEYS) | set(TURN_KEYS)
    assert (control.look_dx_px, control.look_dy_px) == pytest.approx((dx, dy))
    assert (got_reset, control.seq) == (reset, seq)
