"""One checkpoint directory in the released layout, composed from a DiT-only release and the
directory that holds the rest (its VAE, umT5 and tokenizer): the files stay where they are, and
the composed directory holds symbolic links to them, as the Hugging Face cache's own snapshots do.

The LingBot-World v2 1.3B release is such a DiT: an index and its shards at the repository's root,
taking the 14B release's VAE, umT5 and tokenizer. Composing the two once, at start, lets every
loader, `verify`, the weights digest and the workers read one directory in one layout, with nothing
copied by hand (docs/models-and-weights.md, "Get the weights"):

    <composed>/transformers/<the DiT's index and shards>   -> <dit dir>/ (or <dit dir>/transformers/)
    <composed>/Wan2.1_VAE.pth (or vae.safetensors)          -> <assets dir>/
    <composed>/models_t5_umt5-xxl-enc-bf16.pth (or text_encoder.safetensors)
    <composed>/google/umt5-xxl/<tokenizer files>

Composed directories live under `$WORLDRTC_CACHE` (default `~/.cache/worldrtc`), one per pair of
source directories, and are rebuilt whenever the links they should hold change. Torch-free.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from workers.models.checkpoint_files import (
    DIT_SUBDIR,
    INDEX_SUFFIX,
    T5_FILE,
    T5_SAFETENSORS,
    TOKENIZER_DIR,
    VAE_FILE,
    VAE_SAFETENSORS,
    component_files,
)

CACHE_ENV = "WORLDRTC_CACHE"


def cache_root() -> Path:
    """worldrtc's own cache (composed directories): $WORLDRTC_CACHE, else $XDG_CACHE_HOME/worldrtc."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "worldrtc"


def dit_folder(directory: Path) -> Path:
    """Where a directory keeps its DiT: `transformers/` in a full release, the root in a DiT-only one."""
    sub = directory / DIT_SUBDIR
    return sub if sub.is_dir() else directory


def links(dit_dir: Path, assets_dir: Path) -> dict[str, Path]:
    """Relative path in the composed directory -> the file it points to (absolute)."""
    folder = dit_folder(dit_dir).resolve()
    wanted: dict[str, Path] = {}
    # The index and its shards (or the single file), plus the index under every name it has there.
    for path in [*folder.glob(f"*{INDEX_SUFFIX}"), *component_files(folder, "DiT")]:
        wanted[f"{DIT_SUBDIR}/{path.name}"] = path
    assets = assets_dir.resolve()
    for name in (VAE_FILE, VAE_SAFETENSORS, T5_FILE, T5_SAFETENSORS):
        if (assets / name).is_file():
            wanted[name] = assets / name
    tokenizer = assets / TOKENIZER_DIR
    if tokenizer.is_dir():
        for path in sorted(p for p in tokenizer.iterdir() if p.is_file()):
            wanted[f"{TOKENIZER_DIR}/{path.name}"] = path
    return wanted


def compose(dit_dir: Path, assets_dir: Path, root: Path | None = None) -> Path:
    """The composed directory for this pair (built, or rebuilt if its links differ); see the module doc."""
    wanted = links(dit_dir, assets_dir)
    key = f"{dit_dir.resolve()}\0{assets_dir.resolve()}".encode()
    target = (root or cache_root()) / "composed" / hashlib.sha256(key).hexdigest()[:16]
    if _holds(target, wanted):
        return target
    staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    for rel, source in wanted.items():
        link = staging / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source)
    # Swapped in whole, so a reader never sees half a directory.
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _holds(target: Path, wanted: dict[str, Path]) -> bool:
    if not target.is_dir():
        return False
    present = {p.relative_to(target).as_posix(): p for p in target.rglob("*") if p.is_symlink()}
    return present.keys() == wanted.keys() and all(Path(os.readlink(present[k])) == v for k, v in wanted.items())
