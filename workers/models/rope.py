"""3D rotary position embedding over (latent frame, row, column), as in the Wan DiT.

The head dimension is split into a time part and two equal spatial parts (for head dim 128:
44 / 42 / 42 real channels). Time positions are absolute latent-frame indices, so a chunk that
starts at frame `start_frame` is rotated exactly as it would be inside one long sequence; that is
what lets a KV cache hold already-rotated keys.
"""

from __future__ import annotations

import torch


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Complex-pair counts for (time, height, width) of one head."""
    pairs = head_dim // 2
    spatial = pairs // 3
    return pairs - 2 * spatial, spatial, spatial


def _angles(positions: torch.Tensor, num_pairs: int, theta: float = 10000.0) -> torch.Tensor:
    """[n] positions -> [n, num_pairs] rotation angles (float64 for long sessions)."""
    exponent = torch.arange(0, 2 * num_pairs, 2, dtype=torch.float64) / (2 * num_pairs)
    inv_freq = 1.0 / theta**exponent
    return positions.to(torch.float64)[:, None] * inv_freq[None, :]


def rope_cos_sin(
    head_dim: int, start_frame: int, num_frames: int, grid_h: int, grid_w: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape [num_frames·grid_h·grid_w, 1, head_dim/2] in float32."""
    n_t, n_h, n_w = rope_split(head_dim)
    a_t = _angles(torch.arange(start_frame, start_frame + num_frames), n_t)
    a_h = _angles(torch.arange(grid_h), n_h)
    a_w = _angles(torch.arange(grid_w), n_w)
    angles = torch.cat(
        [
            a_t[:, None, None, :].expand(num_frames, grid_h, grid_w, n_t),
            a_h[None, :, None, :].expand(num_frames, grid_h, grid_w, n_h),
            a_w[None, None, :, :].expand(num_frames, grid_h, grid_w, n_w),
        ],
        dim=-1,
    ).reshape(num_frames * grid_h * grid_w, 1, -1)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent channel pairs of x [B, L, heads, head_dim] by the tables for L tokens."""
    dtype = x.dtype
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).to(dtype)
