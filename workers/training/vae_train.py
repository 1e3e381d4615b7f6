"""VAE training: single frames, then short clips of the procedural world; then latent statistics.

Two phases, the way causal video VAEs are commonly built (an image VAE inflated to video):
- Images. The first `image_steps` train on single frames. A causal conv sees a stream's first
  frame through its last temporal tap alone (the others read the zero padding), so this phase
  trains exactly the per-frame (spatial) part of the network, at about an eighth of the cost per
  sample of a 9-frame clip. On a CPU that is where the reconstruction quality comes from: trained
  on clips alone, the VAE was still at 23 dB (training crops) after an hour on 2 cores, below what
  8×-average-pooling the frames scores; 2000 image steps reach 25.7 dB in 15 minutes on one core.
- Clips. The rest train on 1 + 4k-frame clips, the causal VAE's stream unit, starting from the
  image model applied frame by frame (`init_for_training`): every temporal tap but the current
  frame's starts at zero, encoder time convs keep the later frame of each pair (a latent group is
  the image latent of its last frame) and decoder time convs repeat their input. First 1 + 4
  frames (cheap), then 1 + 8, because later groups decode from the caches of earlier ones and only
  a second group teaches that steady state.
Residual branches and attention outputs also start at zero, so each block starts as its shortcut
and the network as a shallow map that trains quickly.

Each step renders a fresh batch (infinite data, drawn from (seed, step), so a resumed run sees what
an uninterrupted one would). Most steps train on random crops, which costs a quarter of full
frames and teaches the same local convolutions; the last clip steps train on full frames so the
mid-block attention sees whole views.

Long streams: a VAE trained on clips from a random initialisation decayed over a long stream's
caches (22 → 14 dB over 40 frames); optional last steps stream 1 + 8·S frames through the decoder
alone (`long_stream_steps`, see `_long_stream_loss`). From the per-frame initialisation it does
not decay (held-out 10 s walks: 27.7 dB over 0–1 s, 29.1 dB over 4–10 s), so the default is none.

The loss is MSE (what PSNR measures) plus a little L1 (faster early progress) and a tiny penalty on
the latent mean's magnitude, which keeps latents from drifting in scale. At the end the per-channel
latent mean/std are measured and folded into conv1/conv2 (both 1×1×1, so exactly), making the
encoder emit normalised latents with the preset's zero mean / unit std.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from workers.chunk_geometry import video_frames
from workers.models.presets import ModelPreset
from workers.models.vae import AttentionBlock, CausalConv3d, Resample, ResidualBlock, WanVAE
from workers.training import checkpoint
from workers.training.clips import ClipSpec, frames_to_model, sample_controls, sample_start, split_rng
from workers.training.progress import Progress
from workers.training.resume_point import ResumePoint
from workers.world import World, simulate_path


@dataclass(frozen=True)
class VAETrainConfig:
    steps: int = 10400  # in all: image steps, then clip steps
    image_steps: int = 8000  # the first steps train on single frames (see the module docstring)
    image_batch: int = 4  # small batches: more updates per second beat larger ones here
    image_lr: float = 5e-4
    full_res_steps: int = 150  # then whole frames, at half the batch
    long_stream_steps: int = 0  # the last steps: long streams in segments (module docstring)
    batch: int = 8
    short_clip_steps: int = 200  # the first clip steps use 1 + 4 frames, the rest 1 + 8
    clip_frames: int = 9  # 1 + 4k; two temporal groups, so the decoder learns the cached steady state
    stream_segments: int = 6  # long streams: 1 + 8·segments frames, backpropagated 8 frames at a time
    crop_px: int = 64
    lr: float = 3e-4  # 6e-4 trained markedly slower and less stably
    warmup_steps: int = 100
    l1_weight: float = 0.25
    latent_penalty: float = 1e-4
    # The long-stream steps train the decoder alone: the encoder, and so every latent already
    # encoded (and a DiT trained on them), stay exactly as they were, so this phase can continue a
    # finished model. Generation streams only the decoder for long. (Frozen parameters get no
    # gradient, and AdamW skips parameters without one.)
    long_stream_decoder_only: bool = True
    checkpoint_every: int = 100
    seed: int = 0


def psnr_db_from_mse(mse: float) -> float:
    """PSNR of pixels in [-1, 1] (peak-to-peak 2) from their mean squared error."""
    return 10.0 * math.log10(4.0 / max(mse, 1e-12))


def lr_at(step: int, cfg_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return cfg_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return cfg_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def render_windows(world: World, spec: ClipSpec, rng: np.random.Generator, count: int, frames: int) -> np.ndarray:
    """[count, frames, H, W, 3] uint8: consecutive frames from random walks of the train split."""
    out = np.zeros((count, frames, spec.height_px, spec.width_px, 3), dtype=np.uint8)
    chunks = 2 + frames // video_frames(spec.chunk_latent_frames, first_chunk=False)
    for i in range(count):
        start = sample_start(rng, world, "train")
        controls = sample_controls(rng, world, spec, start, chunks)
        poses = simulate_path(world, list(controls), spec.chunk_latent_frames, spec.motion, start=start).c2w
        first = int(rng.integers(0, len(poses) - frames + 1))
        for j in range(frames):
            out[i, j] = world.render(poses[first + j], spec.intrinsics, spec.height_px, spec.width_px)
    return out


def random_crop(video: torch.Tensor, size: int, rng: np.random.Generator) -> torch.Tensor:
    h, w = video.shape[-2:]
    top, left = int(rng.integers(0, h - size + 1)), int(rng.integers(0, w - size + 1))
    return video[..., top : top + size, left : left + size]


def _image_batch(world: World, spec: ClipSpec, rng: np.random.Generator, cfg: VAETrainConfig) -> torch.Tensor:
    """[B, 3, 1, crop, crop]: single frames from random train walks."""
    return random_crop(frames_to_model(render_windows(world, spec, rng, cfg.image_batch, 1)), cfg.crop_px, rng)


def _clip_batch(
    world: World, spec: ClipSpec, rng: np.random.Generator, cfg: VAETrainConfig, step: int
) -> tuple[torch.Tensor, bool]:
    """The clip phase's batch at `step`, and whether it is a long stream (see the config's phases)."""
    long_stream = step >= cfg.steps - cfg.long_stream_steps
    full_res = not long_stream and step >= cfg.steps - cfg.long_stream_steps - cfg.full_res_steps
    frames = 5 if step < cfg.image_steps + cfg.short_clip_steps else cfg.clip_frames
    if long_stream:
        frames = 1 + 8 * cfg.stream_segments
    video = frames_to_model(render_windows(world, spec, rng, cfg.batch // 2 if full_res else cfg.batch, frames))
    return (video if full_res else random_crop(video, cfg.crop_px, rng)), long_stream


def _detach(cache: list) -> list:
    return [c.detach() if isinstance(c, torch.Tensor) else c for c in cache]


def _reconstruction_loss(vae: WanVAE, video: torch.Tensor, cfg: VAETrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    latents = vae.encode(video)
    recon = vae.decode(latents)
    mse = F.mse_loss(recon, video)
    loss = mse + cfg.l1_weight * (recon - video).abs().mean() + cfg.latent_penalty * latents.pow(2).mean()
    return loss, mse


def _long_stream_loss(vae: WanVAE, video: torch.Tensor, cfg: VAETrainConfig) -> tuple[float, float]:
    """Stream 1 + 8·S frames through one encode/decode state, 8 frames at a time, backpropagating each
    segment and cutting the graph at the caches between segments (truncated backpropagation through
    time). Short clips never show the caches a long stream settles into, and there quality decays
    (22 → 14 dB over 40 frames); this trains that steady state at a fixed cost per segment.
    Accumulates gradients; returns the mean loss and MSE."""
    state = vae.new_stream_state()
    bounds = [(0, 9)] + [(i, i + 8) for i in range(9, video.shape[2], 8)]
    total = total_mse = 0.0
    for lo, hi in bounds:
        segment = video[:, :, lo:hi]
        latents = vae.encode_stream(segment, state)
        recon = vae.decode_stream(latents, state)
        mse = F.mse_loss(recon, segment)
        loss = mse + cfg.l1_weight * (recon - segment).abs().mean() + cfg.latent_penalty * latents.pow(2).mean()
        (loss / len(bounds)).backward()
        state.encoder_cache, state.decoder_cache = _detach(state.encoder_cache), _detach(state.decoder_cache)
        total, total_mse = total + loss.item() / len(bounds), total_mse + mse.item() / len(bounds)
    return total, total_mse


@torch.no_grad()
def init_for_training(vae: WanVAE) -> None:
    """Initialise, in place, so the network starts as a shallow per-frame map (module docstring).

    - Every residual branch and attention output starts at zero: each block is its shortcut.
    - Every causal conv with a temporal kernel keeps only its current-frame tap (the last), so
      the image phase, which trains that tap alone, leaves a per-frame video network.
    - Encoder time convs keep the later frame of each pair; decoder time convs write their input
      to both output frames. Until the clip phase trains them, a latent group is the image latent
      of the group's last frame, decoded four times.
    """
    for module in vae.modules():
        if isinstance(module, ResidualBlock | AttentionBlock):
            last = module.residual[-1] if isinstance(module, ResidualBlock) else module.proj
            assert isinstance(last, nn.Conv2d | nn.Conv3d)
            nn.init.zeros_(last.weight)
            if last.bias is not None:
                nn.init.zeros_(last.bias)
        elif isinstance(module, CausalConv3d) and module.weight.shape[2] > 1:
            module.weight[:, :, :-1] = 0.0
    for module in vae.modules():
        if isinstance(module, Resample) and module.time_conv is not None:
            weight, dim = module.time_conv.weight, module.dim  # [out, dim, 3, 1, 1]
            weight.zero_()
            assert module.time_conv.bias is not None
            nn.init.zeros_(module.time_conv.bias)
            identity = torch.eye(dim, dtype=weight.dtype, device=weight.device)
            for group in range(weight.shape[0] // dim):  # downsample: 1 group; upsample: 2 frames
                weight[group * dim : (group + 1) * dim, :, -1, 0, 0] = identity


def train_vae(
    preset: ModelPreset,
    world: World,
    out_dir: Path,
    cfg: VAETrainConfig,
    device: torch.device | None = None,
    keep: ResumePoint | None = None,
) -> WanVAE:
    """Train (or resume) to cfg.steps; returns the trained VAE (statistics not yet folded). With
    `keep`, each checkpoint is also written there compactly and a run resumes from it when it is
    further on than the work directory's checkpoint."""
    spec = ClipSpec.for_preset(preset)
    torch.manual_seed(cfg.seed)
    vae = WanVAE(preset.vae).to(device or torch.device("cpu"))
    init_for_training(vae)
    opt = torch.optim.AdamW(vae.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    path = out_dir / "vae.ckpt.pt"
    state = checkpoint.resume_run(path, "vae", vae, opt, keep)
    step = start_step = state["step"] if state else 0
    wall_s = state.get("wall_s", 0.0) if state else 0.0

    # One progress line per phase: an image step costs a fraction of a clip step, so one ETA over
    # both would mislead.
    def phase_progress(at: int) -> Progress:
        if at < cfg.image_steps:
            return Progress("vae-images", cfg.image_steps, start=at, every=100)
        return Progress("vae-clips", cfg.steps, start=at, every=20)

    progress = phase_progress(step)
    t_run = time.perf_counter()
    vae.train()
    while step < cfg.steps:
        rng = split_rng(cfg.seed, "train", step)
        if step < cfg.image_steps:
            video, long_stream, train_encoder = _image_batch(world, spec, rng, cfg), False, True
            lr = lr_at(step, cfg.image_lr, cfg.warmup_steps, cfg.image_steps)
        else:
            if step == cfg.image_steps and step != start_step:
                progress = phase_progress(step)
            video, long_stream = _clip_batch(world, spec, rng, cfg, step)
            train_encoder = not (long_stream and cfg.long_stream_decoder_only)
            lr = lr_at(step - cfg.image_steps, cfg.lr, cfg.warmup_steps, cfg.steps - cfg.image_steps)
        video = video.to(vae.conv1.weight.device)
        vae.encoder.requires_grad_(train_encoder)
        vae.conv1.requires_grad_(train_encoder)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        if long_stream:
            loss_value, mse_value = _long_stream_loss(vae, video, cfg)
        else:
            loss, mse = _reconstruction_loss(vae, video, cfg)
            loss.backward()
            loss_value, mse_value = loss.item(), mse.item()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        step += 1
        progress.update(step, loss=loss_value, psnr_db=psnr_db_from_mse(mse_value))
        if step % cfg.checkpoint_every == 0 or step == cfg.steps or checkpoint.stop_requested():
            run_s = time.perf_counter() - t_run
            runs = checkpoint.history(state, start_step, step, cfg, run_s)
            checkpoint.save_run(path, "vae", step, vae, opt, keep, wall_s=wall_s + run_s, history=runs)
    return vae.eval()


@torch.no_grad()
def measure_latent_stats(
    vae: WanVAE, world: World, preset: ModelPreset, seed: int, clips: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std of the (not yet normalised) latents of train clips."""
    spec = ClipSpec.for_preset(preset)
    rng = split_rng(seed, "train", 10**7)
    # A first chunk of C + 1 latent frames: 1 + 4C video frames.
    video = frames_to_model(render_windows(world, spec, rng, clips, video_frames(spec.chunk_latent_frames + 1, True)))
    device = vae.conv1.weight.device
    mu = torch.cat([vae.encode(v[None].to(device)) for v in video])  # [N, z, F, h, w], identity stats so far
    return mu.mean(dim=(0, 2, 3, 4)), mu.std(dim=(0, 2, 3, 4)).clamp_min(1e-3)


@torch.no_grad()
def fold_latent_stats(vae: WanVAE, mean: torch.Tensor, std: torch.Tensor) -> dict[str, list]:
    """Fold per-channel latent mean/std into conv1 / conv2, in place.

    Afterwards the encoder's output is already (mu − mean) / std and the decoder expects exactly
    that, so the preset's zero mean / unit std statistics are the right ones to apply. A VAE whose
    decoder was continued with its encoder frozen is folded with the first run's statistics, so it
    emits exactly the latents its DiT was trained on.
    """
    z = vae.z_dim
    mean, std = mean.to(vae.conv1.weight), std.to(vae.conv1.weight)
    w1, b1 = vae.conv1.weight, vae.conv1.bias  # [2z, 2z, 1, 1, 1], [2z]
    assert b1 is not None and vae.conv2.bias is not None  # both convs have biases
    w1[:z] /= std.view(z, 1, 1, 1, 1)
    b1[:z] = (b1[:z] - mean) / std
    w2, b2 = vae.conv2.weight, vae.conv2.bias  # [z, z, 1, 1, 1], [z]
    b2 += w2[:, :, 0, 0, 0] @ mean
    w2 *= std.view(1, z, 1, 1, 1)
    return {"mean": mean.tolist(), "std": std.tolist()}
