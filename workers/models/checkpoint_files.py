"""Which files a preset's checkpoint directory must hold, checked before any worker builds anything.

A preset with official weights (neither bundled nor random) cannot run without them; without this
check a server would start building full-size random weights in every worker, run the host out of
memory, and only then fail on the missing tokenizer. Checking the names takes milliseconds, and
this module imports no torch, so a command line can check before it loads anything heavy.

Layout (as released):
    <dir>/transformers/model-0000k-of-0000n.safetensors + model.safetensors.index.json   (DiT)
    <dir>/Wan2.1_VAE.pth                                                                (VAE)
    <dir>/models_t5_umt5-xxl-enc-bf16.pth                                               (umT5)
    <dir>/google/umt5-xxl/tokenizer.json                                                (tokenizer)
The VAE and umT5 may also be safetensors files (`vae.safetensors`, `text_encoder.safetensors`),
as the bundled weights are; a single DiT file is `transformers/model.safetensors`.
"""

from __future__ import annotations

import json
from pathlib import Path

from workers.models.presets import ModelPreset

DIT_SUBDIR = "transformers"
DIT_INDEX = "model.safetensors.index.json"
DIT_SINGLE = "model.safetensors"
VAE_FILE = "Wan2.1_VAE.pth"
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
VAE_SAFETENSORS = "vae.safetensors"
T5_SAFETENSORS = "text_encoder.safetensors"
TOKENIZER_DIR = "google/umt5-xxl"


class CheckpointMissing(ValueError):
    """The preset needs a checkpoint directory that is absent or incomplete."""


def needs_checkpoint(preset: ModelPreset) -> bool:
    return preset.bundled_weights is None and "random-weights" not in preset.tags


def missing_files(preset: ModelPreset, checkpoint_dir: Path) -> list[str]:
    """Paths (relative to the directory) that a load of `preset` would need and cannot find."""
    missing = []
    dit = checkpoint_dir / DIT_SUBDIR
    index = dit / DIT_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError):
            shards = []
            missing.append(f"{DIT_SUBDIR}/{DIT_INDEX} (unreadable: no weight_map)")
        missing += [f"{DIT_SUBDIR}/{s}" for s in shards if not (dit / s).is_file()]
    elif not (dit / DIT_SINGLE).is_file():
        missing.append(f"{DIT_SUBDIR}/{DIT_INDEX} and its shards")
    for pth, st in ((VAE_FILE, VAE_SAFETENSORS), (T5_FILE, T5_SAFETENSORS)):
        if not (checkpoint_dir / pth).is_file() and not (checkpoint_dir / st).is_file():
            missing.append(pth)
    tokenizer = f"{TOKENIZER_DIR}/tokenizer.json"
    if preset.t5.tokenizer == "umt5" and not (checkpoint_dir / tokenizer).is_file():
        missing.append(tokenizer)
    return missing


def require_checkpoint(preset: ModelPreset, checkpoint_dir: str | Path | None) -> None:
    """Raise CheckpointMissing, naming --checkpoint-dir and every missing file, if a load would fail."""
    if checkpoint_dir is None:
        if needs_checkpoint(preset):
            raise CheckpointMissing(
                f"{preset.name} runs on its released weights: pass --checkpoint-dir DIR, a directory holding "
                f"{DIT_SUBDIR}/ (safetensors shards and {DIT_INDEX}), {VAE_FILE}, "
                f"{T5_FILE} and {TOKENIZER_DIR}/tokenizer.json"
            )
        return
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise CheckpointMissing(f"--checkpoint-dir {path} is not a directory")
    missing = missing_files(preset, path)
    if missing:
        listed = ", ".join(missing)
        raise CheckpointMissing(f"--checkpoint-dir {path} is incomplete for {preset.name}; missing: {listed}")
