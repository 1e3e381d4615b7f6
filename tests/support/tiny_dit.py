"""A 2-layer DiT (dim 64, 4 heads) and seeded inputs on an 8×8 latent grid, for the model and parallel tests."""

from __future__ import annotations

import torch

from workers.models.dit import WanDiT
from workers.models.presets import DiTConfig
from workers.models.random_init import init_random_weights

LAT_H = LAT_W = 8  # latent cells -> 4×4 = 16 tokens per frame
TOKENS = (LAT_H // 2) * (LAT_W // 2)


def make_dit(local: int, sink: int) -> WanDiT:
    cfg = DiTConfig(
        dim=64,
        ffn_dim=128,
        num_layers=2,
        num_heads=4,
        freq_dim=32,
        text_dim=16,
        text_len=8,
        camera_cell_pixels=8,
        local_attn_size_frames=local,
        sink_size_frames=sink,
    )
    dit = WanDiT(cfg)
    init_random_weights(dit, seed=0)
    return dit.eval()


def dit_inputs(seed: int, frames: int) -> dict[str, torch.Tensor]:
    """Condition (20 ch), camera cells (384 ch), text tokens and noise for `frames` latent frames."""
    g = torch.Generator().manual_seed(seed)
    return {
        "cond": torch.randn(1, 20, frames, LAT_H, LAT_W, generator=g),
        "cam": torch.randn(1, 384, frames, LAT_H, LAT_W, generator=g),
        "text": torch.randn(5, 16, generator=g),
        "x": torch.randn(1, 16, frames, LAT_H, LAT_W, generator=g),
    }
