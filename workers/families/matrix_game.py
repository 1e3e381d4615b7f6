"""The Matrix-Game family: Wan-1.3B's causal trunk with keyboard and mouse action modules, conditioned
on the start frame's CLIP tokens (no text) and its VAE latent. Three released distillations and the
`matrix-game-2-tiny` fixture (workers/models/presets.py).

Files (workers/models/matrix_game/variants.py lists them): the variant's DiT safetensors file, whose
names carry the training wrapper's `model.` prefix, streamed through a table that strips it; the
CLIP `.pth` of both towers, of which only the visual tower's used weights are read
(workers/models/clip.py `tower_name`); `Wan2.1_VAE.pth`, shared with LingBot-World. Every load is
strict and checked from the headers first (workers/models/loading.py).

Precision follows the LingBot family's policy (workers/models/components.py `Precision`): on CUDA the
DiT and CLIP in bf16, as released, the VAE in fp32; on CPU everything in fp32.

The action module has no sequence-parallel form: the DiT runs on one rank.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from workers.families.family import ControlTrack, ModelFamily, SessionStateBytes
from workers.models import loading
from workers.models.clip import CLIPVisionTower, preprocess, tower_name
from workers.models.components import Precision, load_component
from workers.models.configs import CLIPVisionConfig, Family
from workers.models.diffusers_layout import NameTable, Rename
from workers.models.kernels import DEFAULT_KERNELS, KernelConfig, apply_attention
from workers.models.matrix_game.actions import ChunkActions
from workers.models.matrix_game.cache import MatrixGameCache
from workers.models.matrix_game.controls import ActionTrack
from workers.models.matrix_game.dit import RELEASE_PREFIX, MatrixGameDiT
from workers.models.matrix_game.variants import CLIP_FILE, MatrixGameVariant
from workers.models.presets import ModelPreset
from workers.models.vae import WanVAE
from workers.parallel.ulysses import SequenceParallel
from workers.stages.denoise import ActionDenoiseSession

# The released DiT files' names -> the module's: the wrapper's prefix goes. A name without it is taken
# as the module's own, so a file saved from the bare model loads the same; anything else is reported
# as unexpected by the strict check.
RELEASE_NAMES = NameTable("DiT", (Rename(re.compile(re.escape(RELEASE_PREFIX) + "(.+)"), r"\1"),))


def variant(preset: ModelPreset) -> MatrixGameVariant:
    if preset.matrix_game is None:
        raise ValueError(f"{preset.name} is not a Matrix-Game preset")
    return preset.matrix_game


def dit_source(preset: ModelPreset, checkpoint_dir: Path) -> loading.RenamedSource:
    path = checkpoint_dir / variant(preset).dit_file
    if not path.is_file():
        raise FileNotFoundError(f"missing checkpoint file {path}")
    return loading.RenamedSource(loading.SafetensorsSource((path,)), RELEASE_NAMES)


def clip_source(preset: ModelPreset, checkpoint_dir: Path) -> loading.PthSource:
    config = variant(preset).clip
    return loading.PthSource(checkpoint_dir / CLIP_FILE, rename=lambda key: tower_name(key, config))


class ImageTokenEncoder:
    """The start image's CLIP tokens: Matrix-Game's only cross-attention context. The prompt is not
    read: the model takes no text."""

    def __init__(self, tower: CLIPVisionTower, config: CLIPVisionConfig) -> None:
        self.tower, self.config = tower, config

    @torch.no_grad()
    def encode(self, image: torch.Tensor, prompt: str) -> torch.Tensor:
        device = self.tower.patch_embedding.weight.device
        return self.tower(preprocess(image.to(device), self.config))[0]  # [257, 1280] float32

    def encode_prompt(self, prompt: str) -> torch.Tensor:
        raise NotImplementedError("Matrix-Game takes no text: its prompt cannot change")


class MatrixGame(ModelFamily):
    family = Family.MATRIX_GAME
    context_name = "CLIP ViT-H/14"
    max_dit_ranks = 1

    def meta_components(self, preset: ModelPreset) -> dict[str, nn.Module]:
        v = variant(preset)
        return {
            "dit": loading.build_on_meta(lambda: MatrixGameDiT(v.model)),
            "vae": loading.build_on_meta(lambda: WanVAE(preset.vae)),
            "clip": loading.build_on_meta(lambda: CLIPVisionTower(v.clip)),
        }

    def build_dit(self, preset: ModelPreset) -> Callable[[], nn.Module]:
        model = variant(preset).model
        return lambda: MatrixGameDiT(model)

    def load_dit(
        self,
        preset: ModelPreset,
        device: torch.device,
        checkpoint_dir: Path | None,
        weights_seed: int = 0,
        kernels: KernelConfig | None = None,
        dtype: torch.dtype | None = None,
    ) -> nn.Module:
        kernels = kernels or DEFAULT_KERNELS
        if kernels.compile:
            raise ValueError(f"{preset.name}: compile is implemented for the LingBot-World DiT only")
        dtype = Precision.for_device(device).dit if dtype is None else dtype
        dit = load_component(
            "DiT",
            self.build_dit(preset),
            preset,
            device,
            checkpoint_dir,
            lambda directory: dit_source(preset, directory),
            dtype,
            "dit",
            weights_seed,
        )
        return apply_attention(dit, kernels, device)

    def load_context_encoder(
        self,
        preset: ModelPreset,
        device: torch.device,
        checkpoint_dir: Path | None,
        weights_seed: int = 0,
        dtype: torch.dtype | None = None,
    ) -> ImageTokenEncoder:
        config = variant(preset).clip
        dtype = Precision.for_device(device).context if dtype is None else dtype
        tower = load_component(
            "CLIP",
            lambda: CLIPVisionTower(config),
            preset,
            device,
            checkpoint_dir,
            lambda directory: clip_source(preset, directory),
            dtype,
            "context",
            weights_seed,
        )
        return ImageTokenEncoder(tower, config)  # type: ignore[arg-type]

    def context_shape(self, preset: ModelPreset) -> tuple[int, int]:
        clip = variant(preset).clip
        return clip.num_tokens, clip.dim

    def context_encoder_module(self, preset: ModelPreset) -> Callable[[], nn.Module]:
        config = variant(preset).clip
        return lambda: CLIPVisionTower(config)

    def trace_context_encoder(self, module: nn.Module, preset: ModelPreset, device: torch.device) -> None:
        size = variant(preset).clip.image_size
        module(torch.zeros(1, 3, size, size, device=device))

    def control_track(self, preset: ModelPreset) -> ControlTrack:
        v = variant(preset)
        return ActionTrack(v.model, v.mapping)

    def describe_inputs(self, inputs: Any) -> dict[str, Any]:
        assert isinstance(inputs, ChunkActions)
        # [F, 12, keys] and [F, 12, 2]: each latent frame's window of per-video-frame actions.
        mouse = None if inputs.mouse is None else inputs.mouse[0].tolist()
        return {"keyboard": inputs.keyboard[0].tolist(), "mouse": mouse}

    def open_denoise(
        self,
        dit: nn.Module,
        preset: ModelPreset,
        context: torch.Tensor,
        seed: int,
        chunk_latent_frames: int,
        sp: SequenceParallel | None = None,
        prompt: str = "",
    ) -> ActionDenoiseSession:
        if sp is not None:
            raise ValueError(f"{preset.name}: the action modules run on one DiT rank")
        assert isinstance(dit, MatrixGameDiT)
        return ActionDenoiseSession(dit, preset, context, seed, chunk_latent_frames)

    def session_state_bytes(self, preset: ModelPreset, dtype: torch.dtype) -> SessionStateBytes:
        model = variant(preset).model
        with torch.device("meta"):  # shapes only: the caches' own arithmetic, no memory
            cache = MatrixGameCache(model, 1, preset.tokens_per_latent_frame, dtype, torch.device("meta"))
        size = torch.empty((), dtype=dtype).element_size()
        image_kv = model.num_layers * 2 * model.image_tokens * model.dim * size
        return SessionStateBytes(kv_cache_bytes=cache.nbytes(), context_kv_bytes=image_kv)

    def one_layer(self, preset: ModelPreset) -> ModelPreset:
        # One block, with its action module: the largest block's activations.
        v = variant(preset)
        model = dataclasses.replace(v.model, num_layers=1, action_blocks=min(1, v.model.action_blocks))
        return dataclasses.replace(preset, dit=model.trunk, matrix_game=dataclasses.replace(v, model=model))

    def verify(self, preset: ModelPreset, checkpoint_dir: Path) -> dict[str, loading.KeyReport | str]:
        meta = self.meta_components(preset)
        sources: dict[str, Callable[[], loading.TensorSource]] = {
            "dit": lambda: dit_source(preset, checkpoint_dir),
            "vae": lambda: loading.vae_source(checkpoint_dir, preset.vae),
            "clip": lambda: clip_source(preset, checkpoint_dir),
        }
        return loading.check_sources(meta, sources)


MATRIX_GAME = MatrixGame()
