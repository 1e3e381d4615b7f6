"""The Wan2.1 VAE (workers/models/vae.py) against FastVideo's copy of the released VAE and diffusers'.

What is compared, on one seeded random-weight VAE at the real layout but narrow channels (z_dim 16,
dim_mult (1, 2, 4, 4), two residual blocks per stage, temporal downsampling [F, T, T], so the
8x spatial / 4x temporal strides and every cache rule run; base_dim 16 instead of 96), a 17-frame
32x48 clip (5 latent frames of 4x6):

- FastVideo 0.2.1 `models/vaes/lingbotworld2_wanvae.py`, the released Wan2.1 VAE code under the
  checkpoint's own key names, loaded with the same state dict (strict). Its `WanVAE_` is used
  directly: the `LingBotWorld2WanVAE` wrapper always builds the 96-wide model, and adds only the
  latent scale `[mean, 1 / std]` (built here the same way) and the decode clamp to [-1, 1] (applied
  here as `Wan2_1_VAE.decode` does).
  * encode: our `encode_stream` fed a first chunk of 1 + 4k frames, then chunks of 4k frames,
    against the reference's one-shot `encode` of the whole clip (which runs its encoder on frame 0
    and then on groups of 4 through its own conv caches); and our one-shot `encode` against the
    reference encoder driven chunk by chunk through those same caches (`feat_cache`), kept alive
    across chunks.
  * decode: our `decode_stream` fed a first chunk of 1 latent frame and then later chunks of 2 and 1
    and 1, against the reference's one-shot `decode`; and our one-shot `decode` against the reference
    decoder driven chunk by chunk through its caches. Each chunk's frames are compared separately.
  Both sides give normalised latents `(mu - mean) / std`: ours divides by std, the reference
  multiplies by its scale `1 / std`.
- diffusers 0.42.1 `AutoencoderKLWan`, loaded (strict) from the same state dict renamed by diffusers'
  own `convert_wan_vae_to_diffusers`, so its key mapping is checked as well as the maths. Its
  one-shot `encode` (the posterior's mode) and `decode` take raw latents; they are normalised as
  diffusers' Wan pipelines do it (`(mu - latents_mean) * latents_std` for conditioning latents,
  `z / latents_std + latents_mean` before decoding, with `latents_std = 1 / config.latents_std`),
  using diffusers' default statistics, which are checked equal to ours.

Why F32_REL_BOUND holds: every side runs the same float32 operations, in other orders only. Ours
normalises channels with rsqrt of a sum of squares where the references call F.normalize, runs its
3D convolutions through oneDNN where they take PyTorch's default kernel, applies the 1x1x1
quant convs per chunk where they apply them to the whole clip, and divides by std where they
multiply by its reciprocal. Each moves a value by a few float32 ulps; through the encoder's 31
convolutions and the decoder's 38 these add up to about 1e-6 of the output's scale (1.5e-6 at most
here), an order below the bound. A real disagreement shows above it: scaling the gain of the
encoder's attention norm by 1 + 1e-4 already gives the latents a relative error of 2.8e-5, and
caching one frame of history where two are due gives 0.39.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.parity.compare import assert_agrees
from tests.parity.references import fastvideo_module, reference_module
from workers.models.presets import VAEConfig
from workers.models.vae import WanVAE

pytestmark = pytest.mark.parity

CONFIG = VAEConfig(base_dim=16)  # z_dim, dim_mult, num_res_blocks, temporal_downsample as released
HEIGHT, WIDTH = 32, 48
FRAMES = 17  # 1 + 4 * 4 video frames: 5 latent frames
ENCODE_CHUNKS = (5, 8, 4)  # video frames: a first chunk of 1 + 4k, then chunks of 4k
DECODE_CHUNKS = (1, 2, 1, 1)  # latent frames: the first alone, then chunks of 2 and 1
TEMPORAL_STRIDE = 4


def _reference_kwargs() -> dict[str, Any]:
    return {
        "z_dim": CONFIG.z_dim,
        "dim_mult": list(CONFIG.dim_mult),
        "num_res_blocks": CONFIG.num_res_blocks,
        "temperal_downsample": list(CONFIG.temporal_downsample),
    }


def _seeded_state_dict(model: WanVAE, seed: int) -> dict[str, torch.Tensor]:
    """Weights scaled by fan-in, random biases and norm gains, so that no term vanishes."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, p in model.state_dict().items():
        if name.endswith("bias"):
            state[name] = 0.1 * torch.randn(p.shape, generator=gen)
        elif name.endswith("gamma"):
            state[name] = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            state[name] = torch.randn(p.shape, generator=gen) / math.sqrt(p[0].numel())
    # A smaller output conv keeps the decoded values inside the [-1, 1] clamp (|x| <= 0.71 here),
    # so the comparison sees them rather than the clamp's bounds.
    state["decoder.head.2.weight"] *= 0.25
    return state


@dataclass
class Sides:
    ours: WanVAE
    fastvideo: Any  # FastVideo's WanVAE_
    diffusers: Any  # diffusers' AutoencoderKLWan
    video: torch.Tensor  # [1, 3, FRAMES, H, W] in [-1, 1]
    latents: torch.Tensor  # [1, z, latent frames, H/8, W/8], normalised


@pytest.fixture(scope="module")
def sides() -> Sides:
    fastvideo_vae: ModuleType = fastvideo_module("models.vaes.lingbotworld2_wanvae")
    diffusers: ModuleType = reference_module("diffusers")
    single_file: ModuleType = reference_module("diffusers.loaders.single_file_utils")

    ours = WanVAE(CONFIG).eval()
    state = _seeded_state_dict(ours, seed=0)
    ours.load_state_dict(state, strict=True)

    fastvideo = fastvideo_vae.WanVAE_(dim=CONFIG.base_dim, attn_scales=[], dropout=0.0, **_reference_kwargs())
    fastvideo.load_state_dict(state, strict=True)
    fastvideo.eval().requires_grad_(False)

    reference = diffusers.AutoencoderKLWan(base_dim=CONFIG.base_dim, **_reference_kwargs())
    reference.load_state_dict(single_file.convert_wan_vae_to_diffusers(dict(state)), strict=True)
    reference.eval().requires_grad_(False)

    gen = torch.Generator().manual_seed(1)
    video = torch.rand(1, 3, FRAMES, HEIGHT, WIDTH, generator=gen) * 2 - 1
    latent_frames = 1 + (FRAMES - 1) // TEMPORAL_STRIDE
    latents = torch.randn(1, CONFIG.z_dim, latent_frames, HEIGHT // 8, WIDTH // 8, generator=gen)
    assert sum(ENCODE_CHUNKS) == FRAMES and sum(DECODE_CHUNKS) == latent_frames
    return Sides(ours.requires_grad_(False), fastvideo, reference, video, latents)


def _fastvideo_scale() -> list[torch.Tensor]:
    """The latent scale as `LingBotWorld2WanVAE` / `Wan2_1_VAE` hold it: [mean, 1 / std]."""
    mean = torch.tensor(CONFIG.latent_mean, dtype=torch.float32)
    std = torch.tensor(CONFIG.latent_std, dtype=torch.float32)
    return [mean, 1.0 / std]


def _chunks(x: torch.Tensor, sizes: tuple[int, ...]) -> list[torch.Tensor]:
    return list(torch.split(x, list(sizes), dim=2))


def _frame_bounds(latent_chunks: tuple[int, ...]) -> list[tuple[int, int]]:
    """Video-frame range each latent chunk decodes to: the first latent frame gives 1, later ones 4."""
    bounds, start = [], 0
    for i, n in enumerate(latent_chunks):
        frames = n * TEMPORAL_STRIDE - (TEMPORAL_STRIDE - 1 if i == 0 else 0)
        bounds.append((start, start + frames))
        start += frames
    return bounds


def _latent_bounds(video_chunks: tuple[int, ...]) -> list[tuple[int, int]]:
    """Latent-frame range each video chunk encodes to: 1 + 4k frames give 1 + k, 4k frames give k."""
    bounds, start = [], 0
    for i, n in enumerate(video_chunks):
        latents = n // TEMPORAL_STRIDE + (1 if i == 0 else 0)
        bounds.append((start, start + latents))
        start += latents
    return bounds


def _fastvideo_encode_streaming(model: Any, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
    """FastVideo's encoder driven chunk by chunk through its own conv caches, kept across chunks.

    Within a chunk this is `WanVAE_.encode`'s loop (frame 0 alone, then groups of 4, feat_idx reset
    per group); the caches are cleared once, before the first chunk.
    """
    mean, inv_std = (s.view(1, model.z_dim, 1, 1, 1) for s in _fastvideo_scale())
    model.clear_cache()
    out = []
    for i, chunk in enumerate(chunks):
        groups = [chunk[:, :, :1], *torch.split(chunk[:, :, 1:], 4, dim=2)] if i == 0 else torch.split(chunk, 4, 2)
        feats = [model.encoder(g, feat_cache=model._enc_feat_map, feat_idx=[0]) for g in groups if g.shape[2]]
        mu, _ = model.conv1(torch.cat(feats, dim=2)).chunk(2, dim=1)
        out.append((mu - mean) * inv_std)
    model.clear_cache()
    return out


def _fastvideo_decode_streaming(model: Any, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
    """FastVideo's decoder driven chunk by chunk (one latent frame per call, as `WanVAE_.decode`),
    its conv caches kept across chunks; clamped as `Wan2_1_VAE.decode` does."""
    mean, inv_std = (s.view(1, model.z_dim, 1, 1, 1) for s in _fastvideo_scale())
    model.clear_cache()
    out = []
    for chunk in chunks:
        x = model.conv2(chunk / inv_std + mean)
        frames = [
            model.decoder(x[:, :, i : i + 1], feat_cache=model._feat_map, feat_idx=[0]) for i in range(x.shape[2])
        ]
        out.append(torch.cat(frames, dim=2).float().clamp_(-1, 1))
    model.clear_cache()
    return out


def _diffusers_stats(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(latents_mean, latents_std) as diffusers' Wan pipelines build them: latents_std = 1 / std."""
    shape = (1, model.config.z_dim, 1, 1, 1)
    mean = torch.tensor(model.config.latents_mean, dtype=torch.float32).view(shape)
    latents_std = 1.0 / torch.tensor(model.config.latents_std, dtype=torch.float32).view(shape)
    return mean, latents_std


@torch.no_grad()
def test_latent_statistics_match_diffusers(sides: Sides) -> None:
    mean, std = sides.ours.latent_stats("cpu")
    config = sides.diffusers.config
    assert_agrees("vae latent mean vs diffusers default", mean.flatten(), torch.tensor(config.latents_mean))
    assert_agrees("vae latent std vs diffusers default", std.flatten(), torch.tensor(config.latents_std))


@torch.no_grad()
def test_streaming_encode_matches_fastvideo_one_shot(sides: Sides) -> None:
    state = sides.ours.new_stream_state()
    ours = [sides.ours.encode_stream(chunk, state) for chunk in _chunks(sides.video, ENCODE_CHUNKS)]
    reference = sides.fastvideo.encode(sides.video, _fastvideo_scale())
    assert reference.shape[2] == sum(o.shape[2] for o in ours)
    for i, ((lo, hi), chunk) in enumerate(zip(_latent_bounds(ENCODE_CHUNKS), ours, strict=True)):
        frames = ENCODE_CHUNKS[i]
        assert_agrees(
            f"vae encode, our stream chunk {i} ({frames} frames) vs fastvideo one-shot", chunk, reference[:, :, lo:hi]
        )


@torch.no_grad()
def test_one_shot_encode_matches_fastvideo_streaming(sides: Sides) -> None:
    ours = sides.ours.encode(sides.video)
    reference = _fastvideo_encode_streaming(sides.fastvideo, _chunks(sides.video, ENCODE_CHUNKS))
    for i, ((lo, hi), chunk) in enumerate(zip(_latent_bounds(ENCODE_CHUNKS), reference, strict=True)):
        frames = ENCODE_CHUNKS[i]
        assert_agrees(
            f"vae encode, our one-shot vs fastvideo stream chunk {i} ({frames} frames)", ours[:, :, lo:hi], chunk
        )


@torch.no_grad()
def test_streaming_decode_matches_fastvideo_one_shot(sides: Sides) -> None:
    state = sides.ours.new_stream_state()
    ours = [sides.ours.decode_stream(chunk, state) for chunk in _chunks(sides.latents, DECODE_CHUNKS)]
    reference = sides.fastvideo.decode(sides.latents, _fastvideo_scale()).float().clamp_(-1, 1)
    assert reference.shape[2] == sum(o.shape[2] for o in ours)
    for i, ((lo, hi), chunk) in enumerate(zip(_frame_bounds(DECODE_CHUNKS), ours, strict=True)):
        n = DECODE_CHUNKS[i]
        assert_agrees(
            f"vae decode, our stream chunk {i} ({n} latent frames) vs fastvideo one-shot", chunk, reference[:, :, lo:hi]
        )


@torch.no_grad()
def test_one_shot_decode_matches_fastvideo_streaming(sides: Sides) -> None:
    ours = sides.ours.decode(sides.latents)
    reference = _fastvideo_decode_streaming(sides.fastvideo, _chunks(sides.latents, DECODE_CHUNKS))
    for i, ((lo, hi), chunk) in enumerate(zip(_frame_bounds(DECODE_CHUNKS), reference, strict=True)):
        n = DECODE_CHUNKS[i]
        assert_agrees(
            f"vae decode, our one-shot vs fastvideo stream chunk {i} ({n} latent frames)", ours[:, :, lo:hi], chunk
        )


@torch.no_grad()
def test_streaming_encode_matches_diffusers(sides: Sides) -> None:
    state = sides.ours.new_stream_state()
    ours = torch.cat([sides.ours.encode_stream(c, state) for c in _chunks(sides.video, ENCODE_CHUNKS)], dim=2)
    mean, latents_std = _diffusers_stats(sides.diffusers)
    mu = sides.diffusers.encode(sides.video).latent_dist.mode()
    assert_agrees("vae encode, our stream vs diffusers AutoencoderKLWan", ours, (mu - mean) * latents_std)


@torch.no_grad()
def test_streaming_decode_matches_diffusers(sides: Sides) -> None:
    state = sides.ours.new_stream_state()
    ours = torch.cat([sides.ours.decode_stream(c, state) for c in _chunks(sides.latents, DECODE_CHUNKS)], dim=2)
    mean, latents_std = _diffusers_stats(sides.diffusers)
    reference = sides.diffusers.decode(sides.latents / latents_std + mean).sample
    assert_agrees("vae decode, our stream vs diffusers AutoencoderKLWan", ours, reference)
