"""Matrix-Game through the model interface: its presets, the released files' strict load and
`verify`, the serial engine on the tiny fixture (controls reach the action tensors, determinism),
and the memory plan's figures."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from workers.controls import ChunkControl
from workers.families.matrix_game import MATRIX_GAME
from workers.families.registry import family_for
from workers.models import loading
from workers.models.checkpoint_files import VAE_FILE, CheckpointMissing, require_checkpoint
from workers.models.clip import unused_visual_keys
from workers.models.components import load_vae
from workers.models.configs import Family
from workers.models.matrix_game.dit import RELEASE_PREFIX
from workers.models.matrix_game.variants import CLIP_FILE
from workers.models.presets import (
    MATRIX_GAME_GTA,
    MATRIX_GAME_TEMPLERUN,
    MATRIX_GAME_TINY,
    MATRIX_GAME_UNIVERSAL,
    TINY,
    ModelPreset,
)
from workers.runtime.footprint import dit_footprint
from workers.runtime.memory_plan import GIB, plan_memory
from workers.runtime.placement import PLACEMENTS, PlacementError, get_placement
from workers.serial_engine import SerialEngine
from workers.stages.denoise import ActionDenoiseSession

CPU = torch.device("cpu")
SEED = 5
IMAGE = np.random.default_rng(0).integers(0, 256, (MATRIX_GAME_TINY.height_px, MATRIX_GAME_TINY.width_px, 3), np.uint8)


def test_the_released_presets() -> None:
    for preset in (MATRIX_GAME_UNIVERSAL, MATRIX_GAME_GTA, MATRIX_GAME_TEMPLERUN):
        assert preset.family is Family.MATRIX_GAME and family_for(preset) is MATRIX_GAME
        assert (preset.width_px, preset.height_px, preset.fps, preset.chunk_latent_frames) == (640, 352, 25, 3)
        assert preset.t5 is None and preset.dit.sink_size_frames == 0 and preset.sample_shift == 5.0
    assert MATRIX_GAME_UNIVERSAL.dit.local_attn_size_frames == 6 and MATRIX_GAME_GTA.dit.local_attn_size_frames == 4
    assert MATRIX_GAME_UNIVERSAL.timestep_indices == (0, 334, 667)
    assert MATRIX_GAME_TEMPLERUN.timestep_indices == (0, 250, 500, 750)
    assert not MATRIX_GAME_TEMPLERUN.controls.look and MATRIX_GAME_UNIVERSAL.controls.look
    with pytest.raises(ValueError, match="no text encoder"):
        dataclasses.replace(MATRIX_GAME_TINY, t5=TINY.t5)


def _released_layout(root: Path, preset: ModelPreset, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """The fixture's seeded random weights written as the release lays its files out: the DiT under
    `model.`, the CLIP file with both towers (the text tower and unused visual weights included), the
    VAE `.pth`. Returns each component's weights under the module's names."""
    engine_parts = {
        "dit": MATRIX_GAME.load_dit(preset, CPU, None, seed),
        "clip": MATRIX_GAME.load_context_encoder(preset, CPU, None, seed).tower,
        "vae": load_vae(preset, CPU, None, seed),
    }
    states = {name: {k: v.clone() for k, v in m.state_dict().items()} for name, m in engine_parts.items()}
    assert preset.matrix_game is not None
    dit_path = root / preset.matrix_game.dit_file
    dit_path.parent.mkdir(parents=True)
    save_file({RELEASE_PREFIX + k: v for k, v in states["dit"].items()}, str(dit_path))
    clip = {f"visual.{k}": v for k, v in states["clip"].items()}
    clip |= {f"visual.{k}": torch.zeros(2) for k in unused_visual_keys(preset.matrix_game.clip)}
    clip |= {"textual.embeddings.weight": torch.zeros(3, 2), "log_scale": torch.zeros(())}
    torch.save(clip, root / CLIP_FILE)
    torch.save(states["vae"], root / VAE_FILE)
    return states


@pytest.mark.heavy
def test_the_released_files_load_strictly_and_verify(tmp_path: Path) -> None:
    states = _released_layout(tmp_path, MATRIX_GAME_TINY, seed=11)
    require_checkpoint(MATRIX_GAME_TINY, tmp_path)  # every file where the release puts it
    reports = MATRIX_GAME.verify(MATRIX_GAME_TINY, tmp_path)
    assert all(isinstance(r, loading.KeyReport) and r.ok for r in reports.values()), reports
    dit = MATRIX_GAME.load_dit(MATRIX_GAME_TINY, CPU, tmp_path)
    tower = MATRIX_GAME.load_context_encoder(MATRIX_GAME_TINY, CPU, tmp_path).tower
    for name, module in (("dit", dit), ("clip", tower)):
        loaded = module.state_dict()
        assert loaded.keys() == states[name].keys()
        assert all(torch.equal(loaded[k], v) for k, v in states[name].items()), name

    # A tensor of the wrong shape is named, with the module's name, before any weight is read.
    assert MATRIX_GAME_TINY.matrix_game is not None
    dit_file = tmp_path / MATRIX_GAME_TINY.matrix_game.dit_file
    broken = {RELEASE_PREFIX + k: v for k, v in states["dit"].items()}
    broken[RELEASE_PREFIX + "blocks.0.action_model.keyboard_attn_kv.weight"] = torch.zeros(3, 3)
    save_file(broken, str(dit_file))
    report = MATRIX_GAME.verify(MATRIX_GAME_TINY, tmp_path)["dit"]
    assert isinstance(report, loading.KeyReport) and not report.ok
    assert "blocks.0.action_model.keyboard_attn_kv.weight" in report.describe("dit")
    with pytest.raises(loading.CheckpointError, match="keyboard_attn_kv"):
        MATRIX_GAME.load_dit(MATRIX_GAME_TINY, CPU, tmp_path)

    # A file saved from the bare model (no wrapper prefix) loads the same; a stray name is reported.
    save_file(dict(states["dit"]) | {"model.extra": torch.zeros(1)}, str(dit_file))
    report = MATRIX_GAME.verify(MATRIX_GAME_TINY, tmp_path)["dit"]
    assert isinstance(report, loading.KeyReport) and report.unexpected == ("extra",) and not report.missing


def test_fail_fast_without_the_released_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointMissing, match=r"Matrix-Game 2\.0 release directory.*base_distill\.safetensors"):
        require_checkpoint(MATRIX_GAME_UNIVERSAL, None)
    (tmp_path / VAE_FILE).write_bytes(b"")
    missing = re.escape(f"missing: base_distilled_model/base_distill.safetensors, {CLIP_FILE}")
    with pytest.raises(CheckpointMissing, match=missing):
        require_checkpoint(MATRIX_GAME_UNIVERSAL, tmp_path)
    with pytest.raises(CheckpointMissing, match="templerun_7dim_onlykey"):
        require_checkpoint(MATRIX_GAME_TEMPLERUN, tmp_path)


@pytest.fixture(scope="module")
def engine() -> SerialEngine:
    return SerialEngine.load(MATRIX_GAME_TINY, cpu_threads=1)


def _run(engine: SerialEngine, controls: list[ChunkControl], seed: int = SEED) -> list[np.ndarray]:
    session = engine.create_session(IMAGE, seed=seed)
    return [session.step(c).frames for c in controls]


@pytest.mark.long
@pytest.mark.heavy
def test_chunks_and_determinism(engine: SerialEngine) -> None:
    walk = [ChunkControl.from_keys(["w"]), ChunkControl.from_keys(["w", "l"]), ChunkControl()]
    first = _run(engine, walk)
    assert [len(f) for f in first] == [9, 12, 12]  # 3 latent frames: 9 video frames first, then 12
    assert all(np.array_equal(a, b) for a, b in zip(first, _run(engine, walk), strict=True))
    # Controls steer: the chunk a key changes differs, and the chunks before it do not.
    other = _run(engine, [walk[0], ChunkControl.from_keys(["s", "j"])])
    assert np.array_equal(first[0], other[0]) and not np.array_equal(first[1], other[1])
    assert not np.array_equal(first[0], _run(engine, walk[:1], seed=SEED + 1)[0])


def test_keys_and_look_reach_the_action_tensors(engine: SerialEngine) -> None:
    """What the DiT consumed, as the chunk message reports it (ModelFamily.describe_inputs)."""
    session = engine.create_session(IMAGE, seed=SEED)
    consumed = []
    for control in (ChunkControl.from_keys(["w"]), ChunkControl(keys=frozenset({"d", "i"}), look_dx_px=60.0)):
        inputs = session.control.next_inputs(control, 3)
        consumed.append(MATRIX_GAME.describe_inputs(inputs))
    keyboard = torch.tensor(consumed[1]["keyboard"])  # [3 latent frames, 12 video frames, W S A D]
    mouse = torch.tensor(consumed[1]["mouse"])
    # Chunk 1's last latent frame reads video frames 8..19: chunk 0's W (frames 0..8), then D.
    assert keyboard[2, 0].tolist() == [1, 0, 0, 0] and keyboard[2, -1].tolist() == [0, 0, 0, 1]
    # Mouse: I pitches up by 0.1; 60 px of look over 12 frames yaws right by 5 px a frame = 0.1.
    assert mouse[2, -1].tolist() == pytest.approx([0.1, 0.1])
    assert torch.tensor(consumed[0]["mouse"]).abs().max() == 0


@pytest.mark.heavy
def test_memory_plan_and_placements() -> None:
    # The action modules run on one DiT rank: a sequence-parallel placement is refused by name.
    with pytest.raises(PlacementError, match="at most 1 rank"):
        get_placement("2gpu").validate_for(MATRIX_GAME_UNIVERSAL, cuda_device_count=8)
    PLACEMENTS["1gpu"].validate_for(MATRIX_GAME_UNIVERSAL, cuda_device_count=1)
    fp = dit_footprint(MATRIX_GAME_UNIVERSAL, torch.bfloat16)
    # The planned caches are the caches' own arithmetic: window 6 × 880 tokens × 1536 × K and V × 30
    # blocks (bf16), plus 15 action blocks' keyboard (6 × 1024) and mouse (880 × 6 × 1024) K and V.
    self_attn = 30 * 2 * 6 * 880 * 1536 * 2
    action = 15 * 2 * 6 * 1024 * 2 * (1 + 880)
    assert fp.kv_cache_bytes == self_attn + action
    assert fp.text_kv_bytes == 30 * 2 * 257 * 1536 * 2
    plan = plan_memory(MATRIX_GAME_UNIVERSAL, PLACEMENTS["1gpu"], 1, lambda d: 24 * GIB)
    assert plan.fits, plan.describe()
    assert "CLIP ViT-H/14 weights (bfloat16)" in plan.describe()


@pytest.mark.heavy
def test_the_planned_session_state_is_what_a_session_holds(engine: SerialEngine) -> None:
    planned = dit_footprint(MATRIX_GAME_TINY, torch.float32)
    session = engine.create_session(IMAGE, seed=SEED)
    denoise = session.denoise
    assert isinstance(denoise, ActionDenoiseSession)
    assert planned.kv_cache_bytes == denoise.cache.nbytes()
    image_kv = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in denoise.image_kv)
    assert planned.text_kv_bytes == image_kv
