"""VAE decode stage: clean latents -> uint8 RGB frames, streaming per session.

The first chunk of C latent frames yields 4C−3 video frames, every later one 4C; the VAE's causal
caches carry across chunks so the seams are exactly those of a one-shot decode. Frames come out in
parts as soon as they are decoded (`run_chunk_parts`): one latent frame's 4 frames at a time, the
first chunk's single-frame latent frame 0 joined to the next, so a viewer's pacer can start a chunk
before its last frames exist and every part covers at least the time the next one takes.

A later chunk's first latent frame is decoded in two groups, its first `FIRST_PART_FRAMES` frames
then the rest, and (`first_frames_early`: the decode handler asks for it while it decodes for one
session) the first group is handed on as soon as it exists, so the frames a control made reach the
viewer sooner. The layers after the last temporal upsampling run twice, on half the frames each
time: on one core at 128×128 the first 2 frames are out 36 % sooner than all 4 were, for 4 % more
decode time (`python -m benchmarks.components`). The groups are fixed by the chunk, so the frames
are the same whichever way they are handed on.

With a `SpatialShard`, each rank decodes its band of latent rows (halo rows exchanged with its
neighbours) and rank 0 receives the gathered frames; sharded or banded, a latent frame's frames
come out together.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from workers.images import to_uint8_frames
from workers.models.vae import WanVAE
from workers.parallel.halo import SpatialShard

# Half a latent frame's 4: the first part covers (125 ms at 16 FPS) the time the other half takes.
FIRST_PART_FRAMES = 2


def part_bounds(num_latent_frames: int, first_in_stream: bool) -> list[tuple[int, int]]:
    """Latent-frame ranges decoded and handed on together: one each, except that a stream's first
    latent frame (a single video frame) goes with the one after it."""
    starts = list(range(num_latent_frames))
    if first_in_stream and num_latent_frames > 1:
        starts.remove(1)
    return [(lo, hi) for lo, hi in zip(starts, [*starts[1:], num_latent_frames], strict=True)]


class DecodeSession:
    def __init__(self, vae: WanVAE, shard: SpatialShard | None = None) -> None:
        self.vae = vae
        self.shard = shard
        self.state = vae.new_stream_state()

    @torch.no_grad()
    def run_chunk_parts(
        self, latents: torch.Tensor, first_frames_early: bool = True
    ) -> Iterator[tuple[np.ndarray | None, bool]]:
        """latents [1, 16, C, h, w] (this rank's band when sharded) -> (frames [T, H, W, 3] uint8,
        is the last part) per part, in order; frames are None on ranks other than 0 of a shard.
        `first_frames_early` False: a chunk's first frames go with the rest of their latent frame
        (the same frames, bit for bit; only when they are handed on differs)."""
        device = next(self.vae.parameters()).device
        latents = latents.to(device)
        bounds = part_bounds(latents.shape[2], first_in_stream=self.state.latents_decoded == 0)
        apart = FIRST_PART_FRAMES if self.shard is None and self.vae.bands == 1 else 0
        for i, (lo, hi) in enumerate(bounds):
            part = latents[:, :, lo:hi]
            last = i == len(bounds) - 1
            if self.shard is None:
                # video [1, 3, T, H, W]; a later chunk's first latent frame in two pieces
                pieces = self.vae.decode_stream_parts(part, self.state, first_frames=apart if i == 0 else 0)
                if first_frames_early:
                    for video, whole in pieces:
                        yield to_uint8_frames(video[0]), last and whole
                else:
                    yield to_uint8_frames(torch.cat([video for video, _ in pieces], dim=2)[0]), last
            else:
                gathered = self.vae.decode_stream_sharded(part, self.state, self.shard, gather_to=0)
                yield None if gathered is None else to_uint8_frames(gathered[0]), last

    def run_chunk(self, latents: torch.Tensor) -> np.ndarray | None:
        """The whole chunk's frames [T, H, W, 3] uint8 at once (rank 0; None on the others)."""
        parts = [frames for frames, _ in self.run_chunk_parts(latents)]
        shown = [p for p in parts if p is not None]
        return np.concatenate(shown) if shown else None
