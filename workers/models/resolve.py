"""The one place a start decides which directory a preset's weights load from.

In order:
1. `--checkpoint-dir DIR`: the release as its owners publish it (workers/models/checkpoint_files.py
   finds its files by their indexes). With `--assets-dir A` too, DIR's DiT and A's VAE, umT5 and
   tokenizer are composed into one directory (workers/models/weights_dir.py): a DiT-only release
   such as the 1.3B's starts from its own download plus the 14B's.
2. Bundled weights (the embedded worlds) or seeded random ones (test fixtures): nothing to resolve.
3. A released preset without a directory: its files through the Hugging Face cache at the pinned
   revision (workers/models/hub.py). Missing files are downloaded where that is allowed, after
   `before_download` (the server's memory plan and device check: a placement that cannot run is
   refused before tens of gigabytes arrive); offline, or where downloads are not allowed (`verify`),
   they are refused by name with the command that fetches them.

Every result is checked for completeness by name before any worker starts (checkpoint_files).
Torch-free except what `before_download` brings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from workers.models.checkpoint_files import CheckpointMissing, needs_checkpoint, require_checkpoint
from workers.models.hub import FetchPlan, fetch, offline, plan_fetch, refuse, snapshot
from workers.models.presets import ModelPreset
from workers.models.weights_dir import compose


def resolve_weights(
    preset: ModelPreset,
    checkpoint_dir: str | Path | None = None,
    assets_dir: str | Path | None = None,
    *,
    download: bool = False,
    before_download: Callable[[FetchPlan], None] | None = None,
    cache_dir: Path | None = None,
    composed_root: Path | None = None,
    say: Callable[[str], None] = print,
) -> Path | None:
    """The checkpoint directory to load, or None for bundled or random weights (see the module doc).

    Raises CheckpointMissing (a ValueError) naming what is missing and how to get it."""
    if checkpoint_dir is not None:
        return _local(preset, Path(checkpoint_dir), None if assets_dir is None else Path(assets_dir), composed_root)
    if assets_dir is not None:
        raise CheckpointMissing("--assets-dir completes a --checkpoint-dir that holds a DiT alone; pass both")
    if not needs_checkpoint(preset):
        return None
    if preset.hub is None:
        require_checkpoint(preset, None)  # raises, naming the directory it needs
    plan = plan_fetch(preset, cache_dir)
    if not plan.complete:
        if offline():
            raise refuse(plan, "HF_HUB_OFFLINE is set and the Hugging Face cache lacks files")
        if not download:
            raise refuse(plan, "the Hugging Face cache lacks files")
        if before_download is not None:
            before_download(plan)
        say(f"downloading into the Hugging Face cache ({cache_dir or 'HF_HUB_CACHE'}): {plan.describe()}")
        plan = fetch(plan, cache_dir=cache_dir, say=say)
    path = snapshot(plan, composed_root)
    require_checkpoint(preset, path)
    return path


def _local(preset: ModelPreset, checkpoint_dir: Path, assets_dir: Path | None, composed_root: Path | None) -> Path:
    if assets_dir is None:
        require_checkpoint(preset, checkpoint_dir)
        return checkpoint_dir
    for flag, path in (("--checkpoint-dir", checkpoint_dir), ("--assets-dir", assets_dir)):
        if not path.is_dir():
            raise CheckpointMissing(f"{flag} {path} is not a directory")
    try:
        composed = compose(checkpoint_dir, assets_dir, composed_root)
    except (FileNotFoundError, ValueError) as exc:
        raise CheckpointMissing(f"--checkpoint-dir {checkpoint_dir}: {exc}") from None
    try:
        require_checkpoint(preset, composed)
    except CheckpointMissing as exc:
        raise CheckpointMissing(
            f"{exc} (the DiT of --checkpoint-dir {checkpoint_dir} with the VAE, umT5 and tokenizer of "
            f"--assets-dir {assets_dir}, composed in {composed})"
        ) from None
    return composed
