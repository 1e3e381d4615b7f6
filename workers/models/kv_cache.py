"""Per-session self-attention KV cache: a rolling window of latent frames with a fixed sink.

Each layer owns one preallocated buffer of `local_attn_size_frames` frames. The first
`sink_size_frames` frames of a session stay forever; the rest roll, oldest evicted first. Keys are
stored already rotated (RoPE at their absolute frame index), so nothing is recomputed on eviction.

A chunk being denoised is *staged*: its K/V are written after the committed frames and attended
to, but the committed length does not move. Only the final t = 0 forward on the clean chunk
*commits*, which makes the chunk part of the history for the next one. Overflow policy: evict the
oldest non-sink frames, so a chunk always sees sink + the most recent frames that fit + itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.models.configs import DiTConfig


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    batch: int
    num_heads: int  # heads held by this rank
    head_dim: int
    tokens_per_frame: int
    chunk_frames: int
    local_attn_size_frames: int  # -1: unbounded (global attention), grows as needed
    sink_size_frames: int

    def __post_init__(self) -> None:
        if self.local_attn_size_frames != -1 and (
            self.local_attn_size_frames < self.chunk_frames + self.sink_size_frames + 1
        ):
            raise ValueError(
                f"window of {self.local_attn_size_frames} frames cannot hold a {self.chunk_frames}-frame "
                f"chunk, {self.sink_size_frames} sink frames and any history"
            )

    @staticmethod
    def for_dit(
        cfg: DiTConfig, tokens_per_frame: int, chunk_frames: int, batch: int = 1, ranks: int = 1
    ) -> KVCacheSpec:
        """A Wan DiT's self-attention cache; with `ranks` (Ulysses), what each rank holds of its heads."""
        return KVCacheSpec(
            num_layers=cfg.num_layers,
            batch=batch,
            num_heads=cfg.num_heads // ranks,
            head_dim=cfg.head_dim,
            tokens_per_frame=tokens_per_frame,
            chunk_frames=chunk_frames,
            local_attn_size_frames=cfg.local_attn_size_frames,
            sink_size_frames=cfg.sink_size_frames,
        )


class LayerKVCache:
    """One layer's buffer. `length` counts committed tokens currently held."""

    def __init__(self, spec: KVCacheSpec, dtype: torch.dtype, device: torch.device) -> None:
        self.spec = spec
        frames = spec.local_attn_size_frames if spec.local_attn_size_frames != -1 else 2 * spec.chunk_frames
        shape = (spec.batch, frames * spec.tokens_per_frame, spec.num_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self.total_committed = 0  # tokens committed over the whole session, evicted ones included

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def _make_room(self, num_new: int) -> None:
        overflow = self.length + num_new - self.capacity
        if overflow <= 0:
            return
        if self.spec.local_attn_size_frames == -1:
            grow = max(self.capacity, overflow)
            pad = self.k.new_zeros((self.k.shape[0], grow, *self.k.shape[2:]))
            self.k = torch.cat([self.k, pad], dim=1)
            self.v = torch.cat([self.v, pad.clone()], dim=1)
            return
        sink = self.spec.sink_size_frames * self.spec.tokens_per_frame
        assert self.length - overflow >= sink, "window too small for sink + chunk"
        keep = self.length - sink - overflow
        src = slice(sink + overflow, sink + overflow + keep)
        dst = slice(sink, sink + keep)
        # Overlapping ranges: clone the source before shifting it left.
        self.k[:, dst] = self.k[:, src].clone()
        self.v[:, dst] = self.v[:, src].clone()
        self.length -= overflow

    def attend_window(
        self, k_new: torch.Tensor, v_new: torch.Tensor, commit: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Place the chunk's K/V after the history; return the K/V its queries attend to."""
        num_new = k_new.shape[1]
        self._make_room(num_new)
        end = self.length + num_new
        self.k[:, self.length : end] = k_new
        self.v[:, self.length : end] = v_new
        if commit:
            self.length = end
            self.total_committed += num_new
        return self.k[:, :end], self.v[:, :end]


class SessionKVCache:
    """All layers' caches for one session on one rank."""

    def __init__(self, spec: KVCacheSpec, dtype: torch.dtype, device: torch.device) -> None:
        self.spec = spec
        self.layers = [LayerKVCache(spec, dtype, device) for _ in range(spec.num_layers)]

    @property
    def committed_frames(self) -> int:
        """Latent frames committed so far: the start frame of the next chunk."""
        return self.layers[0].total_committed // self.spec.tokens_per_frame

    def detach_(self) -> None:
        """Move every layer to fresh buffers holding the same K/V, cut from any autograd graph.

        Training runs a staged forward with gradients and then commits with a t = 0 forward; the
        staged K/V were saved for backward, so the commit must not overwrite them in place.
        """
        for layer in self.layers:
            layer.k, layer.v = layer.k.detach().clone(), layer.v.detach().clone()

    def nbytes(self) -> int:
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self.layers)


def window_mask(
    num_frames: int,
    chunk_frames: int,
    tokens_per_frame: int,
    local_attn_size_frames: int,
    sink_size_frames: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Boolean [L, L] mask (True = may attend) equal to what the rolling cache lets each chunk see.

    Chunk k's queries see their own chunk, the sink frames, and the most recent committed frames
    that fit in `local_attn_size_frames - chunk_frames`. Used for the full-sequence reference
    forward that the streaming path must reproduce.
    """
    frame = torch.arange(num_frames, device=device)
    q_chunk = frame // chunk_frames
    q_start = q_chunk * chunk_frames
    key = frame[None, :]
    same_chunk = q_chunk[:, None] == (key // chunk_frames)
    history = key < q_start[:, None]
    if local_attn_size_frames == -1:
        visible = history
    else:
        recent = local_attn_size_frames - chunk_frames - sink_size_frames
        in_sink = key < sink_size_frames
        in_recent = key >= (q_start[:, None] - recent)
        visible = history & (in_sink | in_recent)
    frame_mask = same_chunk | visible
    return frame_mask.repeat_interleave(tokens_per_frame, 0).repeat_interleave(tokens_per_frame, 1)
