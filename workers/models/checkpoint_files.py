"""Which files a preset's checkpoint directory must hold, checked before any worker builds anything.

A preset with official weights (neither bundled nor random) cannot run without them; without this
check a server would start building full-size random weights in every worker, run the host out of
memory, and only then fail on the missing tokenizer. Checking the names takes milliseconds, and
this module imports no torch, so a command line can check before it loads anything heavy.

Two layouts are accepted for LingBot-World; a directory holding `model_index.json` is in the
diffusers layout, any other in the released one. A Matrix-Game preset reads the Matrix-Game 2.0
release directory (workers/models/matrix_game/variants.py lists its files).

Released layout:
    <dir>/transformers/model-0000k-of-0000n.safetensors + model.safetensors.index.json   (DiT)
    <dir>/Wan2.1_VAE.pth                                                                (VAE)
    <dir>/models_t5_umt5-xxl-enc-bf16.pth                                               (umT5)
    <dir>/google/umt5-xxl/tokenizer.json                                                (tokenizer)
The VAE and umT5 may also be safetensors files (`vae.safetensors`, `text_encoder.safetensors`),
as the bundled weights are; a single DiT file is `transformers/model.safetensors`.

Diffusers layout (how Hugging Face pipelines are saved; the stored names differ, and
workers/models/diffusers_layout.py maps them to the released ones):
    <dir>/model_index.json
    <dir>/transformer/diffusion_pytorch_model.safetensors                               (DiT)
        or diffusion_pytorch_model-0000k-of-0000n.safetensors + diffusion_pytorch_model.safetensors.index.json
    <dir>/vae/diffusion_pytorch_model.safetensors (or sharded, the same way)            (VAE)
    <dir>/text_encoder/model.safetensors (or model-0000k-of-0000n + model.safetensors.index.json)  (umT5)
    <dir>/tokenizer/tokenizer.json                                                      (tokenizer)
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path

from workers.models.matrix_game.variants import CLIP_FILE
from workers.models.presets import ModelPreset

DIT_SUBDIR = "transformers"
DIT_INDEX = "model.safetensors.index.json"
DIT_SINGLE = "model.safetensors"
VAE_FILE = "Wan2.1_VAE.pth"
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
VAE_SAFETENSORS = "vae.safetensors"
T5_SAFETENSORS = "text_encoder.safetensors"
TOKENIZER_DIR = "google/umt5-xxl"
TOKENIZER_FILE = "tokenizer.json"

MODEL_INDEX = "model_index.json"
DIFFUSERS_TOKENIZER_DIR = "tokenizer"


class Layout(enum.Enum):
    RELEASED = "released"
    DIFFUSERS = "diffusers"

    def describe(self) -> str:
        """One line for a command's output: the layout and what it was told by."""
        if self is Layout.DIFFUSERS:
            return (
                f"diffusers ({MODEL_INDEX} found: {DIFFUSERS_DIT.folder}/, {DIFFUSERS_VAE.folder}/, "
                f"{DIFFUSERS_T5.folder}/, {DIFFUSERS_TOKENIZER_DIR}/)"
            )
        return f"released (no {MODEL_INDEX}: {DIT_SUBDIR}/, {VAE_FILE}, {T5_FILE}, {TOKENIZER_DIR}/)"


def detect_layout(checkpoint_dir: Path) -> Layout:
    """`model_index.json` is what every diffusers pipeline directory holds and a released one never does."""
    return Layout.DIFFUSERS if (checkpoint_dir / MODEL_INDEX).is_file() else Layout.RELEASED


@dataclass(frozen=True)
class DiffusersComponent:
    """One component's folder in the diffusers layout and the stem of its safetensors file names."""

    role: str  # as error messages name it
    folder: str
    stem: str  # diffusers saves `diffusion_pytorch_model`, transformers `model`

    @property
    def single(self) -> str:
        return f"{self.stem}.safetensors"

    @property
    def index(self) -> str:
        return f"{self.stem}.safetensors.index.json"


DIFFUSERS_DIT = DiffusersComponent("DiT", "transformer", "diffusion_pytorch_model")
DIFFUSERS_VAE = DiffusersComponent("VAE", "vae", "diffusion_pytorch_model")
DIFFUSERS_T5 = DiffusersComponent("umT5", "text_encoder", "model")


def index_shards(index: Path) -> list[str]:
    """The shard file names a safetensors index names, each once, sorted."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{index} is unreadable: expected a JSON object with a weight_map; fetch it again") from None


def safetensors_files(folder: Path, single: str, index: str, role: str) -> list[Path]:
    """A component's safetensors files: the shards its index names, else its single file."""
    if (folder / index).is_file():
        return [folder / name for name in index_shards(folder / index)]
    if (folder / single).is_file():
        return [folder / single]
    raise FileNotFoundError(f"no {role} weights: expected {folder / index} (sharded) or {folder / single}")


def diffusers_files(checkpoint_dir: Path, component: DiffusersComponent) -> list[Path]:
    return safetensors_files(checkpoint_dir / component.folder, component.single, component.index, component.role)


def tokenizer_path(checkpoint_dir: Path) -> Path:
    """Where the umT5 tokenizer file lies in the directory's layout."""
    if detect_layout(checkpoint_dir) is Layout.DIFFUSERS:
        return checkpoint_dir / DIFFUSERS_TOKENIZER_DIR / TOKENIZER_FILE
    return checkpoint_dir / TOKENIZER_DIR / TOKENIZER_FILE


class CheckpointMissing(ValueError):
    """The preset needs a checkpoint directory that is absent or incomplete."""


def needs_checkpoint(preset: ModelPreset) -> bool:
    return preset.bundled_weights is None and "random-weights" not in preset.tags


def matrix_game_files(preset: ModelPreset) -> tuple[str, ...]:
    """A Matrix-Game preset's files, relative to the release directory (matrix_game/variants.py)."""
    assert preset.matrix_game is not None
    return (preset.matrix_game.dit_file, VAE_FILE, CLIP_FILE)


def missing_files(preset: ModelPreset, checkpoint_dir: Path) -> list[str]:
    """Paths (relative to the directory) that a load of `preset` would need and cannot find."""
    if preset.matrix_game is not None:
        return [name for name in matrix_game_files(preset) if not (checkpoint_dir / name).is_file()]
    if detect_layout(checkpoint_dir) is Layout.DIFFUSERS:
        return _missing_diffusers_files(preset, checkpoint_dir)
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
    tokenizer = f"{TOKENIZER_DIR}/{TOKENIZER_FILE}"
    if preset.t5 is not None and preset.t5.tokenizer == "umt5" and not (checkpoint_dir / tokenizer).is_file():
        missing.append(tokenizer)
    return missing


def _missing_diffusers_files(preset: ModelPreset, checkpoint_dir: Path) -> list[str]:
    missing = []
    for component in (DIFFUSERS_DIT, DIFFUSERS_VAE, DIFFUSERS_T5):
        folder = checkpoint_dir / component.folder
        if not folder.is_dir():
            missing.append(f"{component.folder}/ (the {component.role} folder)")
        elif (folder / component.index).is_file():
            try:
                shards = index_shards(folder / component.index)
            except ValueError:
                missing.append(f"{component.folder}/{component.index} (unreadable: no weight_map)")
                continue
            missing += [f"{component.folder}/{s}" for s in shards if not (folder / s).is_file()]
        elif not (folder / component.single).is_file():
            missing.append(f"{component.folder}/{component.single} (or {component.index} and its shards)")
    tokenizer = f"{DIFFUSERS_TOKENIZER_DIR}/{TOKENIZER_FILE}"
    if preset.t5 is not None and preset.t5.tokenizer == "umt5" and not (checkpoint_dir / tokenizer).is_file():
        missing.append(tokenizer)
    return missing


def require_checkpoint(preset: ModelPreset, checkpoint_dir: str | Path | None) -> None:
    """Raise CheckpointMissing, naming --checkpoint-dir and every missing file, if a load would fail."""
    if checkpoint_dir is None:
        if needs_checkpoint(preset) and preset.matrix_game is not None:
            raise CheckpointMissing(
                f"{preset.name} runs on its released weights: pass --checkpoint-dir DIR, the Matrix-Game 2.0 "
                f"release directory (Skywork/Matrix-Game-2.0), holding {', '.join(matrix_game_files(preset))}"
            )
        if needs_checkpoint(preset):
            raise CheckpointMissing(
                f"{preset.name} runs on its released weights: pass --checkpoint-dir DIR, a directory holding "
                f"{DIT_SUBDIR}/ (safetensors shards and {DIT_INDEX}), {VAE_FILE}, "
                f"{T5_FILE} and {TOKENIZER_DIR}/{TOKENIZER_FILE} (the released layout), or {MODEL_INDEX} beside "
                f"{DIFFUSERS_DIT.folder}/, {DIFFUSERS_VAE.folder}/, {DIFFUSERS_T5.folder}/ and "
                f"{DIFFUSERS_TOKENIZER_DIR}/ (the diffusers layout)"
            )
        return
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise CheckpointMissing(f"--checkpoint-dir {path} is not a directory")
    missing = missing_files(preset, path)
    if missing:
        listed = ", ".join(missing)
        # Named for the diffusers layout only: a stray model_index.json is what would make a released
        # directory's files look missing.
        layout = f" (diffusers layout: it holds {MODEL_INDEX})" if detect_layout(path) is Layout.DIFFUSERS else ""
        raise CheckpointMissing(f"--checkpoint-dir {path}{layout} is incomplete for {preset.name}; missing: {listed}")
