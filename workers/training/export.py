"""Writing a trained preset as a checkpoint directory the strict loader reads, plus its model card."""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import save_file

from workers.models import loading


def hardware() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cpu_threads": torch.get_num_threads(), "gpu": gpu, "torch": torch.__version__}


def save_module(module: nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous() for k, v in module.state_dict().items()}, str(path))


def write_checkpoint(out: Path, dit: nn.Module, vae: nn.Module, text_encoder: nn.Module, card: dict) -> None:
    """<out>/transformers/model.safetensors, vae.safetensors, text_encoder.safetensors, model_card.json."""
    save_module(dit, out / loading.DIT_SUBDIR / "model.safetensors")
    save_module(vae, out / loading.VAE_SAFETENSORS)
    save_module(text_encoder, out / loading.T5_SAFETENSORS)
    (out / loading.MODEL_CARD).write_text(json.dumps(card, indent=2) + "\n")


def install(src: Path, preset_bundle: str) -> Path:
    """Copy an exported checkpoint into the package, where the preset's loader finds it."""
    dst = loading.BUNDLED_ROOT / preset_bundle
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst
