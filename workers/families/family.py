"""What a world-model family gives the stages and the server, in one place per family.

A preset (workers/models/presets.py) names its family; everything that differs between families
goes through the `ModelFamily` that `family_for(preset)` returns (workers/families/registry.py), and
nothing else in the stages, the runtime or the server asks which family it runs:

- the **context encoder** (encode stage): the start image and the prompt -> the tokens the DiT
  cross-attends to for the whole session (umT5 text embeddings; Matrix-Game's CLIP image tokens);
- the **control adapter** (DiT stage): a `ControlTrack` per session folding each chunk's
  `ChunkControl` into that family's model input (camera poses; per-frame keyboard and mouse
  actions), and the keys and look it accepts (`ModelPreset.controls`, in GET /v1/model);
- the **DiT and its session**: the module, its kernels, and a `ChunkDenoiser` per session owning
  its caches (families add caches: Matrix-Game's action modules keep mouse and keyboard K/V) and
  its seeded sampler on the preset's schedule;
- the **checkpoint layout**: strict streaming loads and `verify` (the files a load needs are named
  torch-free, in workers/models/checkpoint_files.py, so a command line can check them first);
- the **memory plan's** figures: the per-session state and context sizes (workers/runtime/footprint.py
  traces the rest from the same session code).

The image condition (the VAE's I2V latent, workers/stages/condition.py) and the decoder are the same
Wan2.1 VAE in every family here, so they stay outside the interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn

from workers.controls import ChunkControl
from workers.models.components import Precision
from workers.models.configs import Family
from workers.models.fp8 import quantize_blocks
from workers.models.kernels import DEFAULT_KERNELS, KernelConfig, apply_attention
from workers.models.loading import KeyReport
from workers.models.presets import ModelPreset
from workers.models.savings import Quantization, Savings
from workers.parallel.ulysses import SequenceParallel


class ChunkInputs(Protocol):
    """A chunk's control input, built on the host and moved to the DiT's device in one step."""

    def to(self, device: torch.device) -> Any: ...


class ContextEncoder(Protocol):
    def encode(self, image: torch.Tensor, prompt: str) -> torch.Tensor:
        """image [3, H, W] in [-1, 1] at the preset's resolution, prompt -> context [tokens, dim]."""
        ...

    def encode_prompt(self, prompt: str) -> torch.Tensor:
        """A prompt typed mid-session -> the context it changes to (families with `live_prompts`)."""
        ...


class ControlTrack(Protocol):
    """A session's control state on the DiT stage: what the person did, as the model takes it."""

    def next_inputs(self, control: ChunkControl, num_latent_frames: int) -> ChunkInputs: ...

    def reset_pose(self) -> None: ...


class ChunkDenoiser(Protocol):
    """One session's chunk loop on the DiT stage: its caches, context and seeded sampler."""

    chunk: int
    device: torch.device

    def run_chunk(self, cond: torch.Tensor, inputs: Any) -> torch.Tensor:
        """cond [1, 20, C, h, w] and the chunk's inputs, on the device -> clean latents [1, 16, C, h, w]."""
        ...

    def sample_chunk(self, cond: torch.Tensor, inputs: Any) -> torch.Tensor:
        """`run_chunk` up to the clean latents; `commit_chunk` (before the next chunk) does the rest."""
        ...

    def commit_chunk(self) -> None:
        """Write the sampled chunk to the caches (its t = 0 forward)."""
        ...

    def change_prompt(self, context: torch.Tensor, text: str, transition_chunks: int) -> None:
        """Read `context` (copied) from the next chunk on, reached over `transition_chunks` chunks."""
        ...

    def prompt_receipt(self) -> dict[str, Any] | None:
        """The prompt the last chunk read ({text} or {text, weight, from}); None for a family without text."""
        ...


@dataclass(frozen=True)
class SessionStateBytes:
    """Bytes a DiT session keeps between chunks that grow with the model: the memory plan's figures."""

    kv_cache_bytes: int  # every cache's window (self-attention, and a family's own caches)
    context_kv_bytes: int  # every layer's cross-attention K/V of the session's context


class ModelFamily(ABC):
    family: Family
    context_name: str  # the context encoder as plans and logs name it ("umT5", "CLIP ViT-H/14")
    # DiT ranks a placement may give it: None, any count the heads and tokens divide by (Ulysses).
    max_dit_ranks: int | None = None
    # Whether a session's prompt can change while it runs (a family conditioned on text).
    live_prompts: bool = False

    @abstractmethod
    def meta_components(self, preset: ModelPreset) -> dict[str, nn.Module]:
        """Every component on the meta device, by component name: shapes and counts, no memory."""

    @abstractmethod
    def build_dit(self, preset: ModelPreset) -> Callable[[], nn.Module]:
        """A factory of the DiT module (built on meta by the loaders and the footprint trace)."""

    @abstractmethod
    def load_dit(
        self,
        preset: ModelPreset,
        device: torch.device,
        checkpoint_dir: Path | None,
        weights_seed: int = 0,
        kernels: KernelConfig | None = None,
        dtype: torch.dtype | None = None,
    ) -> nn.Module:
        """The DiT on `device`, in `dtype` (default: the device's precision), strictly loaded (or
        seeded random weights without a checkpoint), its attention pointed at `kernels`' backend."""

    def load_dit_with(
        self,
        preset: ModelPreset,
        device: torch.device,
        checkpoint_dir: Path | None,
        weights_seed: int,
        kernels: KernelConfig | None,
        savings: Savings,
    ) -> nn.Module:
        """`load_dit`, then its block weights stored in fp8 under `--quantization fp8`: loaded and
        quantized on the host in the device's dtype, then moved, so the GPU never holds the model
        at full width (the load's peak is the fp8 model, as the plan counts it)."""
        if savings.quantization is not Quantization.FP8:
            return self.load_dit(preset, device, checkpoint_dir, weights_seed, kernels)
        kernels = kernels or DEFAULT_KERNELS
        if kernels.compile:
            raise ValueError("--quantization fp8 with --compile is not supported: drop one of them")
        host = torch.device("cpu")
        dtype = Precision.for_device(device).dit
        dit = quantize_blocks(self.load_dit(preset, host, checkpoint_dir, weights_seed, kernels, dtype))
        return apply_attention(dit.to(device), kernels, device)

    def load_context_encoder_with(
        self,
        preset: ModelPreset,
        device: torch.device,
        checkpoint_dir: Path | None,
        weights_seed: int,
        savings: Savings,
    ) -> ContextEncoder:
        """`load_context_encoder` for a stage on `device`: on the host under `--text-encoder-on-cpu`,
        in the dtype it would have on `device` (bf16 on a GPU). Its contexts stay where it runs; the
        caller moves them to the stage's device."""
        here = torch.device("cpu") if savings.text_encoder_on_cpu else device
        return self.load_context_encoder(
            preset, here, checkpoint_dir, weights_seed, Precision.for_device(device).context
        )

    @abstractmethod
    def load_context_encoder(
        self,
        preset: ModelPreset,
        device: torch.device,
        checkpoint_dir: Path | None,
        weights_seed: int = 0,
        dtype: torch.dtype | None = None,
    ) -> ContextEncoder:
        """The context encoder on `device`, in `dtype` (default: the device's precision policy)."""

    @abstractmethod
    def context_shape(self, preset: ModelPreset) -> tuple[int, int]:
        """(tokens, width) of the context one session hands the DiT."""

    @abstractmethod
    def context_encoder_module(self, preset: ModelPreset) -> Callable[[], nn.Module]:
        """A factory of the context encoder's module, for the footprint trace."""

    @abstractmethod
    def trace_context_encoder(self, module: nn.Module, preset: ModelPreset, device: torch.device) -> None:
        """Run the encoder once on the largest input a session gives it (the footprint's peak)."""

    @abstractmethod
    def control_track(self, preset: ModelPreset) -> ControlTrack: ...

    @abstractmethod
    def describe_inputs(self, inputs: Any) -> dict[str, Any]:
        """A chunk's control input as the DiT consumed it, in JSON types (the `chunk` message's
        `model_input`): what a client, a log or a test reads to see what steered the chunk."""

    @abstractmethod
    def open_denoise(
        self,
        dit: nn.Module,
        preset: ModelPreset,
        context: torch.Tensor,
        seed: int,
        chunk_latent_frames: int,
        sp: SequenceParallel | None = None,
        prompt: str = "",
    ) -> ChunkDenoiser: ...

    @abstractmethod
    def session_state_bytes(self, preset: ModelPreset, dtype: torch.dtype) -> SessionStateBytes:
        """All ranks together: the memory plan gives each DiT rank its share of the KV cache."""

    @abstractmethod
    def one_layer(self, preset: ModelPreset) -> ModelPreset:
        """The preset cut to one DiT block of each kind, for tracing a chunk's activations quickly."""

    @abstractmethod
    def verify(self, preset: ModelPreset, checkpoint_dir: Path) -> dict[str, KeyReport | str]:
        """Every component checked against the directory's files from their headers, no weights read."""
