"""Building model components and loading them strictly from a local checkpoint directory.

Layout (as released):
    <dir>/transformers/model-0000k-of-0000n.safetensors + model.safetensors.index.json   (DiT)
    <dir>/Wan2.1_VAE.pth                                                                (VAE)
    <dir>/models_t5_umt5-xxl-enc-bf16.pth                                               (umT5)
    <dir>/google/umt5-xxl/tokenizer.json                                                (tokenizer)
The VAE and umT5 may also be safetensors files (`vae.safetensors`, `text_encoder.safetensors`),
as the bundled weights are; a single DiT file is `transformers/model.safetensors`.

Presets with `bundled_weights` load from workers/models/weights/<name>/ when no directory is given.

Modules are built on the meta device, so no memory is touched until the checkpoint's tensors are
assigned in place: each weight is materialised once, directly in its target dtype and device.
Every mismatch (missing, unexpected, mis-shaped keys) is collected and reported together.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from workers.models.presets import ModelPreset

DIT_SUBDIR = "transformers"
DIT_INDEX = "model.safetensors.index.json"
VAE_FILE = "Wan2.1_VAE.pth"
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
VAE_SAFETENSORS = "vae.safetensors"
T5_SAFETENSORS = "text_encoder.safetensors"
TOKENIZER_DIR = "google/umt5-xxl"
MODEL_CARD = "model_card.json"
BUNDLED_ROOT = Path(__file__).resolve().parent / "weights"


def checkpoint_dir_for(preset: ModelPreset, checkpoint_dir: str | Path | None) -> Path | None:
    """The directory to load from: the given one, else the preset's bundled weights, else None (random)."""
    if checkpoint_dir is not None:
        return Path(checkpoint_dir)
    if preset.bundled_weights is None:
        return None
    bundled = BUNDLED_ROOT / preset.bundled_weights
    if not (bundled / DIT_SUBDIR / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"preset {preset.name!r} ships its weights in {bundled}, but they are missing; "
            "restore them from the repository or retrain with `python -m workers.training --install`"
        )
    return bundled


class CheckpointError(ValueError):
    """A checkpoint does not match the preset; the message lists every problem."""


@dataclass(frozen=True)
class KeyReport:
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    misshaped: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]  # (key, expected, found)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.misshaped)

    def describe(self, component: str, limit: int = 20) -> str:
        lines = [f"{component}: checkpoint does not match the preset"]
        for title, items in (("missing", self.missing), ("unexpected", self.unexpected)):
            if items:
                shown = ", ".join(items[:limit]) + (f", … (+{len(items) - limit})" if len(items) > limit else "")
                lines.append(f"  {len(items)} {title} key(s): {shown}")
        for key, want, got in self.misshaped[:limit]:
            lines.append(f"  mis-shaped {key}: expected {list(want)}, found {list(got)}")
        if len(self.misshaped) > limit:
            lines.append(f"  … and {len(self.misshaped) - limit} more mis-shaped keys")
        return "\n".join(lines)


def compare_shapes(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> KeyReport:
    return KeyReport(
        missing=tuple(sorted(set(expected) - set(found))),
        unexpected=tuple(sorted(set(found) - set(expected))),
        misshaped=tuple(
            (k, expected[k], found[k]) for k in sorted(set(expected) & set(found)) if expected[k] != found[k]
        ),
    )


def state_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def build_on_meta(factory: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return factory()


# ---- reading checkpoint files ----


def dit_shards(checkpoint_dir: Path) -> list[Path]:
    root = checkpoint_dir / DIT_SUBDIR
    index = root / DIT_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [root / name for name in sorted(set(weight_map.values()))]
    single = root / "model.safetensors"
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"no DiT weights: expected {index} (sharded) or {single}")


def read_dit_shapes(checkpoint_dir: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for shard in dit_shards(checkpoint_dir):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def read_pth(path: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise FileNotFoundError(f"missing checkpoint file {path}")
    if path.suffix == ".safetensors":
        return _load_safetensors(path, device)
    # mmap: tensors are paged in as they are copied, never held twice.
    state = torch.load(path, map_location=device, mmap=True, weights_only=True)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} does not hold a state dict")
    return state


def component_file(checkpoint_dir: Path, pth_name: str, safetensors_name: str) -> Path:
    """The component's safetensors file when present, else its released .pth name."""
    st = checkpoint_dir / safetensors_name
    return st if st.is_file() else checkpoint_dir / pth_name


def read_dit_state(checkpoint_dir: Path, device: torch.device | str) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for shard in dit_shards(checkpoint_dir):
        state.update(_load_safetensors(shard, device))
    return state


def _load_safetensors(path: Path, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The file's tensors; a truncated or corrupt file is named in the error (the library's own
    message does not say which file)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=str(device))
    except SafetensorError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc


# ---- loading ----


def load_strict(
    component: str, module: nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device
) -> nn.Module:
    """Assign `state` into a meta-built `module` after checking every key and shape."""
    report = compare_shapes(state_shapes(module), {k: tuple(v.shape) for k, v in state.items()})
    if not report.ok:
        raise CheckpointError(report.describe(component))
    converted = {}
    for key in list(state):
        # Convert one tensor at a time and drop the source, so peak memory stays one copy.
        converted[key] = state.pop(key).to(device=device, dtype=dtype)
    module.load_state_dict(converted, strict=True, assign=True)
    return module


def materialize_random(
    module: nn.Module, init: Callable[[nn.Module], None], dtype: torch.dtype, device: torch.device
) -> nn.Module:
    module = module.to_empty(device=device)
    init(module)
    return module.to(dtype=dtype)
