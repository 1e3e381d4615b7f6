"""VAE decode stage: clean latents -> uint8 RGB frames, streaming per session.

The first chunk of C latent frames yields 4C−3 video frames, every later one 4C; the VAE's causal
caches carry across chunks so the seams are exactly those of a one-shot decode.
"""

from __future__ import annotations

import numpy as np
import torch

from workers.images import to_uint8_frames
from workers.models.vae import WanVAE


class DecodeSession:
    def __init__(self, vae: WanVAE) -> None:
        self.vae = vae
        self.state = vae.new_stream_state()

    @torch.no_grad()
    def run_chunk(self, latents: torch.Tensor) -> np.ndarray:
        """latents [1, 16, C, h, w] -> frames [T, H, W, 3] uint8."""
        device = next(self.vae.parameters()).device
        video = self.vae.decode_stream(latents.to(device), self.state)  # [1, 3, T, H, W]
        return to_uint8_frames(video[0])
