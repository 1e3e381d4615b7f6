"""Folding client control messages into the latest-wins control state."""

from __future__ import annotations

import math

import pytest

from workers.controls import MAX_LOOK_PX, ControlError, ControlState


def press(key: str, seq: int | None = None) -> dict:
    msg = {"type": "control", "key": key, "action": "press"}
    return msg if seq is None else {**msg, "seq": seq}


def release(key: str, seq: int | None = None) -> dict:
    msg = {"type": "control", "key": key, "action": "release"}
    return msg if seq is None else {**msg, "seq": seq}


def test_press_and_release() -> None:
    state = ControlState()
    state.apply(press("w"))
    state.apply(press("l"))
    assert state.held == {"w", "l"}
    state.apply(release("w"))
    assert state.held == {"l"}
    # Releasing a key that is not held is harmless.
    state.apply(release("s"))
    assert state.held == {"l"}
    control, reset = state.sample()
    assert control.keys == frozenset({"l"})
    assert reset is False


def test_pressing_twice_then_releasing_once_releases() -> None:
    state = ControlState()
    state.apply(press("w"))
    state.apply(press("W"))
    state.apply(release("KeyW"))
    assert state.held == set()


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("ArrowUp", "w"), ("ArrowDown", "s"), ("ArrowLeft", "a"), ("ArrowRight", "d"), ("KeyW", "w"), ("KeyJ", "j")],
)
def test_browser_key_names_are_canonicalised(name: str, canonical: str) -> None:
    state = ControlState()
    state.apply(press(name))
    assert state.held == {canonical}
    state.apply(release(canonical))
    assert state.held == set()


def test_control_and_event_aliases() -> None:
    state = ControlState()
    state.apply({"type": "control", "control": "ArrowUp", "event": "press", "seq": 4})
    assert state.held == {"w"}
    assert state.last_seq == 4
    state.apply({"type": "control", "control": "KeyW", "event": "release"})
    assert state.held == set()


def test_non_steering_keys_are_ignored_but_counted() -> None:
    state = ControlState()
    state.apply(press("Space", seq=3))
    state.apply(press("Shift", seq=4))
    assert state.held == set()
    assert state.last_seq == 4


def test_control_state_replaces_held_keys() -> None:
    state = ControlState()
    state.apply(press("w"))
    state.apply(press("j"))
    state.apply({"type": "control_state", "controls": ["ArrowLeft", "KeyI", "Enter"], "seq": 9})
    assert state.held == {"a", "i"}
    assert state.last_seq == 9
    state.apply({"type": "control_state", "controls": []})
    assert state.held == set()


def test_look_sums_until_sampled() -> None:
    state = ControlState()
    state.apply({"type": "look", "dx": 10, "dy": -4})
    state.apply({"type": "look", "dx": 2.5})
    state.apply({"type": "look", "dy": 1.5})
    state.apply(press("w"))
    control, _ = state.sample()
    assert (control.look_dx_px, control.look_dy_px) == (12.5, -2.5)
    # Deltas are consumed; held keys are not.
    again, _ = state.sample()
    assert (again.look_dx_px, again.look_dy_px) == (0.0, 0.0)
    assert again.keys == frozenset({"w"})


def test_look_limits_are_inclusive() -> None:
    state = ControlState()
    state.apply({"type": "look", "dx": MAX_LOOK_PX, "dy": -MAX_LOOK_PX})
    control, _ = state.sample()
    assert (control.look_dx_px, control.look_dy_px) == (MAX_LOOK_PX, -MAX_LOOK_PX)


def test_reset_pose_is_a_one_shot_flag() -> None:
    state = ControlState()
    state.apply(press("w"))
    state.apply({"type": "reset_pose", "seq": 2})
    control, reset = state.sample()
    assert reset is True
    assert control.keys == frozenset({"w"}) and control.seq == 2
    _, reset_again = state.sample()
    assert reset_again is False


def test_seq_tracks_the_last_applied_message() -> None:
    state = ControlState()
    assert state.sample()[0].seq is None
    state.apply(press("w", seq=1))
    state.apply({"type": "look", "dx": 1, "seq": 2})
    state.apply(release("w"))  # no seq: keeps the previous one
    assert state.sample()[0].seq == 2
    state.apply({"type": "control_state", "controls": ["d"], "seq": 7})
    state.apply({"type": "prompt", "text": "a forest", "seq": 8})  # ignored entirely
    control, _ = state.sample()
    assert control.seq == 7
    assert control.keys == frozenset({"d"})
    # A non-integer seq is not recorded.
    state.apply(press("a", seq="9"))
    assert state.last_seq == 7


@pytest.mark.parametrize(
    "message",
    [
        {"type": "prompt", "text": "hello"},
        {"type": "ping", "seq": 100},
        {"type": "stop"},
        {"type": "something_new", "key": 3, "action": "explode"},
        {"no_type": True},
    ],
)
def test_unknown_and_non_camera_types_are_ignored(message: dict) -> None:
    state = ControlState()
    state.apply(press("w", seq=1))
    state.apply(message)
    assert state.held == {"w"}
    assert state.last_seq == 1
    control, reset = state.sample()
    assert (control.look_dx_px, control.look_dy_px, reset) == (0.0, 0.0, False)


@pytest.mark.parametrize(
    "message",
    [
        {"type": "control", "key": 87, "action": "press"},
        {"type": "control", "key": None, "action": "press"},
        {"type": "control", "action": "press"},
        {"type": "control", "key": "w", "action": "hold"},
        {"type": "control", "key": "w"},
        {"type": "control", "key": "w", "action": "PRESS"},
        {"type": "control_state", "controls": "wasd"},
        {"type": "control_state", "controls": None},
        {"type": "control_state"},
        {"type": "control_state", "controls": ["w", 1]},
        {"type": "look", "dx": math.nan, "dy": 0},
        {"type": "look", "dx": 0, "dy": math.inf},
        {"type": "look", "dx": -math.inf},
        {"type": "look", "dx": MAX_LOOK_PX + 1},
        {"type": "look", "dy": -1e9},
        {"type": "look", "dx": "5"},
        {"type": "look", "dx": None},
    ],
)
def test_bad_messages_raise_and_leave_state_unchanged(message: dict) -> None:
    state = ControlState()
    state.apply(press("w", seq=1))
    state.apply({"type": "look", "dx": 3, "dy": 4, "seq": 2})
    with pytest.raises(ControlError):
        state.apply({**message, "seq": 99})
    assert state.held == {"w"}
    assert state.last_seq == 2
    control, _ = state.sample()
    assert (control.look_dx_px, control.look_dy_px) == (3.0, 4.0)


def test_control_error_is_a_value_error() -> None:
    assert issubclass(ControlError, ValueError)
