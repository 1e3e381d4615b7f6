"""The dispatch rules alone: what a stage does next for one session, within the scheduler's bounds."""

from __future__ import annotations

import numpy as np

from workers.controls import ChunkControl
from workers.runtime.chunk_rules import ChunkRules, Schedule, next_work
from workers.runtime.messages import DecodeChunk, DenoiseChunk, EncodeChunk, Stage, TakeSnapshot
from workers.runtime.scheduled_session import Hold, PendingSnapshot, Session, SessionSpec, SessionState

PIPELINED = ChunkRules(Schedule.PIPELINED, prefetch_chunks=2, edge_capacity=2)
WALK = ChunkControl.from_keys(("w",))


def running(source=lambda k: (WALK, False)) -> Session:
    spec = SessionSpec(
        "s", 1, 0, 4, np.zeros((8, 8, 3), np.uint8), "", source, on_chunk=lambda _: None, on_end=lambda *_: None
    )
    return Session(spec, state=SessionState.RUNNING)


def test_encode_runs_ahead_of_the_dit_by_the_prefetch_bound() -> None:
    s = running()
    first, second = next_work(PIPELINED, Stage.ENCODE, s, 0.0), None
    s.encoded.append((0, "cond0"))
    second = next_work(PIPELINED, Stage.ENCODE, s, 0.1)
    s.encoded.append((1, "cond1"))
    assert isinstance(first, EncodeChunk) and isinstance(second, EncodeChunk)
    assert (first.chunk_index, second.chunk_index) == (0, 1)
    assert next_work(PIPELINED, Stage.ENCODE, s, 0.2) is None  # two conditions wait for the DiT
    assert s.record(0).stages[Stage.ENCODE].ready_t == 0.0


def test_the_dit_samples_the_control_when_it_starts_and_hands_on_a_hold() -> None:
    asked: list[int] = []
    answers = iter([Hold(0.05), (WALK, False)])

    def source(k: int) -> tuple[ChunkControl, bool] | Hold | None:
        asked.append(k)
        return next(answers)

    s = running(source)
    assert next_work(PIPELINED, Stage.DIT, s, 0.0) is None and asked == []  # nothing encoded yet: not asked
    s.encoded.append((0, "cond0"))
    assert next_work(PIPELINED, Stage.DIT, s, 0.1) == Hold(0.05)
    work = next_work(PIPELINED, Stage.DIT, s, 0.2)
    assert isinstance(work, DenoiseChunk) and (work.chunk_index, work.control) == (0, WALK)
    assert asked == [0, 0] and s.next_dit == 1 and s.record(0).control == WALK


def test_the_dit_waits_while_decode_has_its_fill_and_decode_takes_the_oldest() -> None:
    s = running()
    s.encoded.append((2, "cond2"))
    s.next_dit = 2
    s.denoised.extend([(0, "lat0"), (1, "lat1")])
    assert next_work(PIPELINED, Stage.DIT, s, 0.0) is None  # two latents wait for decode
    work = next_work(PIPELINED, Stage.DECODE, s, 0.0)
    assert isinstance(work, DecodeChunk) and (work.chunk_index, work.latents) == (0, "lat0")
    assert isinstance(next_work(PIPELINED, Stage.DIT, s, 0.1), DenoiseChunk)


def test_a_snapshot_comes_first_at_its_boundary_once_per_stage() -> None:
    s = running()
    s.snapshot = PendingSnapshot("snap", boundary=0)
    taken = next_work(PIPELINED, Stage.ENCODE, s, 0.0)
    assert isinstance(taken, TakeSnapshot) and taken.snapshot_id == "snap"
    assert isinstance(next_work(PIPELINED, Stage.ENCODE, s, 0.0), EncodeChunk)  # then the chunk


def test_serial_starts_a_chunk_only_once_the_last_is_out() -> None:
    serial = ChunkRules(Schedule.SERIAL, prefetch_chunks=1, edge_capacity=2)
    s = running()
    assert isinstance(next_work(serial, Stage.ENCODE, s, 0.0), EncodeChunk)
    assert next_work(serial, Stage.ENCODE, s, 0.1) is None  # nothing waits for the DiT: chunk 0 is not out
    s.chunks_out = 1  # chunk 0's frames are out
    work = next_work(serial, Stage.ENCODE, s, 0.2)
    assert isinstance(work, EncodeChunk) and work.chunk_index == 1
