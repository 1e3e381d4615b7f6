"""Decoder tuning: a per-frame decoder starts from the trained one; the phase trains the decoder side
while the latent space stays bit for bit, resumes from its resume point, records itself and runs once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from workers.models.presets import GRIDWORLD
from workers.models.vae import CausalConv3d, WanVAE
from workers.training import checkpoint
from workers.training.__main__ import _parse, load_trained_vae, phase_decoder
from workers.training.clips import WORLD_SEED
from workers.training.decoder_tune import warm_start
from workers.training.resume_point import ResumePoint
from workers.world import World

pytestmark = pytest.mark.training

PER_FRAME = replace(GRIDWORLD, vae=replace(GRIDWORLD.vae, decoder_full_res_kernel_t=1))
LATENT_SPACE = ("encoder.", "conv1.")


@pytest.fixture(autouse=True)
def no_stop_left_over() -> Iterator[None]:
    checkpoint.clear_stop()
    yield
    checkpoint.clear_stop()


def _finished_vae(out: Path) -> dict[str, torch.Tensor]:
    """A stand-in for the vae phase's product: seeded weights and the record the phase writes."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in WanVAE(GRIDWORLD.vae).state_dict().items()}
    save_file(state, str(out / "vae.safetensors"))
    (out / "vae.json").write_text(json.dumps({"config": {}, "wall_s": 1.0, "history": []}))
    return state


def test_a_per_frame_decoder_starts_as_the_trained_one_on_a_still_picture() -> None:
    torch.manual_seed(0)
    trained = WanVAE(GRIDWORLD.vae)
    per_frame = WanVAE(PER_FRAME.vae)
    per_frame.load_state_dict(warm_start(trained.state_dict(), per_frame))
    conv3 = trained.decoder.head[2]
    conv1 = per_frame.decoder.head[2]
    assert isinstance(conv3, CausalConv3d) and isinstance(conv1, CausalConv3d)
    assert conv3.kernel_size == (3, 3, 3) and conv1.kernel_size == (1, 3, 3)
    still = torch.randn(1, 8, 1, 16, 16).expand(1, 8, 3, 16, 16).contiguous()  # one frame, three times
    with torch.no_grad():
        torch.testing.assert_close(conv1(still[:, :, 2:]), conv3(still[:, :, 2:], still[:, :, :2]), atol=1e-5, rtol=0)
        moving = torch.randn(1, 8, 3, 16, 16)
        assert not torch.allclose(conv1(moving[:, :, 2:]), conv3(moving[:, :, 2:], moving[:, :, :2]), atol=1e-2)
    with pytest.raises(ValueError, match="does not fit"):
        warm_start({**trained.state_dict(), "conv2.weight": torch.zeros(16, 16, 2, 1, 1)}, per_frame)


def test_the_phase_tunes_the_decoder_side_alone_resumes_and_runs_once(tmp_path: Path) -> None:
    """The phase on a per-frame decoder: stopped after a step, resumed on a fresh machine, done."""
    out, keep_dir = tmp_path / "run", tmp_path / "resume"
    finished = _finished_vae(out)
    with pytest.raises(RuntimeError, match="decoder phase"):
        load_trained_vae(out, PER_FRAME)  # the file's decoder is the 3-frame one
    world = World.generate(WORLD_SEED)
    args = _parse(["--out", str(out), "--resume-point", str(keep_dir), "--decoder-steps", "2"])

    checkpoint.request_stop()  # as SIGTERM would: finish the step, save, stop
    with pytest.raises(checkpoint.Interrupted):
        phase_decoder(args, PER_FRAME, world)
    checkpoint.clear_stop()
    keep = ResumePoint(keep_dir)
    assert keep.step("decoder") == 1
    saved = torch.load(out / "decoder.ckpt.pt", weights_only=False)
    assert saved["model"].keys() == {k for k in finished if not k.startswith(LATENT_SPACE)}  # the trained side
    (out / "decoder.ckpt.pt").unlink()  # a fresh machine: the committed point alone

    phase_decoder(args, PER_FRAME, world)
    info = json.loads((out / "vae.json").read_text())
    assert info["decoder"]["steps"] == 2
    assert [run["steps"] for run in info["decoder"]["history"]] == [[0, 1], [1, 2]]
    vae = load_trained_vae(out, PER_FRAME)  # now the file holds the per-frame decoder
    assert vae.decoder.head[2].kernel_size == (1, 3, 3)
    tuned = vae.state_dict()
    latent_space = [k for k in tuned if k.startswith(LATENT_SPACE)]
    assert latent_space and all(torch.equal(tuned[k], finished[k]) for k in latent_space)
    assert not torch.equal(tuned["conv2.weight"], finished["conv2.weight"])
    same_shape = [k for k in tuned if k.startswith("decoder.") and tuned[k].shape == finished[k].shape]
    assert sum(not torch.equal(tuned[k], finished[k]) for k in same_shape) > 20
    # The resume point keeps the tuned VAE as the finished one; the tuning's own state is gone.
    assert keep.step("decoder") is None
    kept = load_file(str(keep_dir / "vae.safetensors"))
    assert torch.equal(kept["decoder.head.2.weight"], tuned["decoder.head.2.weight"])
    stamp = (out / "vae.safetensors").stat().st_mtime_ns
    phase_decoder(args, PER_FRAME, world)  # done: nothing to do
    assert (out / "vae.safetensors").stat().st_mtime_ns == stamp


def test_a_tuned_vae_installs_beside_the_installed_dit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--phase decoder --install`: the VAE file and the card's VAE record change, the DiT does not."""
    from workers.models import loading
    from workers.training.__main__ import install_vae

    out, root = tmp_path / "work", tmp_path / "bundled"
    out.mkdir()
    torch.manual_seed(1)
    tuned = {k: v.contiguous() for k, v in WanVAE(PER_FRAME.vae).state_dict().items()}
    save_file(tuned, str(out / "vae.safetensors"))
    config = {"steps": 10, "image_steps": 4, "image_batch": 2, "batch": 3, "clip_frames": 9, "long_stream_steps": 0}
    decoder = {"steps": 600, "wall_s": 2.0, "history": [{"steps": [0, 600], "config": {"batch": 8, "clip_frames": 9}}]}
    (out / "vae.json").write_text(json.dumps({"config": config, "wall_s": 1.0, "history": [], "decoder": decoder}))
    preset = replace(PER_FRAME, bundled_weights="tuned")
    monkeypatch.setattr(loading, "BUNDLED_ROOT", root)
    args = _parse(["--out", str(out)])
    with pytest.raises(FileNotFoundError, match="export and --install the whole preset first"):
        install_vae(args, preset)

    bundle = root / "tuned"
    (bundle / loading.DIT_SUBDIR).mkdir(parents=True)
    dit_file = bundle / loading.DIT_SUBDIR / "model.safetensors"
    dit_file.write_bytes(b"the installed DiT")
    card = {
        "params": {"dit": 5, "vae": 1},
        "data": {"vae": "old", "dit": "walks"},
        "training": {"vae": {}, "dit": {}},
        "evaluation": {"headline": {"vae_psnr_db": 1.0}},  # the old VAE's figures
    }
    (bundle / loading.MODEL_CARD).write_text(json.dumps(card))

    assert install_vae(args, preset) == bundle
    installed = load_file(str(bundle / loading.VAE_SAFETENSORS))
    assert installed.keys() == tuned.keys() and all(torch.equal(installed[k], tuned[k]) for k in tuned)
    new_card = json.loads((bundle / loading.MODEL_CARD).read_text())
    assert new_card["params"] == {"dit": 5, "vae": sum(v.numel() for v in tuned.values())}
    assert new_card["data"]["vae"].endswith("; then 600 decoder-only steps × 8 clips × 9 frames")
    assert new_card["data"]["dit"] == "walks" and new_card["training"]["vae"]["decoder"] == decoder
    assert "evaluation" not in new_card and dit_file.read_bytes() == b"the installed DiT"
