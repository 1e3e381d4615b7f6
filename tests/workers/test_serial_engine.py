"""The serial reference engine: causality, determinism, input checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.controls import ChunkControl
from workers.images import ImageError
from workers.serial_engine import SerialEngine

IMAGE = (np.random.default_rng(0).random((96, 160, 3)) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def engine() -> SerialEngine:
    # Compared only with itself: any thread count keeps the contract, so use every core.
    return SerialEngine.load("tiny", cpu_threads=torch.get_num_threads())


def run(engine: SerialEngine, controls: list[list[str]], seed: int = 0) -> list[np.ndarray]:
    session = engine.create_session(IMAGE, "a test world", seed=seed)
    out = [session.step(ChunkControl.from_keys(keys)).frames for keys in controls]
    session.close()
    return out


@pytest.mark.heavy
def test_changing_chunk_k_controls_changes_no_earlier_frame(engine: SerialEngine) -> None:
    a = run(engine, [["w"], ["w"], ["w"]])
    b = run(engine, [["w"], ["w"], ["l"]])
    assert [len(f) for f in a] == [13, 16, 16]
    assert a[0].shape[1:] == (128, 128, 3) and a[0].dtype == np.uint8
    for k in range(2):
        assert np.array_equal(a[k], b[k]), f"chunk {k} changed when only chunk 2's controls did"
    assert not np.array_equal(a[2], b[2]), "chunk 2's controls did not affect chunk 2"


@pytest.mark.heavy
def test_same_seed_same_frames_other_seed_other_frames(engine: SerialEngine) -> None:
    a = run(engine, [["d"]], seed=3)
    b = run(engine, [["d"]], seed=3)
    c = run(engine, [["d"]], seed=4)
    assert np.array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


@pytest.mark.heavy
def test_frames_are_not_degenerate(engine: SerialEngine) -> None:
    frames = run(engine, [[]])[0]
    assert frames.std() > 1.0  # not a constant image
    assert not np.array_equal(frames[0], frames[-1])


def test_closed_session_refuses_work(engine: SerialEngine) -> None:
    session = engine.create_session(IMAGE, "", seed=0)
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        session.step(ChunkControl())


def test_bad_inputs_fail_clearly(engine: SerialEngine, tmp_path) -> None:
    with pytest.raises(ValueError, match="chunk_latent_frames"):
        engine.create_session(IMAGE, "", chunk_latent_frames=0)
    with pytest.raises(ValueError, match="attention window"):
        engine.create_session(IMAGE, "", chunk_latent_frames=50)
    bad = tmp_path / "not-an-image.png"
    bad.write_bytes(b"definitely not a png")
    with pytest.raises(ImageError, match="not an image"):
        engine.create_session(bad, "")
    with pytest.raises(ImageError, match="not found"):
        engine.create_session(tmp_path / "missing.png", "")
