"""The three model components of a preset (DiT, VAE, umT5), built and loaded for one device.

Precision policy: on CUDA the DiT runs in bf16, the VAE in fp32 and umT5 in bf16 (as released);
on CPU everything is fp32, since CPU bf16 matmuls are slow and lose accuracy for no memory win
that matters at CPU model sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from workers.models import loading
from workers.models.dit import WanDiT, init_random_weights
from workers.models.presets import ModelPreset
from workers.models.t5 import TextEncoder, UMT5Encoder
from workers.models.tokenizer import load_tokenizer
from workers.models.vae import WanVAE


@dataclass(frozen=True)
class Precision:
    dit: torch.dtype
    vae: torch.dtype
    t5: torch.dtype

    @staticmethod
    def for_device(device: torch.device) -> Precision:
        if device.type == "cuda":
            return Precision(dit=torch.bfloat16, vae=torch.float32, t5=torch.bfloat16)
        return Precision(dit=torch.float32, vae=torch.float32, t5=torch.float32)


def meta_components(preset: ModelPreset) -> dict[str, nn.Module]:
    """All components on the meta device: shapes and parameter counts, no memory."""
    return {
        "dit": loading.build_on_meta(lambda: WanDiT(preset.dit)),
        "vae": loading.build_on_meta(lambda: WanVAE(preset.vae)),
        "t5": loading.build_on_meta(lambda: UMT5Encoder(preset.t5)),
    }


def _random_init(seed: int):
    def init(module: nn.Module) -> None:
        if isinstance(module, WanDiT):
            init_random_weights(module, seed)
            return
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in module.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() >= 2:
                    p.copy_(torch.randn(p.shape, generator=gen) / (p[0].numel() ** 0.5))
                else:
                    p.fill_(1.0)

    return init


def load_dit(preset: ModelPreset, device: torch.device, checkpoint_dir: Path | None, seed: int = 0) -> WanDiT:
    dtype = Precision.for_device(device).dit
    model = loading.build_on_meta(lambda: WanDiT(preset.dit))
    if checkpoint_dir is None:
        model = loading.materialize_random(model, _random_init(seed), dtype, device)
    else:
        state = loading.read_dit_state(checkpoint_dir, "cpu" if device.type != "cuda" else device)
        model = loading.load_strict("DiT", model, state, dtype, device)
    return model.eval().requires_grad_(False)  # type: ignore[return-value]


def load_vae(preset: ModelPreset, device: torch.device, checkpoint_dir: Path | None, seed: int = 1) -> WanVAE:
    dtype = Precision.for_device(device).vae
    model = loading.build_on_meta(lambda: WanVAE(preset.vae))
    if checkpoint_dir is None:
        model = loading.materialize_random(model, _random_init(seed), dtype, device)
    else:
        state = loading.read_pth(checkpoint_dir / loading.VAE_FILE)
        model = loading.load_strict("VAE", model, state, dtype, device)
    return model.eval().requires_grad_(False)  # type: ignore[return-value]


def load_text_encoder(
    preset: ModelPreset, device: torch.device, checkpoint_dir: Path | None, seed: int = 2
) -> TextEncoder:
    dtype = Precision.for_device(device).t5
    model = loading.build_on_meta(lambda: UMT5Encoder(preset.t5))
    if checkpoint_dir is None:
        model = loading.materialize_random(model, _random_init(seed), dtype, device)
    else:
        state = loading.read_pth(checkpoint_dir / loading.T5_FILE)
        model = loading.load_strict("umT5", model, state, dtype, device)
    model = model.eval().requires_grad_(False)
    return TextEncoder(model, load_tokenizer(preset.t5, checkpoint_dir))  # type: ignore[arg-type]
