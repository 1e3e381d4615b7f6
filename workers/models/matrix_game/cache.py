"""A Matrix-Game session's rolling caches: self-attention in every block, and the mouse and
keyboard caches of the action blocks.

All three follow `workers/models/kv_cache.py`: a window of `local_attn_size_frames` latent frames,
keys stored already rotated at their absolute frame, a chunk's sampling forwards *staged* (written
after the history and attended to, the committed length unchanged) and only the t = 0 forward on the
clean chunk committing it. The release keeps no sink frames. The caches differ in what a "frame"
holds: S tokens for self-attention, one key per spatial token (B·S sequences) for the mouse, one
key per sample for the keyboard.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from workers.models.kv_cache import KVCacheSpec, SessionKVCache
from workers.models.matrix_game.config import MatrixGameConfig


class MatrixGameCache:
    def __init__(
        self,
        cfg: MatrixGameConfig,
        batch: int,
        tokens_per_frame: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.tokens_per_frame = tokens_per_frame
        self.self_attn = SessionKVCache(
            KVCacheSpec(
                num_layers=cfg.num_layers,
                batch=batch,
                num_heads=cfg.num_heads,
                head_dim=cfg.head_dim,
                tokens_per_frame=tokens_per_frame,
                chunk_frames=cfg.chunk_frames,
                local_attn_size_frames=cfg.local_attn_size_frames,
                sink_size_frames=cfg.sink_size_frames,
            ),
            dtype,
            device,
        )
        action = KVCacheSpec(
            num_layers=cfg.action_blocks,
            batch=batch,
            num_heads=cfg.action_heads,
            head_dim=cfg.action_head_dim,
            tokens_per_frame=1,
            chunk_frames=cfg.chunk_frames,
            local_attn_size_frames=cfg.local_attn_size_frames,
            sink_size_frames=cfg.sink_size_frames,
        )
        self.keyboard = SessionKVCache(action, dtype, device)  # [B, window, heads, head_dim] per block
        per_token = replace(action, batch=batch * tokens_per_frame)
        # [B·S, window, heads, head_dim] per block
        self.mouse = None if cfg.mouse_dim is None else SessionKVCache(per_token, dtype, device)

    @property
    def committed_frames(self) -> int:
        """Latent frames committed so far: the start frame of the next chunk."""
        return self.self_attn.committed_frames

    def nbytes(self) -> int:
        caches = (self.self_attn, self.keyboard, self.mouse)
        return sum(cache.nbytes() for cache in caches if cache is not None)
