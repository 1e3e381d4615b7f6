"""DiT denoise stage: one session's chunk loop (few-step sampling, then a t = 0 commit forward).

Per session it owns the self-attention KV cache, the text K/V (computed once) and a seeded
generator from which all noise is drawn in a fixed order: the chunk's initial noise, then one
re-noise per intermediate step. Same seed, same conditions -> same latents.
"""

from __future__ import annotations

import torch

from workers.models.dit import WanDiT
from workers.models.kv_cache import KVCacheSpec, SessionKVCache
from workers.models.presets import ModelPreset
from workers.models.sampler import FewStepSampler, FlowSchedule
from workers.parallel.ulysses import SequenceParallel


def make_sampler(preset: ModelPreset) -> FewStepSampler:
    schedule = FlowSchedule.unipc(preset.num_train_timesteps, preset.sample_shift)
    return FewStepSampler(schedule.subset(preset.timestep_indices))


class DenoiseSession:
    def __init__(
        self,
        dit: WanDiT,
        preset: ModelPreset,
        text_embeddings: list[torch.Tensor],
        seed: int,
        chunk_latent_frames: int,
        sp: SequenceParallel | None = None,
    ) -> None:
        cfg = preset.dit
        ranks = 1 if sp is None else sp.world_size
        device = dit.patch_embedding.weight.device
        self.dit = dit
        self.sp = sp
        self.sampler = make_sampler(preset)
        self.chunk = chunk_latent_frames
        self.latent_hw = (preset.latent_height, preset.latent_width)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        spec = KVCacheSpec(
            num_layers=cfg.num_layers,
            batch=1,
            num_heads=cfg.num_heads // ranks,  # Ulysses: each rank caches its own heads
            head_dim=cfg.head_dim,
            tokens_per_frame=preset.tokens_per_latent_frame,
            chunk_frames=chunk_latent_frames,
            local_attn_size_frames=cfg.local_attn_size_frames,
            sink_size_frames=cfg.sink_size_frames,
        )
        self.kv_cache = SessionKVCache(spec, dit.patch_embedding.weight.dtype, device)
        with torch.no_grad():
            self.text_kv = dit.text_kv([u.to(device) for u in text_embeddings])

    @torch.no_grad()
    def run_chunk(self, cond: torch.Tensor, plucker_cells: torch.Tensor) -> torch.Tensor:
        """cond [1, 20, C, h, w], plucker_cells [384, C, h, w] -> clean latents [1, 16, C, h, w]."""
        device = self.dit.patch_embedding.weight.device
        cond = cond.to(device)
        camera = self.dit.chunk_camera(plucker_cells[None].to(device), sp=self.sp)
        start = self.kv_cache.committed_frames
        noise = torch.randn((1, 16, self.chunk, *self.latent_hw), generator=self.generator, device=device)

        def velocity(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return self.dit(x_t, cond, t, self.text_kv, camera, start, self.kv_cache, commit=False, sp=self.sp)

        x0 = self.sampler.sample(noise, velocity, self.generator)
        # Commit clean K/V so the next chunk attends to what was actually shown.
        self.dit(
            x0, cond, torch.zeros(1, device=device), self.text_kv, camera, start, self.kv_cache, commit=True, sp=self.sp
        )
        return x0
