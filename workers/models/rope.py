"""3D rotary position embedding over (latent frame, row, column), as in the Wan DiT.

The head dimension is split into a time part and two equal spatial parts (for head dim 128:
44 / 42 / 42 real channels). Time positions are absolute latent-frame indices, so a chunk that
starts at frame `start_frame` is rotated exactly as it would be inside one long sequence; that is
what lets a KV cache hold already-rotated keys.

`RopeTables` lives on the stage's device: the inverse frequencies and the spatial angles are built
there once, and a chunk's time angles are computed there from its start frame, so a forward
never builds tables on the host nor copies them over. Angles are float64 (absolute frame indices
grow without bound in a long session); the cos/sin tables are float32.
"""

from __future__ import annotations

import torch


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Complex-pair counts for (time, height, width) of one head."""
    pairs = head_dim // 2
    spatial = pairs // 3
    return pairs - 2 * spatial, spatial, spatial


def inverse_frequencies(num_pairs: int, device: torch.device, theta: float = 10000.0) -> torch.Tensor:
    exponent = torch.arange(0, 2 * num_pairs, 2, dtype=torch.float64, device=device) / (2 * num_pairs)
    return 1.0 / theta**exponent


def rotation_angles(start: int, count: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Positions start..start+count-1 -> [count, num_pairs] rotation angles (float64)."""
    positions = torch.arange(start, start + count, device=inv_freq.device)
    return positions.to(torch.float64)[:, None] * inv_freq[None, :]


class RopeTables:
    """cos/sin tables for one token grid on one device; the last chunk's tables are kept, since
    every forward of a chunk (the sampling steps and the commit) uses the same ones."""

    def __init__(self, head_dim: int, grid_h: int, grid_w: int, device: torch.device) -> None:
        n_t, n_h, n_w = rope_split(head_dim)
        self.grid = (grid_h, grid_w)
        self.device = device
        self._inv_freq_t = inverse_frequencies(n_t, device)
        a_h = rotation_angles(0, grid_h, inverse_frequencies(n_h, device))
        a_w = rotation_angles(0, grid_w, inverse_frequencies(n_w, device))
        self._spatial = torch.cat(
            [a_h[:, None, :].expand(grid_h, grid_w, n_h), a_w[None, :, :].expand(grid_h, grid_w, n_w)], dim=-1
        )  # [gh, gw, n_h + n_w]
        self._last: tuple[int, int, tuple[torch.Tensor, torch.Tensor]] | None = None

    def cos_sin(self, start_frame: int, num_frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables of shape [num_frames·grid_h·grid_w, 1, head_dim/2] in float32."""
        if self._last is not None and self._last[:2] == (start_frame, num_frames):
            return self._last[2]
        gh, gw = self.grid
        a_t = rotation_angles(start_frame, num_frames, self._inv_freq_t)
        angles = torch.cat(
            [
                a_t[:, None, None, :].expand(num_frames, gh, gw, a_t.shape[-1]),
                self._spatial[None].expand(num_frames, gh, gw, self._spatial.shape[-1]),
            ],
            dim=-1,
        ).reshape(num_frames * gh * gw, 1, -1)
        tables = (angles.cos().float(), angles.sin().float())
        self._last = (start_frame, num_frames, tables)
        return tables


def rope_cos_sin(
    head_dim: int, start_frame: int, num_frames: int, grid_h: int, grid_w: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's tables without keeping any (tests and one-off forwards)."""
    return RopeTables(head_dim, grid_h, grid_w, device).cos_sin(start_frame, num_frames)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent channel pairs of x [B, L, heads, head_dim] by the tables for L tokens."""
    dtype = x.dtype
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).to(dtype)
