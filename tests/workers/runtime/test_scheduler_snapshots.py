"""Snapshots in the scheduler, driven with synthetic replies: every stage saves at one chunk boundary,
in its own lane's order; a failed part or an ended session fails the snapshot, not the session; a
session opened from a snapshot starts at its boundary on every stage."""

from __future__ import annotations

from tests.workers.runtime.test_scheduler import FakeWorkers, Viewer, make, open_session
from workers.runtime.messages import (
    DecodeChunk,
    DenoiseChunk,
    EncodeChunk,
    OpenSession,
    SnapshotTaken,
    Stage,
    TakeSnapshot,
)

CHUNK = (EncodeChunk, DenoiseChunk, DecodeChunk)


def stage_log(fw: FakeWorkers, stage: Stage) -> list[str | int]:
    """What a stage was sent for the session, in order: chunk indices, and "snap" for a snapshot."""
    return [
        "snap" if isinstance(c, TakeSnapshot) else c.chunk_index
        for s, c in fw.sent
        if s is stage and isinstance(c, TakeSnapshot | EncodeChunk | DenoiseChunk | DecodeChunk)
    ]


def run_until(fw: FakeWorkers, done, max_steps: int = 500) -> None:
    """Dispatch and answer, downstream first, until `done()` holds between two answers."""
    for _ in range(max_steps):
        fw.step()
        for stage in (Stage.DECODE, Stage.DIT, Stage.ENCODE):
            if done():
                return
            if stage in fw.computing:
                fw.finish(stage)
    raise AssertionError("never happened")


def test_every_stage_saves_between_the_same_two_chunks() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer, max_chunks=8)
    run_until(fw, lambda: len([p for p in viewer.parts if p.last]) >= 1)
    fw.run(fw.sched.snapshot(spec.id, "snap1"))
    run_until(fw, lambda: fw.snapshots)
    (done,) = fw.snapshots
    b = done.chunk_index
    assert done.error is None and done.session is spec and b >= 2
    assert done.nbytes == {Stage.ENCODE: 100, Stage.DIT: 100, Stage.DECODE: 100}
    for stage in Stage:
        log = stage_log(fw, stage)
        assert log.index("snap") == b, f"{stage.value}: {log}"  # after chunks 0..b-1, before chunk b
    fw.drain()
    assert viewer.ended == [None] and fw.handed_out == {}


def test_a_failed_part_fails_the_snapshot_not_the_session() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer, max_chunks=6)
    run_until(fw, lambda: viewer.parts)
    fw.run(fw.sched.snapshot(spec.id, "snap1"))
    run_until(fw, lambda: isinstance(fw.computing.get(Stage.ENCODE), TakeSnapshot))
    cmd = fw.computing[Stage.ENCODE]
    fw.reply(Stage.ENCODE, SnapshotTaken(Stage.ENCODE, 0, spec.id, spec.epoch, "snap1", 0, "out of memory"))
    assert [(d.snapshot_id, d.error) for d in fw.snapshots] == [("snap1", "out of memory")]
    assert isinstance(cmd, TakeSnapshot)
    fw.drain()
    assert viewer.ended == [None] and len([p for p in viewer.parts if p.last]) == 6
    # The stages that had not saved yet never got the command.
    assert "snap" not in stage_log(fw, Stage.DECODE)


def test_a_session_that_ends_first_fails_its_snapshot_and_a_second_request_waits_its_turn() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer)
    run_until(fw, lambda: viewer.parts)
    fw.run(fw.sched.snapshot(spec.id, "a"))
    fw.run(fw.sched.snapshot(spec.id, "b"))
    assert [(d.snapshot_id, d.error) for d in fw.snapshots] == [("b", "a snapshot of this session is being taken")]
    fw.run(fw.sched.close(spec.id))
    fw.drain()
    assert fw.snapshots[-1].snapshot_id == "a" and "ended before its state was saved" in (fw.snapshots[-1].error or "")
    fw.run(fw.sched.snapshot(spec.id, "c"))
    assert fw.snapshots[-1].session is None and "only a running session" in (fw.snapshots[-1].error or "")


def test_a_session_opened_from_a_snapshot_starts_at_its_boundary() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer, max_chunks=2, snapshot="snap1", first_chunk=5)
    fw.drain()
    opens = [(s, c) for s, c in fw.sent if isinstance(c, OpenSession)]
    assert {s for s, _ in opens} == set(Stage) and all(c.snapshot == "snap1" and c.image is None for _, c in opens)
    assert all(c.context is None for s, c in opens if s is Stage.DIT)  # its context K/V are in the snapshot
    assert [p.index for p in viewer.parts if p.last] == [5, 6] and viewer.ended == [None]
    sent = [c.chunk_index for _, c in fw.sent if isinstance(c, CHUNK) and c.session_id == spec.id]
    assert sorted(sent) == [5, 5, 5, 6, 6, 6]


def test_a_snapshot_asked_while_the_session_opens_is_taken_once_it_runs() -> None:
    fw, viewer = make(), Viewer()
    spec = open_session(fw, viewer, max_chunks=4, snapshot="earlier", first_chunk=3)
    fw.run(fw.sched.snapshot(spec.id, "snap1"))  # nothing has opened yet
    run_until(fw, lambda: fw.snapshots)
    (done,) = fw.snapshots
    assert done.error is None and done.chunk_index == 3  # the state it opened with
    fw.drain()
    assert viewer.ended == [None] and [p.index for p in viewer.parts if p.last] == [3, 4, 5, 6]
