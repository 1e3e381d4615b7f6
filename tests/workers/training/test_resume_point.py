"""Resume points: a run resumes from the committed compact state alone (a fresh clone), as a warm
restart close to the uninterrupted run, and a point stays within the size the repository allows."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from workers.models.presets import GRIDWORLD_4X
from workers.models.vae import WanVAE
from workers.training import checkpoint
from workers.training.clips import WORLD_SEED
from workers.training.dit_train import DiTTrainConfig, make_optimizer, new_dit
from workers.training.resume_point import MOMENTS_DTYPE, WEIGHTS_DTYPE, ResumePoint
from workers.training.vae_train import VAETrainConfig, train_vae
from workers.world import World

pytestmark = pytest.mark.training

MAX_POINT_BYTES = 30 * 2**20  # the repository's growth allowed per committed resume point
# Image steps on 32 px crops: the cheapest steps the VAE has, and the same loop as every other.
CFG = VAETrainConfig(
    steps=5, image_steps=5, image_batch=2, image_lr=1e-3, crop_px=32, warmup_steps=1, checkpoint_every=2
)


@pytest.fixture(autouse=True)
def no_stop_left_over() -> Iterator[None]:
    checkpoint.clear_stop()
    yield
    checkpoint.clear_stop()


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.flatten().float() for v in state.values()])


def test_a_stopped_run_resumes_on_a_fresh_machine_from_its_resume_point(tmp_path: Path) -> None:
    world = World.generate(WORLD_SEED)
    whole = train_vae(GRIDWORLD_4X, world, tmp_path / "whole", CFG).state_dict()

    keep = ResumePoint(tmp_path / "repo" / "resume")
    work = tmp_path / "machine-1"
    checkpoint.request_stop()  # as SIGTERM would: finish the step, save, stop
    with pytest.raises(checkpoint.Interrupted) as stopped:
        train_vae(GRIDWORLD_4X, world, work, CFG, keep=keep)
    checkpoint.clear_stop()
    assert stopped.value.step == 1
    saved = torch.load(work / "vae.ckpt.pt", weights_only=False)

    # The point holds the checkpoint's weights in float16 and AdamW's moments in bfloat16, by name.
    weights = load_file(str(keep.directory / "vae.weights.safetensors"))
    assert weights.keys() == saved["model"].keys()
    assert all(torch.equal(weights[k], v.to(WEIGHTS_DTYPE)) for k, v in saved["model"].items())
    moments = load_file(str(keep.directory / "vae.moments.safetensors"))
    names = [n for n, _ in WanVAE(GRIDWORLD_4X.vae).named_parameters()]
    first = saved["optimizer"]["state"][0]
    assert torch.equal(moments[f"{names[0]}.exp_avg_sq"], first["exp_avg_sq"].to(MOMENTS_DTYPE))
    assert keep.step("vae") == 1

    # A fresh machine has the repository only: the work directory is gone.
    shutil.rmtree(work)
    resumed = train_vae(GRIDWORLD_4X, world, tmp_path / "machine-2", CFG, keep=keep).state_dict()
    final = torch.load(tmp_path / "machine-2" / "vae.ckpt.pt", weights_only=False)
    assert final["step"] == CFG.steps
    assert [run["steps"] for run in final["history"]] == [[0, 1], [1, CFG.steps]]
    assert keep.step("vae") == CFG.steps
    # A warm restart: not the uninterrupted run's bits, but within the rounding it started from.
    gap = (_flat(resumed) - _flat(whole)).norm() / _flat(whole).norm()
    assert gap < 1e-2, gap


def test_moments_keep_their_parameters_across_optimizer_groups_and_fit_the_budget(tmp_path: Path) -> None:
    dit = new_dit(GRIDWORLD_4X, 0)
    cfg = DiTTrainConfig()
    opt = make_optimizer(dit, cfg)  # two groups: the camera path learns at its own rate
    for p in dit.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    keep = ResumePoint(tmp_path)
    size = keep.save("dit", {"step": 1, "history": []}, dit, opt)
    assert size <= MAX_POINT_BYTES, size  # the largest point gridworld-4x writes

    other = new_dit(GRIDWORLD_4X, 1)
    other_opt = make_optimizer(other, cfg)
    meta = keep.load("dit", other, other_opt)
    assert meta is not None and meta["step"] == 1
    for (name, p), (_, q) in zip(dit.named_parameters(), other.named_parameters(), strict=True):
        assert torch.equal(p.to(WEIGHTS_DTYPE).float(), q), name
        want, got = opt.state[p], other_opt.state[q]
        assert torch.equal(want["exp_avg"].to(MOMENTS_DTYPE).float(), got["exp_avg"]), name
        assert float(got["step"]) == 1.0
    assert [g["lr_scale"] for g in other_opt.param_groups] == [1.0, cfg.camera_lr_scale]


def test_a_finished_vae_replaces_its_in_progress_state(tmp_path: Path) -> None:
    keep = ResumePoint(tmp_path / "point")
    vae = WanVAE(GRIDWORLD_4X.vae)
    keep.save("vae", {"step": 3}, vae, torch.optim.AdamW(vae.parameters()))
    work = tmp_path / "work"
    work.mkdir()
    (work / "vae.safetensors").write_bytes(b"weights")
    (work / "vae.json").write_text("{}")
    keep.finish_vae(work)
    assert sorted(f.name for f in keep.directory.iterdir()) == ["vae.json", "vae.safetensors"]
    assert keep.step("vae") is None
    fresh = tmp_path / "fresh"
    assert keep.restore_finished_vae(fresh)
    assert (fresh / "vae.safetensors").read_bytes() == b"weights"
