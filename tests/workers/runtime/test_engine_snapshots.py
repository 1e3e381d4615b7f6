"""Snapshots on the multi-process pipeline: a branch from a snapshot continues bit for bit, however
far the stages were apart when it was taken, and the budget keeps, spills or evicts as it says."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest

from tests.support.engine import IMAGE, PROMPT, Collector, assert_idle, control_source
from workers.models.presets import get_preset
from workers.runtime.engine import PipelineEngine
from workers.runtime.memory_plan import machine_capacity, plan_memory
from workers.runtime.placement import PLACEMENTS
from workers.runtime.scheduled_session import ControlSource
from workers.runtime.snapshot_catalog import SnapshotBudget, SnapshotEntry, SnapshotGone, Where

pytestmark = pytest.mark.processes
WALK = [["w"], ["w", "d"], ["a"], ["s"], ["l"], ["r"], [], ["w"], ["d"], ["w", "a"]]


def gated(gate: threading.Event, hold_from: int) -> ControlSource:
    """WALK's controls by absolute chunk index, holding chunk `hold_from` until `gate` is set."""
    walk = control_source(WALK)

    def source(index: int):
        if index >= hold_from and not gate.is_set():
            return None
        return walk(index)

    return source


def snapshot_now(
    engine: PipelineEngine, session_id: str, then: threading.Event | None = None
) -> tuple[SnapshotEntry | None, str | None]:
    """Ask for a snapshot, set `then` (the stages behind the boundary may need to move on to reach it),
    and wait for the answer."""
    box: queue.Queue = queue.Queue()
    engine.take_snapshot(session_id, lambda entry, error: box.put((entry, error)))
    if then is not None:
        then.set()
    return box.get(timeout=120)


def run_with_snapshot(engine: PipelineEngine, hold_from: int, extra: int) -> tuple[SnapshotEntry, list[np.ndarray]]:
    """A session held before chunk `hold_from`, saved there, then run `extra` chunks past the snapshot."""
    gate = threading.Event()
    c = Collector()
    sid = engine.open_session(IMAGE, PROMPT, 5, gated(gate, hold_from), c.on_chunk, c.on_end, max_chunks=99)
    frames: list[np.ndarray] = []

    def more() -> None:
        kind, value = c.events.get(timeout=120)
        assert kind == "chunk", value
        frames.append(value.frames)

    while len(frames) < hold_from:  # every chunk before the hold is out
        more()
    entry, error = snapshot_now(engine, sid, then=gate)
    assert entry is not None, error
    # Encode runs ahead of the DiT: the boundary is where the furthest stage stood, not where the DiT did.
    assert entry.chunk_index > hold_from
    while len(frames) < entry.chunk_index + extra:
        more()
    engine.close_session(sid)
    c.collect()
    return entry, frames


def branch(engine: PipelineEngine, entry: SnapshotEntry, chunks: int, controls=WALK) -> list[np.ndarray]:
    c = Collector()
    engine.open_session(
        IMAGE, "", 0, control_source(controls), c.on_chunk, c.on_end, max_chunks=chunks, snapshot=entry.snapshot_id
    )
    out, error = c.collect()
    assert error is None, error
    assert [o.index for o in out] == list(range(entry.chunk_index, entry.chunk_index + chunks))
    return [o.frames for o in out]


# The trained model and the random one share every class; the second runs on purpose (-m slow).
@pytest.fixture(scope="module", params=["gridworld", pytest.param("tiny", marks=pytest.mark.slow)])
def engine(request: pytest.FixtureRequest):
    with PipelineEngine(request.param, PLACEMENTS["cpu"], "pipelined", max_sessions=3) as engine:
        yield engine


@pytest.mark.parametrize("hold_from", [1, pytest.param(5, marks=pytest.mark.long)], ids=["early", "after-window-roll"])
def test_branch_reproduces_the_original_bit_exact(engine: PipelineEngine, hold_from: int) -> None:
    entry, original = run_with_snapshot(engine, hold_from, extra=2)
    again = branch(engine, entry, 2)
    b = entry.chunk_index
    assert [np.array_equal(x, y) for x, y in zip(again, original[b:], strict=True)] == [True, True]
    # Any number of branches, each independent: another control line differs, the same one again does not.
    other = branch(engine, entry, 2, controls=[["s"]] * len(WALK))
    assert not np.array_equal(other[1], original[b + 1])
    assert all(np.array_equal(x, y) for x, y in zip(branch(engine, entry, 2), original[b:], strict=True))
    engine.drop_snapshot(entry.snapshot_id)
    assert_idle(engine)


@pytest.mark.long
def test_snapshot_taken_while_another_session_runs(engine: PipelineEngine) -> None:
    if engine.preset.name != "gridworld":
        pytest.skip("one model shows it; the bit-exact branch runs on both")
    other = Collector()
    engine.open_session(IMAGE, PROMPT, 9, control_source(), other.on_chunk, other.on_end, max_chunks=8)
    entry, original = run_with_snapshot(engine, 2, extra=2)
    chunks, error = other.collect()
    assert error is None and len(chunks) == 8
    after = original[entry.chunk_index :]
    assert all(np.array_equal(x, y) for x, y in zip(branch(engine, entry, 2), after, strict=True))
    engine.drop_snapshot(entry.snapshot_id)
    assert_idle(engine)


def test_snapshot_of_an_ended_session_says_why(engine: PipelineEngine) -> None:
    if engine.preset.name != "gridworld":
        pytest.skip("one model shows it")
    c = Collector()
    sid = engine.open_session(IMAGE, PROMPT, 1, control_source(), c.on_chunk, c.on_end, max_chunks=1)
    c.collect()
    entry, error = snapshot_now(engine, sid)
    assert entry is None and "only a running session can be saved" in (error or "")


@pytest.mark.long
def test_budget_refuses_evicts_and_spills(tmp_path) -> None:
    # A snapshot of the first chunks, before the condition encoder's fixed point, as the plan counts it.
    size = plan_memory(get_preset("tiny"), PLACEMENTS["cpu"], 1, machine_capacity()).snapshot_bytes
    # Room for one snapshot in memory, one spilled to disk.
    budget = SnapshotBudget(memory_bytes=int(size * 1.5), spill_dir=tmp_path, spill_bytes=int(size * 1.5))
    with PipelineEngine("tiny", PLACEMENTS["cpu"], "pipelined", snapshot_budget=budget) as engine:
        first, original = run_with_snapshot(engine, 2, extra=2)
        second, _ = run_with_snapshot(engine, 3, extra=0)
        assert engine.snapshots.get(first.snapshot_id).where is Where.DISK
        assert engine.snapshots.get(second.snapshot_id).where is Where.MEMORY
        assert any(tmp_path.glob(f"{first.snapshot_id}/*.safetensors"))
        # From disk, still bit-exact.
        b = first.chunk_index
        assert all(np.array_equal(x, y) for x, y in zip(branch(engine, first, 2), original[b:], strict=True))
        third, _ = run_with_snapshot(engine, 2, extra=0)  # second to disk, first out
        with pytest.raises(SnapshotGone, match="evicted"):
            engine.snapshots.get(first.snapshot_id)
        with pytest.raises(SnapshotGone, match="evicted"):
            branch(engine, first, 1)
        assert not (tmp_path / first.snapshot_id).exists()
        assert engine.snapshots.get(third.snapshot_id).where is Where.MEMORY
    assert not any(tmp_path.iterdir()), "the spill directory is emptied at shutdown"

    with PipelineEngine(
        "tiny", PLACEMENTS["cpu"], "pipelined", snapshot_budget=SnapshotBudget(memory_bytes=size // 2)
    ) as small:
        gate = threading.Event()
        c = Collector()
        sid = small.open_session(IMAGE, PROMPT, 5, gated(gate, 1), c.on_chunk, c.on_end)
        c.events.get(timeout=120)
        entry, error = snapshot_now(small, sid, then=gate)
        assert entry is None and "over the" in (error or "") and "budget" in (error or "")
        small.close_session(sid)
        c.collect()
        assert_idle(small)


@pytest.mark.slow  # six workers on two cores for half a minute: run on purpose (pytest -m slow)
def test_branch_on_multi_rank_stages_is_bit_exact() -> None:
    """Two DiT ranks (Ulysses) and two decode ranks (height-sharded): each rank saves and restores its own part."""
    with PipelineEngine("tiny", PLACEMENTS["cpu-sp2"], "pipelined") as engine:
        entry, original = run_with_snapshot(engine, 1, extra=2)
        after = original[entry.chunk_index :]
        assert all(np.array_equal(x, y) for x, y in zip(branch(engine, entry, 2), after, strict=True))
        engine.drop_snapshot(entry.snapshot_id)
        assert_idle(engine)
