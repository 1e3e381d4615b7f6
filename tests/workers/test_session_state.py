"""Snapshots of the in-process engine: a branch continues bit for bit, and branches are independent."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.controls import ChunkControl
from workers.serial_engine import SerialEngine, SerialSession
from workers.session_state import StateCaptureError, StatePart, capture, restore, state_nbytes

IMAGE = (np.random.default_rng(1).random((128, 128, 3)) * 255).astype(np.uint8)
WALK = [["w"], ["w", "d"], ["a"], ["s"], ["w"], ["l"], ["r"], []]
OTHER = [["s"], ["s", "a"]]


def steps(session: SerialSession, keys: list[list[str]]) -> list[np.ndarray]:
    return [session.step(ChunkControl.from_keys(k)).frames for k in keys]


# The trained model and the random one share every class; the second runs on purpose (-m slow).
@pytest.fixture(scope="module", params=["gridworld", pytest.param("tiny", marks=pytest.mark.slow)])
def engine(request: pytest.FixtureRequest) -> SerialEngine:
    return SerialEngine.load(request.param)


@pytest.fixture(scope="module")
def gridworld() -> SerialEngine:
    """For what one model shows: the bit-exact branch runs on both."""
    return SerialEngine.load("gridworld")


@pytest.mark.heavy
@pytest.mark.parametrize(
    "taken_after", [1, pytest.param(5, marks=pytest.mark.long)], ids=["early", "after-window-roll"]
)
def test_branch_continues_bit_exact(engine: SerialEngine, taken_after: int) -> None:
    """The window holds 12 latent frames of 4-frame chunks: after 5 chunks it has rolled."""
    session = engine.create_session(IMAGE, "a walk", seed=7)
    steps(session, WALK[:taken_after])
    saved = engine.snapshot(session)
    then = WALK[taken_after : taken_after + 3]
    original = steps(session, then)
    again = engine.branch(saved)
    assert [np.array_equal(a, b) for a, b in zip(steps(again, then), original, strict=True)] == [True] * 3
    assert again.chunks_done == session.chunks_done and again.frames_done == session.frames_done


@pytest.mark.heavy
def test_branches_are_independent(gridworld: SerialEngine) -> None:
    session = gridworld.create_session(IMAGE, "a walk", seed=7)
    steps(session, WALK[:2])
    saved = gridworld.snapshot(session)
    left, right = gridworld.branch(saved), gridworld.branch(saved)
    other = steps(left, OTHER)
    same = steps(right, WALK[2:4])
    assert not any(np.array_equal(a, b) for a, b in zip(other, same, strict=True))
    # The original, stepped after both branches ran, is untouched by them.
    assert all(np.array_equal(a, b) for a, b in zip(steps(session, WALK[2:4]), same, strict=True))


@pytest.mark.heavy
def test_snapshot_is_on_the_host_and_sized(gridworld: SerialEngine) -> None:
    session = gridworld.create_session(IMAGE, "", seed=0)
    steps(session, WALK[:1])
    saved = gridworld.snapshot(session)
    assert all(t.device.type == "cpu" for t in saved.tensors)
    kv = session.denoise.kv_cache.nbytes() if hasattr(session.denoise, "kv_cache") else 0
    assert saved.nbytes > kv > 0


@pytest.mark.heavy
def test_spilled_part_restores_the_same(gridworld: SerialEngine, tmp_path) -> None:
    session = gridworld.create_session(IMAGE, "", seed=3)
    steps(session, WALK[:2])
    gridworld.snapshot(session).save(tmp_path / "part")
    original = steps(session, WALK[2:4])
    back = gridworld.branch(StatePart.load(tmp_path / "part"))
    assert all(np.array_equal(a, b) for a, b in zip(steps(back, WALK[2:4]), original, strict=True))


def test_capture_refuses_an_unnamed_module() -> None:
    holder = {"layer": torch.nn.Linear(2, 2)}
    with pytest.raises(StateCaptureError, match="Linear"):
        capture(holder, {})
    assert capture(holder, {"layer": holder["layer"]}).tensors == ()


def test_capture_into_host_memory_restores_every_dtype_and_shape(tmp_path) -> None:
    """Copied into one buffer it is given: every tensor a view of it, at an aligned offset; the part
    restores equal, saves and loads equal, and is independent of the session it was taken from."""
    shared_tensor = torch.arange(5, dtype=torch.int64)
    state = {
        "kv": torch.randn(3, 4, 5),
        "mask": torch.tensor([True, False, True]),
        "step": torch.tensor(7, dtype=torch.int16),
        "empty": torch.empty(0, 3),
        "a": shared_tensor,
        "b": shared_tensor,  # referenced twice: copied once, restored as one tensor
        "strided": torch.arange(12.0).view(3, 4).t(),
    }
    given: list[torch.Tensor] = []

    def host_memory(nbytes: int) -> torch.Tensor:
        given.append(torch.full((nbytes,), 255, dtype=torch.uint8))
        return given[-1]

    part = capture(state, {}, host_memory)
    assert len(given) == 1 and len(part.tensors) == 6
    base = given[0].data_ptr()
    at = [t.data_ptr() - base for t in part.tensors if t.numel()]
    assert len(at) == 5 and all(0 <= a < len(given[0]) and a % 64 == 0 for a in at), at
    kv = state["kv"].clone()
    state["kv"].add_(1.0)  # the session goes on: the part keeps the state as it was taken
    back = restore(part, {}, torch.device("cpu"))
    assert torch.equal(back["kv"], kv)
    for key in ("mask", "step", "empty", "a", "strided"):
        assert back[key].dtype == state[key].dtype and torch.equal(back[key], state[key]), key
    assert back["a"] is back["b"]
    part.save(tmp_path / "part")
    loaded = restore(StatePart.load(tmp_path / "part"), {}, torch.device("cpu"))
    assert torch.equal(loaded["strided"], state["strided"]) and torch.equal(loaded["mask"], state["mask"])
    assert state_nbytes(state, {}) == len(given[0])


def test_branch_refuses_another_models_snapshot() -> None:
    tiny, grid = SerialEngine.load("tiny"), SerialEngine.load("gridworld")
    session = tiny.create_session(IMAGE, "", seed=0)
    with pytest.raises(ValueError, match="gridworld"):
        grid.branch(tiny.snapshot(session))
