"""VAE decode stage: clean latents -> uint8 RGB frames, streaming per session.

The first chunk of C latent frames yields 4C−3 video frames, every later one 4C; the VAE's causal
caches carry across chunks so the seams are exactly those of a one-shot decode. With a
`SpatialShard`, each rank decodes its band of latent rows (halo rows exchanged with its neighbours)
and rank 0 receives the gathered frames.
"""

from __future__ import annotations

import numpy as np
import torch

from workers.images import to_uint8_frames
from workers.models.vae import WanVAE
from workers.parallel.halo import SpatialShard


class DecodeSession:
    def __init__(self, vae: WanVAE, shard: SpatialShard | None = None) -> None:
        self.vae = vae
        self.shard = shard
        self.state = vae.new_stream_state()

    @torch.no_grad()
    def run_chunk(self, latents: torch.Tensor) -> np.ndarray | None:
        """latents [1, 16, C, h, w] (this rank's band when sharded) -> frames [T, H, W, 3] uint8 (rank 0)."""
        device = next(self.vae.parameters()).device
        latents = latents.to(device)
        if self.shard is None:
            video = self.vae.decode_stream(latents, self.state)  # [1, 3, T, H, W]
        else:
            video = self.vae.decode_stream_sharded(latents, self.state, self.shard, gather_to=0)
            if video is None:
                return None
        return to_uint8_frames(video[0])
