"""A DiT of 4×4 patches over 4-pixel latent cells, warm-started from one of 2×2 patches over
8-pixel cells: the camera path reads the same pixels and computes the same; the latent-space layers
are the new model's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from workers.controls import ChunkControl
from workers.models import loading
from workers.models.camera import CameraTrack
from workers.models.presets import GRIDWORLD, GRIDWORLD_4X, TINY
from workers.training.__main__ import _init_dir
from workers.training.dit_train import new_dit, warm_start
from workers.training.repatch import LATENT_SPACE_KEYS, camera_pixel_order

pytestmark = pytest.mark.training


def test_both_layouts_list_every_pixel_of_a_token_once() -> None:
    for cell, patch in ((8, 2), (4, 4), (16, 1)):
        order = camera_pixel_order(cell, patch, channels=6)
        assert sorted(order.tolist()) == list(range(6 * 16 * 16))


def test_a_repatched_warm_start_keeps_the_camera_path_and_blocks(tmp_path: Path) -> None:
    trained = new_dit(GRIDWORLD, seed=5)
    with torch.no_grad():  # the camera scale/shift start at zero: give them something to carry
        for p in trained.parameters():
            p.add_(0.01 * torch.randn_like(p))
    source = tmp_path / "source"
    (source / loading.DIT_SUBDIR).mkdir(parents=True)
    save_file(trained.state_dict(), str(source / loading.DIT_SUBDIR / "model.safetensors"))

    fresh = new_dit(GRIDWORLD_4X, seed=0)
    own = {k: v.clone() for k, v in fresh.state_dict().items()}
    record = warm_start(fresh, source)
    assert record["repatched_from"] == [1, 2, 2]
    state = fresh.state_dict()
    for key, value in state.items():
        if key in LATENT_SPACE_KEYS:
            assert torch.equal(value, own[key]), key
        elif key != "patch_embedding_wancamctrl.weight":
            assert torch.equal(value, trained.state_dict()[key]), key

    # The same walk through each preset's camera track (8- and 4-pixel cells): the same modulation.
    controls = [ChunkControl(keys=frozenset({"w", "j"})), ChunkControl(keys=frozenset({"a"}))]
    modulations = []
    for preset, dit in ((GRIDWORLD, trained), (GRIDWORLD_4X, fresh)):
        track = CameraTrack.for_preset(preset)
        cells = torch.cat([track.next_chunk(c, preset.chunk_latent_frames) for c in controls], dim=1)
        with torch.no_grad():
            modulations.append(dit.chunk_camera(cells[None]).hidden)
    assert modulations[0].shape == modulations[1].shape
    torch.testing.assert_close(modulations[1], modulations[0], rtol=1e-5, atol=1e-5)


def test_dit_init_names_a_preset_whose_shipped_weights_start_the_run() -> None:
    assert _init_dir("--dit-init", "gridworld", GRIDWORLD_4X) == loading.checkpoint_dir_for(GRIDWORLD, None)
    assert _init_dir("--dit-init", "bundled", GRIDWORLD_4X) == loading.checkpoint_dir_for(GRIDWORLD_4X, None)
    with pytest.raises(SystemExit, match="ships no weights"):
        _init_dir("--dit-init", "bundled", TINY)
