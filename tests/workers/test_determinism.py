"""The determinism contract is thread-aware: engines run model code at a stated thread count, and
runs at different counts agree within the one stated tolerance (bit equality at equal counts is
checked against the worker processes in tests/workers/runtime/test_engine.py and
tests/benchmarks/test_replay.py)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from tests.support.engine import CONTROLS, IMAGE, PROMPT, reference_frames
from tests.support.frames import assert_frames_close
from workers.controls import ChunkControl
from workers.determinism import FRAME_TOLERANCE, frame_difference, intra_op_threads
from workers.serial_engine import SerialEngine
from workers.stages.decode import DecodeSession
from workers.stages.denoise import DenoiseSession


@pytest.fixture
def two_ambient_threads() -> Iterator[None]:
    """The calling process runs torch on 2 threads (pytest's default on a 2-core machine)."""
    with intra_op_threads(2):
        yield


def test_intra_op_threads_sets_and_restores(two_ambient_threads: None) -> None:
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="at least 1"), intra_op_threads(0):
        pass


@pytest.mark.heavy
def test_in_process_engine_runs_at_its_thread_count_whatever_the_caller_uses(
    two_ambient_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int]] = []
    for cls, name in ((DenoiseSession, "denoise"), (DecodeSession, "decode")):
        original = cls.run_chunk

        def spy(self, *args, _original=original, _name=name):  # type: ignore[no-untyped-def]
            seen.append((_name, torch.get_num_threads()))
            return _original(self, *args)

        monkeypatch.setattr(cls, "run_chunk", spy)
    engine = SerialEngine.load("tiny")  # the default: the `cpu` placement's 1 thread per worker
    session = engine.create_session(IMAGE, PROMPT, seed=0)
    session.step(ChunkControl.from_keys(["w"]))
    assert seen == [("denoise", 1), ("decode", 1)]
    assert torch.get_num_threads() == 2  # the caller's count is back

    seen.clear()
    SerialEngine.load("tiny", cpu_threads=2).create_session(IMAGE, PROMPT, seed=0).step(ChunkControl.from_keys([]))
    assert seen == [("denoise", 2), ("decode", 2)]
    with pytest.raises(ValueError, match="cpu_threads"):
        SerialEngine.load("tiny", cpu_threads=0)


@pytest.mark.heavy
def test_one_and_two_threads_agree_within_the_stated_tolerance() -> None:
    one = reference_frames(seed=5, num_chunks=2, controls=CONTROLS, cpu_threads=1)
    two = reference_frames(seed=5, num_chunks=2, controls=CONTROLS, cpu_threads=2)
    # Bit-exact on some CPUs (AMD EPYC), one step on a few values on others (Intel with AMX).
    assert_frames_close(one, two, "1 vs 2 intra-op threads")


def test_frame_difference_and_tolerance() -> None:
    a = np.zeros((2, 10, 10, 3), np.uint8)
    assert frame_difference(a, a).exact and frame_difference(a, a).within()
    b = a.copy()
    b[0, 0, 0, 0] = 1  # one value in 600 differs by one step
    diff = frame_difference(a, b)
    assert (diff.max_step, diff.fraction) == (1, 1 / 600) and diff.within(FRAME_TOLERANCE) and not diff.exact
    b[0, 0, 0, 0] = 2
    assert not frame_difference(a, b).within(FRAME_TOLERANCE)
    c = a.copy()
    c[0, :3] = 1  # 90 of 600 values: too many, although each is one step
    assert not frame_difference(a, c).within(FRAME_TOLERANCE)
    with pytest.raises(ValueError, match="uint8"):
        frame_difference(a, a.astype(np.int16))
    with pytest.raises(ValueError, match="shape"):
        frame_difference(a, a[:1])
