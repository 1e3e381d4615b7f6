"""The LingBot-World family's three components (DiT, VAE, umT5), built and loaded for one device; the
VAE loader and the precision policy serve every family.

Without a checkpoint directory, a preset's bundled weights load if it has them; otherwise the
components get seeded random weights (the test fixtures' `tiny`).

Precision policy: on CUDA the DiT runs in bf16, the VAE in fp32 and the context encoder (umT5, CLIP)
in bf16 (as released); on CPU everything is fp32, since CPU bf16 matmuls are slow and lose accuracy
for no memory win that matters at CPU model sizes. The memory savings (workers/models/savings.py)
change the VAE's dtype (`vae_dtype`) and store the DiT's block weights in fp8 (`quantization`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from workers.models import loading
from workers.models.checkpoint_files import tokenizer_path
from workers.models.dit import WanDiT
from workers.models.presets import ModelPreset, T5Config
from workers.models.random_init import init_random_weights
from workers.models.savings import NO_SAVINGS, Savings
from workers.models.t5 import TextEncoder, UMT5Encoder
from workers.models.tokenizer import load_tokenizer
from workers.models.vae import WanVAE


@dataclass(frozen=True)
class Precision:
    dit: torch.dtype
    vae: torch.dtype
    context: torch.dtype  # the context encoder: umT5, or Matrix-Game's CLIP tower

    @staticmethod
    def for_device(device: torch.device, savings: Savings = NO_SAVINGS) -> Precision:
        vae = savings.vae_dtype.dtype
        if device.type == "cuda":
            return Precision(dit=torch.bfloat16, vae=vae, context=torch.bfloat16)
        return Precision(dit=torch.float32, vae=vae, context=torch.float32)


def text_config(preset: ModelPreset) -> T5Config:
    if preset.t5 is None:
        raise ValueError(f"{preset.name} takes no text: its family has no text encoder")
    return preset.t5


def meta_components(preset: ModelPreset) -> dict[str, nn.Module]:
    """All components on the meta device: shapes and parameter counts, no memory."""
    return {
        "dit": loading.build_on_meta(lambda: WanDiT(preset.dit)),
        "vae": loading.build_on_meta(lambda: WanVAE(preset.vae)),
        "t5": loading.build_on_meta(lambda: UMT5Encoder(text_config(preset))),
    }


def materialize(
    component: str,
    factory: Callable[[], nn.Module],
    dtype: torch.dtype,
    device: torch.device,
    source: loading.TensorSource | None,
    seed: int,
) -> nn.Module:
    """Build on meta, then either stream the checkpoint in strictly or fill seeded random weights."""
    model = loading.build_on_meta(factory)
    if source is None:
        model = loading.materialize_random(model, lambda m: init_random_weights(m, seed), dtype, device)
    else:
        model = loading.load_strict(component, model, source, dtype, device)
    return model.eval().requires_grad_(False)


# Random weights are seeded per component from one weights seed s: DiT s, VAE s + 1, the context
# encoder (umT5 or CLIP) s + 2.
SEED_OFFSETS = {"dit": 0, "vae": 1, "context": 2}


def load_component(
    component: str,
    factory: Callable[[], nn.Module],
    preset: ModelPreset,
    device: torch.device,
    checkpoint_dir: Path | None,
    source_of: Callable[[Path], loading.TensorSource],
    dtype: torch.dtype,
    seed_key: str,
    weights_seed: int,
) -> nn.Module:
    """One component (of any family) strictly loaded from the preset's checkpoint directory (the given
    one, else its bundled weights), or with seeded random weights without one."""
    directory = loading.checkpoint_dir_for(preset, checkpoint_dir)
    source = None if directory is None else source_of(directory)
    return materialize(component, factory, dtype, device, source, weights_seed + SEED_OFFSETS[seed_key])


def load_dit(
    preset: ModelPreset,
    device: torch.device,
    checkpoint_dir: Path | None,
    weights_seed: int = 0,
    dtype: torch.dtype | None = None,
) -> WanDiT:
    """The DiT in `dtype` (default: the device's precision policy)."""
    dtype = Precision.for_device(device).dit if dtype is None else dtype
    dit = load_component(
        "DiT",
        lambda: WanDiT(preset.dit),
        preset,
        device,
        checkpoint_dir,
        loading.dit_source,
        dtype,
        "dit",
        weights_seed,
    )
    return dit  # type: ignore[return-value]


def load_vae(
    preset: ModelPreset,
    device: torch.device,
    checkpoint_dir: Path | None,
    weights_seed: int = 0,
    savings: Savings = NO_SAVINGS,
) -> WanVAE:
    """The VAE in the savings' dtype, its full-resolution layers in their height bands."""
    dtype = Precision.for_device(device, savings).vae
    vae = load_component(
        "VAE",
        lambda: WanVAE(preset.vae),
        preset,
        device,
        checkpoint_dir,
        lambda directory: loading.vae_source(directory, preset.vae),
        dtype,
        "vae",
        weights_seed,
    )
    assert isinstance(vae, WanVAE)
    vae.set_bands(savings.vae_bands, preset.height_px)
    vae.convolve_in_float32(device.type == "cpu")
    return vae


def load_text_encoder(
    preset: ModelPreset,
    device: torch.device,
    checkpoint_dir: Path | None,
    weights_seed: int = 0,
    dtype: torch.dtype | None = None,
) -> TextEncoder:
    """umT5 on `device` in `dtype` (default: the device's precision policy)."""
    config = text_config(preset)
    dtype = Precision.for_device(device).context if dtype is None else dtype
    model = load_component(
        "umT5",
        lambda: UMT5Encoder(config),
        preset,
        device,
        checkpoint_dir,
        loading.text_encoder_source,
        dtype,
        "context",
        weights_seed,
    )
    tokenizer = load_tokenizer(config, loading.checkpoint_dir_for(preset, checkpoint_dir))
    return TextEncoder(model, tokenizer)  # type: ignore[arg-type]


def verify_checkpoint(preset: ModelPreset, checkpoint_dir: Path) -> dict[str, loading.KeyReport | str]:
    """Check a checkpoint directory (either layout) against a preset from the files' headers, reading no
    weights. Keys are reported in the modules' names; the diffusers layout's reports add the stored ones."""
    meta = meta_components(preset)
    results: dict[str, loading.KeyReport | str] = {}
    try:
        results["dit"] = loading.check_source(meta["dit"], loading.dit_source(checkpoint_dir))
    except (OSError, ValueError, KeyError) as exc:  # missing, corrupt or truncated files
        results["dit"] = f"unreadable DiT weights: {exc}"

    sources: dict[str, Callable[[], loading.TensorSource]] = {
        "vae": lambda: loading.vae_source(checkpoint_dir, preset.vae),
        "t5": lambda: loading.text_encoder_source(checkpoint_dir),
    }
    results |= loading.check_sources(meta, sources)
    tok = tokenizer_path(checkpoint_dir)
    if text_config(preset).tokenizer == "umt5" and not tok.is_file():
        results["tokenizer"] = f"missing {tok}"
    return results
