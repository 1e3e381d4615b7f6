"""A digest that names the weights a preset loads: what a recording carries so that a replay on other
weights is refused instead of silently producing other frames.

- Random weights (no checkpoint, no bundle): `random:<seed>`; they are a function of the seed and
  the code, as the frames are.
- A checkpoint directory (given, or the preset's bundled one): sha256 over every weight, index,
  config and tokenizer file under it, in path order, each as its relative path, its size and its
  content. Files up to `WHOLE_FILE_BYTES` are read whole (the bundled weights: milliseconds). Larger
  ones, a released 14B's 2 GiB shards, are read as their first and last MiB and `SAMPLES` evenly
  spaced MiB between: a safetensors file's first MiB is its header (every name, dtype, shape and
  offset), so this tells apart any two releases or conversions, and reading 70 GB at every start
  would take minutes. A single edited weight inside an unsampled region of a large file is the one
  change it does not see.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from workers.models import loading
from workers.models.presets import ModelPreset

WHOLE_FILE_BYTES = 64 * 2**20
BLOCK_BYTES = 2**20
SAMPLES = 14
SUFFIXES = (".safetensors", ".pth", ".json", ".model")


def weights_digest(preset: ModelPreset, checkpoint_dir: str | Path | None, weights_seed: int) -> str:
    directory = loading.checkpoint_dir_for(preset, checkpoint_dir)
    if directory is None:
        return f"random:{weights_seed}"
    digest = hashlib.sha256()
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.relative_to(directory).as_posix()}\0{size}\0".encode())
        with path.open("rb") as f:
            if size <= WHOLE_FILE_BYTES:
                digest.update(f.read())
                continue
            step = (size - BLOCK_BYTES) // (SAMPLES + 1)
            for offset in [0, *(step * (i + 1) for i in range(SAMPLES)), size - BLOCK_BYTES]:
                f.seek(offset)
                digest.update(f.read(BLOCK_BYTES))
    return f"sha256:{digest.hexdigest()}"
