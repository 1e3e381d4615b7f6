"""DiT denoise stage: one session's chunk loop (few-step sampling, then a t = 0 commit forward), one
class per family's DiT (workers/families/family.py opens the right one).

Per session it owns the DiT's caches, the context's K/V (computed once) and a seeded
generator from which all noise is drawn in a fixed order: the chunk's initial noise, then one
re-noise per intermediate step. Same seed, same conditions -> same latents.

Everything a chunk's forwards read lives on the stage's device from the session's start: RoPE
tables, the sampler's timesteps and sigmas, the pixel ray directions, the commit timestep. A
chunk's inputs (the latent condition, which arrives over the tensor channel, and its control: F
camera poses, or the action windows) are on the device before `run_chunk`, which then neither
copies from the host nor reads a value back (tests/workers/models/test_hot_path.py holds it to that).

A chunk is two steps: `sample_chunk` (the sampling forwards: the clean latents the decode waits
for) and `commit_chunk` (the t = 0 forward that writes them to the caches, which only the session's
next chunk reads). The DiT stage replies between the two, so the commit is off the path from a
control to its frames; `run_chunk` does both. The order of work, hence every bit, is the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from workers.models.camera import PluckerEncoder
from workers.models.dit import WanDiT
from workers.models.kv_cache import KVCacheSpec, SessionKVCache
from workers.models.matrix_game.actions import ChunkActions
from workers.models.matrix_game.cache import MatrixGameCache
from workers.models.matrix_game.dit import MatrixGameDiT
from workers.models.presets import ModelPreset
from workers.models.rope import RopeTables
from workers.models.sampler import FewStepSampler, FlowSchedule
from workers.parallel.ulysses import SequenceParallel
from workers.stages.prompt_context import PromptContext


def make_sampler(preset: ModelPreset) -> FewStepSampler:
    schedule = FlowSchedule.table(preset.schedule_kind, preset.num_train_timesteps, preset.sample_shift)
    return FewStepSampler(schedule.subset(preset.timestep_indices, preset.sigma_rule))


def noise_generator(device: torch.device, seed: int) -> torch.Generator:
    """The session's seeded generator on its device; device types without generators of their
    own (`meta`, used to trace a step without running it) draw from a host generator."""
    own = device.type in ("cpu", "cuda")
    return torch.Generator(device=device if own else "cpu").manual_seed(seed)


class SamplingLoop:
    """What every family's session shares: the seeded generator, the sampler on the stage's device,
    and the chunk's order of work (draw the noise, sample at the preset's steps, then one t = 0
    forward on the clean chunk that commits it to the caches)."""

    # The sampled chunk's commit forward until `commit_chunk` runs it: never across commands, so no
    # snapshot holds one (a class default, so sessions saved before it existed restore too).
    _commit: Callable[[], object] | None = None

    def __init__(self, preset: ModelPreset, device: torch.device, seed: int, chunk_latent_frames: int) -> None:
        self.device = device
        self.sampler = make_sampler(preset).to(device)
        self.chunk = chunk_latent_frames
        self.latent_hw = (preset.latent_height, preset.latent_width)
        self.generator = noise_generator(device, seed)
        self.commit_t = torch.zeros(1, device=device)

    def sample_chunk(self, cond: torch.Tensor, inputs: Any) -> torch.Tensor:
        """cond [1, 20, C, h, w] and the chunk's control input, on the device -> the chunk's clean
        latents [1, 16, C, h, w]; its commit is due (`commit_chunk`) before the next chunk. `cond`
        is read again by the commit: it must not change until then."""
        raise NotImplementedError

    def commit_chunk(self) -> None:
        """The sampled chunk's t = 0 forward: its clean K/V into the caches, so the next chunk
        attends to what was actually shown."""
        commit, self._commit = self._commit, None
        if commit is None:
            raise RuntimeError("no sampled chunk to commit")
        with torch.no_grad():
            commit()

    def run_chunk(self, cond: torch.Tensor, inputs: Any) -> torch.Tensor:
        """A whole chunk: sampled, then committed."""
        x0 = self.sample_chunk(cond, inputs)
        self.commit_chunk()
        return x0

    def denoise(self, forward: Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]) -> torch.Tensor:
        """forward(x_t, t, commit) -> velocity; returns the chunk's clean latents [1, 16, C, h, w]
        and leaves their commit forward due."""
        if self._commit is not None:
            raise RuntimeError("the previous chunk was not committed")
        noise = torch.randn((1, 16, self.chunk, *self.latent_hw), generator=self.generator, device=self.device)
        x0 = self.sampler.sample(noise, lambda x_t, t: forward(x_t, t, False), self.generator)
        self._commit = lambda: forward(x0, self.commit_t, True)
        return x0


class DenoiseSession(SamplingLoop):
    """LingBot-World: camera poses in, the self-attention KV cache and the prompt's K/V kept; the
    prompt can change from a chunk on (workers/stages/prompt_context.py)."""

    def __init__(
        self,
        dit: WanDiT,
        preset: ModelPreset,
        text_embeddings: torch.Tensor,
        seed: int,
        chunk_latent_frames: int,
        sp: SequenceParallel | None = None,
        prompt: str = "",
    ) -> None:
        cfg = preset.dit
        ranks = 1 if sp is None else sp.world_size
        device = dit.patch_embedding.weight.device
        super().__init__(preset, device, seed, chunk_latent_frames)
        self.dit = dit
        self.sp = sp
        _, ph, pw = cfg.patch_size
        self.rope = RopeTables(cfg.head_dim, preset.latent_height // ph, preset.latent_width // pw, device)
        self.rays = PluckerEncoder(preset, device)
        # Ulysses: each rank caches its own heads.
        spec = KVCacheSpec.for_dit(cfg, preset.tokens_per_latent_frame, chunk_latent_frames, ranks=ranks)
        self.kv_cache = SessionKVCache(spec, dit.patch_embedding.weight.dtype, device)
        self.prompt = PromptContext(prompt, text_embeddings.to(device), cfg.text_len)
        with torch.no_grad():
            self.text_kv = dit.text_kv([self.prompt.embeddings])

    def change_prompt(self, embeddings: torch.Tensor, text: str, transition_chunks: int) -> None:
        """A new prompt's embeddings (on the device), read from the next chunk on (copied here)."""
        self.prompt.change(text, embeddings, transition_chunks)

    def prompt_receipt(self) -> dict[str, Any]:
        return self.prompt.receipt()

    @torch.no_grad()
    def sample_chunk(self, cond: torch.Tensor, poses: torch.Tensor) -> torch.Tensor:
        """cond [1, 20, C, h, w], poses [C, 4, 4] (relative, see CameraTrack.next_inputs), both on
        the stage's device -> clean latents [1, 16, C, h, w]."""
        changed = self.prompt.next_chunk()
        if changed is not None:  # a prompt change reaches this chunk: every block's text K/V anew
            self.text_kv = []  # the old K/V go first: a change never holds two prompts' K/V at once
            self.text_kv = self.dit.text_kv([changed])
        camera = self.dit.chunk_camera(self.rays.cells(poses)[None], sp=self.sp)
        start = self.kv_cache.committed_frames

        def forward(x: torch.Tensor, t: torch.Tensor, commit: bool) -> torch.Tensor:
            return self.dit(x, cond, t, self.text_kv, camera, start, self.kv_cache, commit, sp=self.sp, rope=self.rope)

        return self.denoise(forward)


class ActionDenoiseSession(SamplingLoop):
    """Matrix-Game: per-frame keyboard and mouse actions in; the self-attention, mouse and keyboard
    caches kept, staged by the sampling forwards and committed together by the t = 0 one; the first
    frame's CLIP tokens as K/V, computed once."""

    def __init__(
        self, dit: MatrixGameDiT, preset: ModelPreset, clip_tokens: torch.Tensor, seed: int, chunk_latent_frames: int
    ) -> None:
        cfg = dataclasses.replace(dit.cfg, chunk_frames=chunk_latent_frames)
        weight = dit.patch_embedding.weight
        super().__init__(preset, weight.device, seed, chunk_latent_frames)
        self.dit = dit
        _, ph, pw = cfg.patch_size
        self.rope = RopeTables(cfg.head_dim, preset.latent_height // ph, preset.latent_width // pw, self.device)
        self.cache = MatrixGameCache(cfg, 1, preset.tokens_per_latent_frame, weight.dtype, self.device)
        with torch.no_grad():
            self.image_kv = dit.image_kv(clip_tokens[None].to(self.device))

    def change_prompt(self, context: torch.Tensor, text: str, transition_chunks: int) -> None:
        raise NotImplementedError("Matrix-Game takes no text: its prompt cannot change")

    def prompt_receipt(self) -> None:
        return None

    @torch.no_grad()
    def sample_chunk(self, cond: torch.Tensor, actions: ChunkActions) -> torch.Tensor:
        """cond [1, 20, C, h, w] and the chunk's action windows (ActionTrack.next_inputs), both on the
        stage's device -> clean latents [1, 16, C, h, w]."""
        start = self.cache.committed_frames

        def forward(x: torch.Tensor, t: torch.Tensor, commit: bool) -> torch.Tensor:
            return self.dit(x, cond, t, self.image_kv, actions, start, self.cache, commit, rope=self.rope)

        return self.denoise(forward)
