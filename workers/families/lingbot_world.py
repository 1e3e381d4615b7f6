"""The LingBot-World family: a Wan causal DiT steered by camera poses (Plücker rays), conditioned on
the prompt's umT5 embeddings and the start image's VAE latent. LingBot-World v2 (14B, 1.3B), the
embedded `gridworld` and the `tiny` fixture.

Its pieces are in workers/models (the DiT `dit.py`, umT5 `t5.py`, the camera track `camera.py`, the
loaders `components.py`) and workers/stages/denoise.py (the denoise session).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from workers.families.family import ControlTrack, ModelFamily, SessionStateBytes
from workers.models import components
from workers.models.camera import CameraTrack
from workers.models.configs import Family
from workers.models.dit import WanDiT
from workers.models.kernels import DEFAULT_KERNELS, KernelConfig, apply_to_dit
from workers.models.loading import KeyReport
from workers.models.presets import ModelPreset
from workers.models.t5 import TextEncoder, UMT5Encoder
from workers.parallel.ulysses import SequenceParallel
from workers.stages.denoise import DenoiseSession


class PromptEncoder:
    """umT5: the session's context is its prompt's embeddings (the start image conditions through the VAE)."""

    def __init__(self, text_encoder: TextEncoder) -> None:
        self.text_encoder = text_encoder

    @torch.no_grad()
    def encode(self, image: torch.Tensor, prompt: str) -> torch.Tensor:
        return self.text_encoder.encode([prompt])[0]

    @torch.no_grad()
    def encode_prompt(self, prompt: str) -> torch.Tensor:
        return self.text_encoder.encode([prompt])[0]


class LingBotWorld(ModelFamily):
    family = Family.LINGBOT_WORLD
    context_name = "umT5"
    live_prompts = True

    def meta_components(self, preset: ModelPreset) -> dict[str, nn.Module]:
        return components.meta_components(preset)

    def build_dit(self, preset: ModelPreset) -> Callable[[], nn.Module]:
        return lambda: WanDiT(preset.dit)

    def load_dit(
        self,
        preset: ModelPreset,
        device: torch.device,
        checkpoint_dir: Path | None,
        weights_seed: int = 0,
        kernels: KernelConfig | None = None,
        dtype: torch.dtype | None = None,
    ) -> nn.Module:
        dit = components.load_dit(preset, device, checkpoint_dir, weights_seed, dtype)
        return apply_to_dit(dit, kernels or DEFAULT_KERNELS, device)

    def load_context_encoder(
        self,
        preset: ModelPreset,
        device: torch.device,
        checkpoint_dir: Path | None,
        weights_seed: int = 0,
        dtype: torch.dtype | None = None,
    ) -> PromptEncoder:
        return PromptEncoder(components.load_text_encoder(preset, device, checkpoint_dir, weights_seed, dtype))

    def context_shape(self, preset: ModelPreset) -> tuple[int, int]:
        t5 = components.text_config(preset)
        return t5.text_len, t5.dim

    def context_encoder_module(self, preset: ModelPreset) -> Callable[[], nn.Module]:
        return lambda: UMT5Encoder(components.text_config(preset))

    def trace_context_encoder(self, module: nn.Module, preset: ModelPreset, device: torch.device) -> None:
        ids = torch.zeros(1, components.text_config(preset).text_len, dtype=torch.long, device=device)
        module(ids, torch.ones_like(ids))

    def control_track(self, preset: ModelPreset) -> ControlTrack:
        return CameraTrack.for_preset(preset)

    def describe_inputs(self, inputs: Any) -> dict[str, Any]:
        assert isinstance(inputs, torch.Tensor)
        return {"poses": inputs.tolist()}  # [F, 4, 4] camera-to-camera of the chunk's latent frames

    def open_denoise(
        self,
        dit: nn.Module,
        preset: ModelPreset,
        context: torch.Tensor,
        seed: int,
        chunk_latent_frames: int,
        sp: SequenceParallel | None = None,
        prompt: str = "",
    ) -> DenoiseSession:
        assert isinstance(dit, WanDiT)
        return DenoiseSession(dit, preset, context, seed, chunk_latent_frames, sp, prompt)

    def session_state_bytes(self, preset: ModelPreset, dtype: torch.dtype) -> SessionStateBytes:
        cfg = preset.dit
        size = torch.empty((), dtype=dtype).element_size()
        window = cfg.local_attn_size_frames if cfg.local_attn_size_frames != -1 else 2 * preset.chunk_latent_frames
        kv = cfg.num_layers * 2 * window * preset.tokens_per_latent_frame * cfg.dim * size
        text = cfg.num_layers * 2 * cfg.text_len * cfg.dim * size
        return SessionStateBytes(kv_cache_bytes=kv, context_kv_bytes=text)

    def one_layer(self, preset: ModelPreset) -> ModelPreset:
        return dataclasses.replace(preset, dit=dataclasses.replace(preset.dit, num_layers=1))

    def verify(self, preset: ModelPreset, checkpoint_dir: Path) -> dict[str, KeyReport | str]:
        return components.verify_checkpoint(preset, checkpoint_dir)


LINGBOT_WORLD = LingBotWorld()
