"""Control traces: parsing, cumulative delays, and replay on the media clock."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from benchmarks.replay import DEFAULT_TRACE
from benchmarks.trace import Trace, TraceReplayer


def _event(delay: float, message: dict) -> dict:
    return {"delay_s": delay, "message": message}


def _press(key: str, seq: int) -> dict:
    return {"type": "control", "key": key, "action": "press", "seq": seq}


def _release(key: str, seq: int) -> dict:
    return {"type": "control", "key": key, "action": "release", "seq": seq}


def test_delays_accumulate_from_the_previous_event() -> None:
    trace = Trace.parse(
        {
            "events": [
                _event(0.5, _press("w", 1)),
                _event(0.0, _press("l", 2)),
                _event(1.25, _release("w", 3)),
                {"message": {"type": "look", "dx": 1}},  # delay_s defaults to 0
                _event(2, _release("l", 5)),
            ]
        }
    )
    assert [e.at_s for e in trace.events] == [0.5, 0.5, 1.75, 1.75, 3.75]
    assert trace.duration_s == 3.75
    assert trace.events[2].message == _release("w", 3)


def test_empty_trace() -> None:
    trace = Trace.parse({"events": []})
    assert trace.events == () and trace.duration_s == 0.0
    control, reset = TraceReplayer(trace).control_at(100.0)
    assert control.keys == frozenset() and control.seq is None and reset is False


def test_control_at_applies_events_at_or_before_t() -> None:
    trace = Trace.parse(
        {
            "events": [
                _event(1.0, _press("w", 1)),
                _event(1.0, _press("l", 2)),
                _event(0.5, _release("w", 3)),
            ]
        }
    )
    replayer = TraceReplayer(trace)
    control, _ = replayer.control_at(0.0)
    assert control.keys == frozenset() and control.seq is None
    control, _ = replayer.control_at(0.999)
    assert control.keys == frozenset()
    control, _ = replayer.control_at(1.0)  # exactly at the event: applied
    assert control.keys == frozenset({"w"}) and control.seq == 1
    control, _ = replayer.control_at(2.4)
    assert control.keys == frozenset({"w", "l"}) and control.seq == 2
    control, _ = replayer.control_at(10.0)
    assert control.keys == frozenset({"l"}) and control.seq == 3


def test_skipping_ahead_applies_every_event_in_between() -> None:
    trace = Trace.parse(
        {
            "events": [
                _event(0.1, {"type": "look", "dx": 5, "dy": 1, "seq": 1}),
                _event(0.1, {"type": "look", "dx": 7, "dy": -3, "seq": 2}),
                _event(0.1, {"type": "reset_pose", "seq": 3}),
                _event(0.1, {"type": "look", "dx": 100, "seq": 4}),
            ]
        }
    )
    replayer = TraceReplayer(trace)
    control, reset = replayer.control_at(0.35)
    assert (control.look_dx_px, control.look_dy_px) == (12.0, -2.0)
    assert reset is True and control.seq == 3
    # Look deltas and the reset flag were consumed by the chunk that took them.
    control, reset = replayer.control_at(0.35)
    assert (control.look_dx_px, reset) == (0.0, False)
    control, reset = replayer.control_at(0.4)
    assert (control.look_dx_px, reset, control.seq) == (100.0, False, 4)


def test_bad_message_in_a_trace_fails_when_it_loads() -> None:
    with pytest.raises(ValueError, match=r"trace event 0: control: action"):
        Trace.parse({"events": [_event(0.0, {"type": "control", "key": "w", "action": "hold"})]})


@pytest.mark.parametrize(
    "data",
    [
        [],
        "events",
        None,
        {},
        {"events": None},
        {"events": {"0": _event(0, _press("w", 1))}},
        {"events": [_event(0, _press("w", 1)), {"delay_s": 1.0}]},
        {"events": [{"delay_s": 1.0, "message": "press w"}]},
        {"events": ["press w"]},
        {"events": [_event(-0.5, _press("w", 1))]},
        {"events": [_event(math.nan, _press("w", 1))]},
        {"events": [_event(math.inf, _press("w", 1))]},
        {"events": [_event("1.0", _press("w", 1))]},
        {"events": [_event(None, _press("w", 1))]},
    ],
)
def test_invalid_traces_raise_value_error(data: object) -> None:
    with pytest.raises(ValueError):
        Trace.parse(data)


def test_load_reads_json(tmp_path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"events": [_event(0.25, _press("ArrowUp", 1))]}))
    trace = Trace.load(path)
    assert trace.events[0].at_s == 0.25
    assert TraceReplayer(trace).control_at(0.25)[0].keys == frozenset({"w"})


def test_default_trace_parses_and_replays() -> None:
    trace = Trace.load(DEFAULT_TRACE)
    assert len(trace.events) == 12
    assert trace.duration_s == pytest.approx(12.0)
    assert [e.message.get("seq") for e in trace.events] == list(range(1, 13))

    replayer = TraceReplayer(trace)
    expected = [
        (0.0, {"w"}, 1, 0.0),
        (1.9, {"w"}, 1, 0.0),
        (2.0, {"j"}, 3, 0.0),
        (3.5, {"l"}, 5, 0.0),
        (6.5, {"d"}, 7, 0.0),  # ArrowRight
        (8.0, set(), 9, -60.0),  # released, then a look up
        (8.5, set(), 9, 0.0),
        (9.0, {"w", "a"}, 10, 0.0),
        (11.0, set(), 11, 0.0),
        (12.0, set(), 11, 0.0),  # "stop" does not touch the controls
    ]
    for t, keys, seq, look_dy in expected:
        control, reset = replayer.control_at(t)
        assert control.keys == frozenset(keys), t
        assert control.seq == seq, t
        assert control.look_dy_px == look_dy, t
        assert reset is False


def test_random_walk_is_seeded_and_falls_at_random_phases() -> None:
    a, b = Trace.random_walk(120.0, seed=3), Trace.random_walk(120.0, seed=3)
    assert a == b and a != Trace.random_walk(120.0, seed=4)
    times = [e.at_s for e in a.events]
    gaps = [y - x for x, y in itertools.pairwise(times)]
    assert all(0.6 <= g <= 1.8 for g in gaps) and times[-1] >= 119.0 - 1.8
    phases = [t % 1.0 for t in times]  # against 1 s chunks: spread over the whole period
    assert min(phases) < 0.1 and max(phases) > 0.9 and 0.35 < sum(phases) / len(phases) < 0.65
    assert all(e.message["type"] == "control_state" for e in a.events)
    TraceReplayer(a).control_at(60.0)  # every message is a valid control
