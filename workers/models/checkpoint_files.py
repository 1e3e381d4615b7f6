"""Which files a preset's checkpoint directory must hold, checked before any worker builds anything.

A preset with official weights (neither bundled nor random) cannot run without them; without this
check a server would start building full-size random weights in every worker, run the host out of
memory, and only then fail on the missing tokenizer. Checking the names takes milliseconds, and
this module imports no torch, so a command line can check before it loads anything heavy.

Two layouts are accepted for LingBot-World; a directory holding `model_index.json` is in the
diffusers layout, any other in the released one. A Matrix-Game preset reads the Matrix-Game 2.0
release directory (workers/models/matrix_game/variants.py lists its files).

Released layout:
    <dir>/transformers/<any>.safetensors.index.json + the shards its weight_map names   (DiT)
    <dir>/Wan2.1_VAE.pth                                                                (VAE)
    <dir>/models_t5_umt5-xxl-enc-bf16.pth                                               (umT5)
    <dir>/google/umt5-xxl/tokenizer.json                                                (tokenizer)
The LingBot-World v2 14B release names its DiT index `diffusion_pytorch_model.safetensors.index.json`
beside shards `model-0000k-of-00008.safetensors`; other loaders and the bundled weights use
`model.safetensors.index.json` or one `model.safetensors`. A folder's index is therefore found by
its suffix, whatever its stem, and its `weight_map` names the shards (two indexes that disagree are
refused); without an index, a folder's one `*.safetensors` file is the component. The VAE and umT5
may also be safetensors files (`vae.safetensors`, `text_encoder.safetensors`), as the bundled weights are.

A release that ships its DiT alone (LingBot-World v2 1.3B: an index and six shards at its root) is
completed by an assets directory holding the rest (the 14B release's VAE, umT5 and tokenizer):
workers/models/weights_dir.py composes the two into one directory of this layout.

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
DIT_INDEX = "model.safetensors.index.json"  # the name this project writes (bundled weights, fixtures)
DIT_SINGLE = "model.safetensors"
INDEX_SUFFIX = ".safetensors.index.json"
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
    """One component's folder in the diffusers layout (its files are found as in any folder:
    diffusers names them `diffusion_pytorch_model*`, transformers `model*`)."""

    role: str  # as error messages name it
    folder: str


DIFFUSERS_DIT = DiffusersComponent("DiT", "transformer")
DIFFUSERS_VAE = DiffusersComponent("VAE", "vae")
DIFFUSERS_T5 = DiffusersComponent("umT5", "text_encoder")


def index_shards(index: Path) -> list[str]:
    """The shard file names a safetensors index names, each once, sorted."""
    return sorted(set(_weight_map(index).values()))


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError):
        weight_map = None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index} is unreadable: expected a JSON object with a weight_map; fetch it again")
    return weight_map


def find_index(folder: Path) -> Path | None:
    """The folder's safetensors index, whatever its stem (`model`, `diffusion_pytorch_model`, …).

    Several are accepted when their weight maps agree (a copy under another name); two that name
    other shards are refused, naming both, since loading either would be a guess.
    """
    indexes = sorted(folder.glob(f"*{INDEX_SUFFIX}"))
    if not indexes:
        return None
    first = _weight_map(indexes[0])
    for other in indexes[1:]:
        if _weight_map(other) != first:
            raise ValueError(
                f"{folder} holds two safetensors indexes that disagree: {indexes[0].name} and {other.name}; "
                "remove the one that does not belong to these shards"
            )
    return indexes[0]


def component_files(folder: Path, role: str) -> list[Path]:
    """A component's safetensors files: the shards its index names, else the folder's one file."""
    index = find_index(folder) if folder.is_dir() else None
    if index is not None:
        return [folder / name for name in index_shards(index)]
    singles = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if len(singles) == 1:
        return singles
    if singles:
        names = ", ".join(p.name for p in singles)
        raise ValueError(f"{folder} holds {len(singles)} {role} safetensors files ({names}) and no index naming them")
    raise FileNotFoundError(
        f"no {role} weights: expected {folder}/*{INDEX_SUFFIX} with its shards, or one {folder}/*.safetensors"
    )


def missing_component_files(checkpoint_dir: Path, folder: str, role: str) -> list[str]:
    """What `component_files` would need in `<checkpoint_dir>/<folder>` and cannot find, relative paths."""
    try:
        files = component_files(checkpoint_dir / folder, role)
    except FileNotFoundError:
        return [f"{folder}/*{INDEX_SUFFIX} and its shards (the {role})"]
    except ValueError as exc:  # an unreadable index, two that disagree, several files and no index
        return [f"{folder}/ ({exc})"]
    return [f"{folder}/{p.name}" for p in files if not p.is_file()]


def diffusers_files(checkpoint_dir: Path, component: DiffusersComponent) -> list[Path]:
    return component_files(checkpoint_dir / component.folder, component.role)


def dit_files(checkpoint_dir: Path) -> list[Path]:
    """The DiT's safetensors files in the released layout."""
    return component_files(checkpoint_dir / DIT_SUBDIR, "DiT")


def holds_dit_only(directory: Path) -> bool:
    """A DiT-only release (LingBot-World v2 1.3B): an index at its root, and no VAE beside it."""
    try:
        return find_index(directory) is not None and not (directory / VAE_FILE).is_file()
    except ValueError:
        return False


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
    missing = missing_component_files(checkpoint_dir, DIT_SUBDIR, "DiT")
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
        if not (checkpoint_dir / component.folder).is_dir():
            missing.append(f"{component.folder}/ (the {component.role} folder)")
        else:
            missing += missing_component_files(checkpoint_dir, component.folder, component.role)
    tokenizer = f"{DIFFUSERS_TOKENIZER_DIR}/{TOKENIZER_FILE}"
    if preset.t5 is not None and preset.t5.tokenizer == "umt5" and not (checkpoint_dir / tokenizer).is_file():
        missing.append(tokenizer)
    return missing


def require_checkpoint(preset: ModelPreset, checkpoint_dir: str | Path | None) -> None:
    """Raise CheckpointMissing, naming --checkpoint-dir and every missing file, if a load would fail."""
    if checkpoint_dir is None:
        if not needs_checkpoint(preset):
            return
        # Reached by callers that skip workers/models/resolve.py (which resolves through the cache).
        fetch = "pass --checkpoint-dir DIR, "
        if preset.hub is not None:
            fetch = f"`worldrtc fetch {preset.name}` puts them in the Hugging Face cache, found there; or {fetch}"
        if preset.matrix_game is not None:
            raise CheckpointMissing(
                f"{preset.name} runs on its released weights: {fetch}the Matrix-Game 2.0 release directory "
                f"(Skywork/Matrix-Game-2.0), holding {', '.join(matrix_game_files(preset))}"
            )
        raise CheckpointMissing(
            f"{preset.name} runs on its released weights: {fetch}a directory holding "
            f"{DIT_SUBDIR}/ (safetensors shards and their *{INDEX_SUFFIX}), {VAE_FILE}, "
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
        hint = (
            "; it holds a DiT alone, as a DiT-only release does: pass --assets-dir DIR, a directory with "
            f"{VAE_FILE}, {T5_FILE} and {TOKENIZER_DIR}/ (the 14B release)"
            if holds_dit_only(path)
            else ""
        )
        raise CheckpointMissing(
            f"--checkpoint-dir {path}{layout} is incomplete for {preset.name}; missing: {listed}{hint}"
        )
