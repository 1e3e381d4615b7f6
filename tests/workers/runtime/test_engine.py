"""The multi-process pipeline end to end: what only real worker processes can show.

The scheduler's policy (bounds, fairness, epochs, close order, slot bookkeeping) is tested without
processes in test_scheduler.py. These start real workers (spawn) with the tiny preset on the CPU,
a few seconds per engine, for what crosses process boundaries: bit-exact frames against the serial
engine through real channels (both schedules, and the sharded placement on real gloo ranks); each
session's state kept apart inside the workers under reordering; real shared-memory slots freed on
a close mid-flight; a worker's exception reaching only its session; a SIGKILLed worker noticed,
its segments removed and the stage restarted.
"""

from __future__ import annotations

import os
import signal

import pytest

from server.session.session import generation_failed_reason
from tests.support.engine import (
    CONTROLS,
    IMAGE,
    PROMPT,
    WAIT_S,
    Collector,
    assert_idle,
    control_source,
    reference_frames,
    run_session,
)
from tests.support.frames import assert_frames_close, assert_frames_equal
from tests.support.processes import pid_alive
from tests.support.waiting import wait_until
from workers.runtime.channel import leaked_segments
from workers.runtime.engine import PipelineEngine
from workers.runtime.messages import Stage
from workers.runtime.placement import PLACEMENTS
from workers.runtime.spec import FaultSpec

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def cpu_engine():
    engine = PipelineEngine("tiny", PLACEMENTS["cpu"], "pipelined", max_sessions=3)
    engine.start()
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("schedule", ["pipelined", pytest.param("serial", marks=pytest.mark.long)])
def test_pipeline_reproduces_serial_engine(schedule: str, cpu_engine: PipelineEngine) -> None:
    expected = reference_frames(seed=5, num_chunks=3)
    if schedule == "pipelined":
        got = run_session(cpu_engine, seed=5, num_chunks=3)
    else:
        with PipelineEngine("tiny", PLACEMENTS["cpu"], "serial") as engine:
            got = run_session(engine, seed=5, num_chunks=3)
            assert_idle(engine)
    assert_frames_equal(expected, got, f"{schedule} pipeline vs serial engine")


@pytest.mark.long
def test_sharded_placement_reproduces_serial_engine() -> None:
    expected = reference_frames(seed=6, num_chunks=3)
    with PipelineEngine("tiny", PLACEMENTS["cpu-sp2"], "pipelined") as engine:
        got = run_session(engine, seed=6, num_chunks=3)
        assert_idle(engine)
    # The height-sharded decode convolves bands instead of whole frames: bits may differ (the contract).
    assert_frames_close(expected, got, "sharded placement vs serial engine")


@pytest.mark.long
def test_concurrent_sessions_get_their_own_frames_in_order_under_random_delays() -> None:
    faults = {s: FaultSpec(max_delay_s=0.05, seed=i) for i, s in enumerate(Stage)}
    with PipelineEngine("tiny", PLACEMENTS["cpu"], "pipelined", faults=faults) as engine:
        collectors = {}
        for seed in (11, 12):
            c = Collector()
            engine.open_session(IMAGE, PROMPT, seed, control_source(CONTROLS), c.on_chunk, c.on_end, max_chunks=3)
            collectors[seed] = c
        results = {seed: c.collect() for seed, c in collectors.items()}
        assert_idle(engine)
    for seed, (chunks, error) in results.items():
        assert error is None, error
        assert [o.index for o in chunks] == [0, 1, 2]
        assert_frames_equal(reference_frames(seed, 3), [o.frames for o in chunks], f"session {seed}")


def test_close_mid_flight_leaves_nothing_behind(cpu_engine: PipelineEngine) -> None:
    c = Collector()
    sid = cpu_engine.open_session(IMAGE, "", 3, control_source(CONTROLS), c.on_chunk, c.on_end)  # unbounded
    kind, first = c.events.get(timeout=WAIT_S)
    assert kind == "chunk" and first.index == 0
    cpu_engine.close_session(sid)
    chunks, error = c.collect()
    assert error is None
    assert all(o.index > 0 for o in chunks)  # anything after the close request still came in order
    assert_idle(cpu_engine)


def test_worker_exception_fails_only_its_session(tmp_path) -> None:
    faults = {Stage.ENCODE: FaultSpec(chunk_index=1, message="boom in encode")}
    with PipelineEngine("tiny", PLACEMENTS["cpu"], "pipelined", faults=faults) as engine:
        bad = Collector()
        engine.open_session(IMAGE, "", 1, control_source(CONTROLS), bad.on_chunk, bad.on_end, max_chunks=3)
        chunks, error = bad.collect()
        assert error is not None and "encode stage" in error and "boom in encode" in error
        # The viewer is told which stage, not the exception (that stays in the log).
        told = generation_failed_reason(error)
        assert "encode stage (rank 0) stopped with an error" in told and "boom" not in told and "Error" not in told
        # Encode runs ahead, so chunk 1's failure may overtake chunk 0's frames: at most chunk 0 arrives.
        assert [o.index for o in chunks] in ([], [0])
        # The same workers keep serving other sessions.
        assert len(run_session(engine, seed=2, num_chunks=2)) == 2
        assert_idle(engine)
        assert engine.stats()["counters"]["worker_restarts"] == 0


@pytest.mark.long
def test_killed_worker_is_detected_and_replaced() -> None:
    # A slowed DiT makes sure there is a command in flight to kill.
    faults = {Stage.DIT: FaultSpec(max_delay_s=0.5)}
    with PipelineEngine("tiny", PLACEMENTS["cpu"], "pipelined", faults=faults) as engine:
        c = Collector()
        engine.open_session(IMAGE, "", 4, control_source(CONTROLS), c.on_chunk, c.on_end)  # unbounded
        kind, _ = c.events.get(timeout=WAIT_S)
        assert kind == "chunk"
        dit_pid = engine.worker_pids()["dit"][0]
        # Kill it mid-chunk, the hard case: its command never replies and its input slot is held.
        wait_until(lambda: engine.scheduler.lanes[Stage.DIT].assignment, 10, "a DiT command in flight", poll_s=0.005)
        os.kill(dit_pid, signal.SIGKILL)
        while True:
            kind, value = c.events.get(timeout=WAIT_S)
            if kind == "end":
                break
        # Noticed through the process sentinel or the pipe's EOF, which wake the scheduler at once;
        # there is no timeout path that could report it instead.
        assert value in ("dit worker died (killed or crashed)", "dit worker rank 0 exited unexpectedly"), value
        assert leaked_segments(dit_pid) == [], "the killed worker's slot files were not removed"
        # The stage restarts at once, without waiting for a session; new sessions get the fresh workers.
        wait_until(lambda: engine.healthy, WAIT_S, "the DiT stage to restart")
        assert len(run_session(engine, seed=2, num_chunks=2)) == 2
        assert engine.worker_pids()["dit"][0] != dit_pid
        assert engine.stats()["counters"]["worker_restarts"] >= 1
        pids = [p for ps in engine.worker_pids().values() for p in ps]
    for pid in pids:
        assert not pid_alive(pid), f"worker {pid} outlived shutdown"
    assert [seg for pid in pids for seg in leaked_segments(pid)] == []
