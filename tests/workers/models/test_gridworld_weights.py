"""The embedded presets' shipped weights (`gridworld`, the default, and `gridworld-4x`): strict
loading, determinism, and a generated world that answers the keys the way the renderer's world does."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from benchmarks.image_metrics import psnr_db
from workers.controls import ChunkControl
from workers.models import components, loading
from workers.models.presets import DEFAULT_PRESET, GRIDWORLD, GRIDWORLD_4X, ModelPreset
from workers.serial_engine import SerialEngine
from workers.training.clips import WORLD_SEED, ClipSpec, render_clip
from workers.world import World

EMBEDDED = [pytest.param(GRIDWORLD, id="gridworld"), pytest.param(GRIDWORLD_4X, id="gridworld-4x")]


@pytest.fixture(scope="module")
def engines() -> dict[str, SerialEngine]:
    return {}  # one engine per preset for the module, loaded by the first test that needs it


def _engine(engines: dict[str, SerialEngine], preset: ModelPreset) -> SerialEngine:
    if preset.name not in engines:
        # Compared only with itself: any thread count keeps the contract, so use every core.
        engines[preset.name] = SerialEngine.load(preset.name, cpu_threads=torch.get_num_threads())
    return engines[preset.name]


@pytest.fixture(scope="module")
def world() -> World:
    return World.generate(WORLD_SEED)


def _generate(engine: SerialEngine, image: np.ndarray, keys: list[str], chunks: int, seed: int = 0) -> np.ndarray:
    session = engine.create_session(image, prompt="", seed=seed)
    return np.concatenate([session.step(ChunkControl.from_keys(keys)).frames for _ in range(chunks)])


def test_gridworld_is_the_default() -> None:
    assert DEFAULT_PRESET == "gridworld"


@pytest.mark.parametrize("preset", EMBEDDED)
def test_bundled_weights_load_strictly(preset: ModelPreset) -> None:
    assert preset.bundled_weights is not None
    bundle = loading.BUNDLED_ROOT / preset.bundled_weights
    results = components.verify_checkpoint(preset, bundle)
    assert all(isinstance(r, loading.KeyReport) and r.ok for r in results.values()), results
    total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert total < 30 * 2**20, f"bundled weights are {total / 2**20:.1f} MiB"
    card = json.loads((bundle / loading.MODEL_CARD).read_text())
    assert card["preset"] == preset.name and card["training"]["dit"]["steps"] > 0
    assert card["evaluation"]["headline"]["controllability"] > 0.5, "the card's figures are not a trained model's"


def test_missing_bundled_weights_say_how_to_get_them() -> None:
    with pytest.raises(FileNotFoundError, match=r"python -m workers\.training"):
        loading.checkpoint_dir_for(replace(GRIDWORLD, bundled_weights="not-there"), None)


@pytest.mark.heavy
@pytest.mark.parametrize("preset", EMBEDDED)
def test_generation_is_deterministic_and_not_degenerate(
    preset: ModelPreset, engines: dict[str, SerialEngine], world: World
) -> None:
    engine = _engine(engines, preset)
    start = ClipSpec.for_preset(preset)
    image = world.render(world.start_pose(), start.intrinsics, preset.height_px, preset.width_px)
    a = _generate(engine, image, ["w"], chunks=2)
    b = _generate(engine, image, ["w"], chunks=2)
    assert np.array_equal(a, b)
    assert a.shape == (29, 128, 128, 3)
    assert a.reshape(len(a), -1).std(axis=1).min() > 10.0, "a generated frame is (nearly) constant"
    assert psnr_db(a[-1:], a[:1])[0] < 30.0, "walking forward did not change the view"


@pytest.mark.heavy
def test_turning_left_looks_like_the_renderers_left_view(engines: dict[str, SerialEngine], world: World) -> None:
    # The default's promise only: from this start gridworld-4x turns right under L (16.4 against
    # 12.6 dB) but not left under J (12.8 dB to the left view, 15.1 to the right), though it follows
    # keys 9 times in 10 over world_eval's held-out trials; part of why it is not the default.
    engine = _engine(engines, GRIDWORLD)
    spec = ClipSpec.for_preset(GRIDWORLD)
    state = world.start_state()
    image = world.render(world.start_pose(), spec.intrinsics, GRIDWORLD.height_px, GRIDWORLD.width_px)
    made, truth = {}, {}
    for key in ("j", "l"):  # turn left, turn right: 42° each way after 28 frames
        made[key] = _generate(engine, image, [key], chunks=2)[-1:]
        truth[key] = render_clip(world, spec, state, (ChunkControl.from_keys([key]),) * 2).frames[-1:]
    for key, other in (("j", "l"), ("l", "j")):
        own, wrong = psnr_db(made[key], truth[key])[0], psnr_db(made[key], truth[other])[0]
        assert own > wrong + 1.0, f"after {key!r}: {own:.2f} dB to its own view, {wrong:.2f} dB to the other"
