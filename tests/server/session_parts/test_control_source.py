"""The control source (server/session/control_source.py) on its own: controls fold in on the loop, a chunk that
starts takes what is held then (and the recording hears of it), the dispatcher's verdicts come back as
the scheduler's answers, and control arrivals are claimed once, by the first chunk that applied them."""

from __future__ import annotations

import time

from server.session.control_source import ControlSource
from server.wire.dispatch import DispatchConfig, DispatchPolicy
from workers.controls import ChunkControl, ControlMsg, LookMsg
from workers.runtime.scheduled_session import Hold


class TakenLog:
    """Test double for the recording's hook: what each chunk took."""

    def __init__(self) -> None:
        self.taken: list[tuple[int, ChunkControl, bool]] = []

    def __call__(self, index: int, control: ChunkControl, reset: bool) -> None:
        self.taken.append((index, control, reset))


def source(policy: DispatchPolicy = DispatchPolicy.JIT) -> tuple[ControlSource, TakenLog]:
    log = TakenLog()
    return ControlSource(DispatchConfig(policy, fps=16, chunk_latent_frames=3), on_taken=log), log


def test_a_starting_chunk_takes_the_held_controls_and_the_recording_hears_of_it() -> None:
    controls, log = source()
    now = time.monotonic()
    controls.apply(ControlMsg(type="control", key="w", action="press", seq=1), now)
    controls.apply(LookMsg(type="look", dx=12.0, dy=0.0, seq=2), now)
    answer = controls.sample(0)
    assert isinstance(answer, tuple)
    control, reset = answer
    assert control.keys == frozenset({"w"}) and control.look_dx_px == 12.0 and control.seq == 2 and not reset
    assert log.taken == [(0, control, False)]
    assert controls.last_control_t == now


def test_the_dispatchers_no_and_not_yet_reach_the_scheduler() -> None:
    controls, log = source()
    assert isinstance(controls.sample(0), tuple)
    assert isinstance(controls.sample(1), tuple)  # two chunks may be in flight
    assert controls.sample(2) is None  # blocked: ask on the next pass; nothing was taken
    assert [i for i, _, _ in log.taken] == [0, 1]
    now = time.monotonic()
    controls.pushed(1, 12, now, playout_end_t=now + 10.0)  # measured, with 10 s of video ahead
    later = controls.sample(2)
    assert isinstance(later, Hold) and later.retry_in_s > 5  # just in time: not yet
    assert [i for i, _, _ in log.taken] == [0, 1]
    assert controls.latency_of(1) is not None and controls.latency_of(0) is None
    synchronous, _ = source(DispatchPolicy.CHUNK_SYNCHRONOUS)
    assert isinstance(synchronous.sample(0), tuple)
    assert synchronous.sample(1) is None  # the previous chunk is not in the pacer yet


def test_arrivals_are_claimed_once_by_the_first_chunk_that_applied_them() -> None:
    controls, _ = source()
    for seq, t in ((1, 10.0), (2, 10.5), (3, 11.0)):
        controls.apply(ControlMsg(type="control", key="a", action="press", seq=seq), t)
    assert controls.arrivals_applied_by(None) == []
    assert controls.arrivals_applied_by(2) == [10.0, 10.5]
    assert controls.arrivals_applied_by(2) == []
    assert controls.arrivals_applied_by(5) == [11.0]


def test_a_rewind_restarts_dispatch_and_keeps_the_held_keys() -> None:
    controls, _ = source()
    controls.apply(ControlMsg(type="control", key="d", action="press", seq=7), time.monotonic())
    assert isinstance(controls.sample(0), tuple) and isinstance(controls.sample(1), tuple)
    assert controls.sample(2) is None
    controls.restart_dispatch()  # the chunks in flight belonged to the abandoned future
    answer = controls.sample(2)
    assert isinstance(answer, tuple) and answer[0].keys == frozenset({"d"})
    assert controls.stats(time.monotonic()).chunks_in_flight == 1
