"""Decoder tuning: the finished VAE's decoder trained on with its encoder frozen.

The latent space (encoder, conv1 and the latent statistics folded into them) stays bit for bit what
the vae phase made, so latents already encoded and a DiT trained on them stay valid: this phase can
run before, beside or after the DiT's. Only the decoder side (conv2 and the decoder) is trained,
checkpointed and kept in the resume point; the encoder always comes from the finished VAE file.

Its use here is a cheaper decoder: a preset whose `decoder_full_res_kernel_t` is 1 decodes its
last, full-resolution stage frame by frame. Its per-frame kernels start as the trained 3-frame ones
with their taps summed (what those computed on three equal frames, `warm_start`), and this phase
trains them the rest of the way with the vae phase's loss.

What it did not buy: sharper frames. 300 steps with an L1 term on the frames' Laplacian (weight
0.5) beside that loss left gridworld-4x's held-out sharpness and edge F1 where the same 300 steps
without it did (0.148 / 0.718 against 0.152 / 0.739), so the loss is the vae phase's.

Batches are 1 + 8-frame clips of the train split, cropped, drawn from (seed, step) like the vae
phase's, so a resumed run sees what an uninterrupted one would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from workers.models.presets import ModelPreset
from workers.models.vae import WanVAE
from workers.training import checkpoint
from workers.training.clips import ClipSpec, frames_to_model, split_rng
from workers.training.progress import Progress
from workers.training.resume_point import ResumePoint
from workers.training.vae_train import lr_at, psnr_db_from_mse, random_crop, render_windows
from workers.world import World

PHASE = "decoder"
# Batch `step` is drawn from item DATA_OFFSET + step of the train split: clips of its own, past any
# step the vae phase drew.
DATA_OFFSET = 1_000_000


@dataclass(frozen=True)
class DecoderTuneConfig:
    steps: int = 0
    batch: int = 8
    clip_frames: int = 9  # 1 + 8: two latent groups, so the decoder's caches are trained too
    crop_px: int = 64
    lr: float = 1e-4  # a fine-tune of trained weights
    warmup_steps: int = 20
    l1_weight: float = 0.25  # as the vae phase's loss
    checkpoint_every: int = 50
    seed: int = 0


def tune_loss(recon: torch.Tensor, video: torch.Tensor, cfg: DecoderTuneConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, mse): MSE plus a little L1, as the vae phase (the latent penalty has nothing to act on)."""
    mse = F.mse_loss(recon, video)
    return mse + cfg.l1_weight * (recon - video).abs().mean(), mse


def warm_start(trained: dict[str, torch.Tensor], vae: WanVAE) -> dict[str, torch.Tensor]:
    """`trained` (a finished VAE's state) for `vae`'s architecture: a conv that is per-frame in
    `vae` but spans 3 frames in `trained` gets the sum of its taps (what it computed on a still
    picture); everything else as trained. Raises on any other mismatch."""
    own = vae.state_dict()
    if own.keys() != trained.keys():
        raise ValueError(f"VAE keys differ: {sorted(own.keys() ^ trained.keys())[:4]}")
    state = {}
    for name, value in trained.items():
        want = own[name].shape
        if value.shape != want and value.ndim == 5 and value.shape[2] == 3 and want[2] == 1:
            value = value.sum(dim=2, keepdim=True)
        if value.shape != want:
            raise ValueError(f"{name}: trained shape {tuple(value.shape)} does not fit {tuple(want)}")
        state[name] = value
    return state


def decoder_side(vae: WanVAE) -> nn.ModuleDict:
    """The trained part, under the VAE's own key names (`conv2.*`, `decoder.*`)."""
    return nn.ModuleDict({"conv2": vae.conv2, "decoder": vae.decoder})


def tune_decoder(
    preset: ModelPreset,
    world: World,
    out_dir: Path,
    cfg: DecoderTuneConfig,
    device: torch.device | None = None,
    keep: ResumePoint | None = None,
) -> WanVAE:
    """Tune (or resume tuning) `<out_dir>/vae.safetensors`'s decoder to cfg.steps; returns the VAE
    (its encoder side exactly the file's). Checkpoints hold the decoder side only."""
    spec = ClipSpec.for_preset(preset)
    vae = WanVAE(preset.vae)
    vae.load_state_dict(warm_start(load_file(str(out_dir / "vae.safetensors")), vae))
    vae.to(device or torch.device("cpu"))
    vae.encoder.requires_grad_(False)
    vae.conv1.requires_grad_(False)
    trained = decoder_side(vae)
    opt = torch.optim.AdamW(trained.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    path = out_dir / f"{PHASE}.ckpt.pt"
    state = checkpoint.resume_run(path, PHASE, trained, opt, keep)
    step = start_step = state["step"] if state else 0
    wall_s = state.get("wall_s", 0.0) if state else 0.0

    progress = Progress(PHASE, cfg.steps, start=step, every=10)
    t_run = time.perf_counter()
    vae.train()
    while step < cfg.steps:
        rng = split_rng(cfg.seed, "train", DATA_OFFSET + step)
        video = frames_to_model(render_windows(world, spec, rng, cfg.batch, cfg.clip_frames))
        video = random_crop(video, cfg.crop_px, rng).to(vae.conv2.weight.device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.lr, cfg.warmup_steps, cfg.steps)
        with torch.no_grad():
            latents = vae.encode(video)
        loss, mse = tune_loss(vae.decode(latents), video, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained.parameters(), 1.0)
        opt.step()
        step += 1
        progress.update(step, loss=loss.item(), psnr_db=psnr_db_from_mse(mse.item()))
        if step % cfg.checkpoint_every == 0 or step == cfg.steps or checkpoint.stop_requested():
            run_s = time.perf_counter() - t_run
            runs = checkpoint.history(state, start_step, step, cfg, run_s)
            checkpoint.save_run(path, PHASE, step, trained, opt, keep, wall_s=wall_s + run_s, history=runs)
    return vae.eval()
