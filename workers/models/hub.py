"""Released weights by model id, through the Hugging Face cache people already have.

A preset with `hub` files (workers/models/hub_files.py) needs no directory flag: its files are
looked up in the standard cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub)
at the preset's pinned revision, in the cache's own layout
(`models--ORG--NAME/snapshots/<revision>/<file>`, links into `blobs/`), so a download made by
`huggingface-cli`, `snapshot_download` or another tool serves as well as ours.

- `plan_fetch` says, per repository, which of the preset's files are cached and which are missing,
  touching only the file system.
- `fetch` downloads exactly the missing files with `huggingface_hub` (`HF_TOKEN` for gated
  repositories; a progress bar with bytes, rate and time left; an interrupted file resumes from
  its `.incomplete` part) and nothing else of the repository.
- `snapshot` is the directory the loaders read: the repository's snapshot, or for a release that
  ships its DiT alone, the DiT's snapshot composed with the assets' (workers/models/weights_dir.py).
- With `HF_HUB_OFFLINE=1` nothing is downloaded: a complete cache resolves, anything else is
  refused with the repository, the missing files and the command that fetches them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workers.models.checkpoint_files import CheckpointMissing
from workers.models.hub_files import GB, HubFiles, HubWeights
from workers.models.presets import ModelPreset
from workers.models.weights_dir import compose

# (repo_id, filename, revision, cache_dir) -> the file's path in the cache.
Downloader = Callable[[str, str, str, Path], Path]


def default_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (1, true, yes, on)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def fetch_command(preset: ModelPreset) -> str:
    return f"worldrtc fetch {preset.name}"


@dataclass(frozen=True)
class RepoPlan:
    source: HubFiles
    snapshot: Path  # <cache>/models--ORG--NAME/snapshots/<revision>
    cached: tuple[str, ...]
    missing: tuple[str, ...]

    def describe(self) -> str:
        what = f"{len(self.cached)} of {len(self.source.files)} files cached"
        if self.missing:
            what += "; missing: " + ", ".join(self.missing)
        return f"{self.source.repo_id}@{self.source.revision[:12]}: {what}"


@dataclass(frozen=True)
class FetchPlan:
    preset: ModelPreset
    hub: HubWeights
    repos: tuple[RepoPlan, ...]

    @property
    def complete(self) -> bool:
        return not any(r.missing for r in self.repos)

    @property
    def missing(self) -> list[tuple[str, str]]:
        """(repo_id, file) for every file still to download, in the order they would be fetched."""
        return [(r.source.repo_id, f) for r in self.repos for f in r.missing]

    def describe(self) -> str:
        size = f"about {self.hub.approx_bytes / GB:.1f} GB in all"
        return f"{self.preset.name} ({size}):\n" + "\n".join(f"  {r.describe()}" for r in self.repos)


def hub_weights(preset: ModelPreset) -> HubWeights:
    if preset.hub is None:
        raise ValueError(f"{preset.name} has no released weights on the Hugging Face Hub")
    return preset.hub


def repo_folder(cache_dir: Path, repo_id: str) -> Path:
    """The cache's folder of a model repository (huggingface_hub's naming)."""
    return cache_dir / ("models--" + repo_id.replace("/", "--"))


def plan_fetch(preset: ModelPreset, cache_dir: Path | None = None) -> FetchPlan:
    """Which of the preset's files the cache holds at the pinned revision (file system only)."""
    hub = hub_weights(preset)
    cache = cache_dir or default_cache_dir()
    repos = []
    for source in hub.repos:
        snapshot = repo_folder(cache, source.repo_id) / "snapshots" / source.revision
        cached = tuple(f for f in source.files if (snapshot / f).is_file())
        missing = tuple(f for f in source.files if f not in cached)
        repos.append(RepoPlan(source, snapshot, cached, missing))
    return FetchPlan(preset, hub, tuple(repos))


class WeightsNotCached(CheckpointMissing):
    """The cache lacks files of a preset and nothing may be downloaded (offline, or `verify`)."""


def refuse(plan: FetchPlan, why: str) -> WeightsNotCached:
    lines = "; ".join(r.describe() for r in plan.repos if r.missing)
    return WeightsNotCached(
        f"{plan.preset.name}: {why}: {lines}. Fetch them with `{fetch_command(plan.preset)}` "
        f"(or pass --checkpoint-dir DIR with the release as published)"
    )


def hf_download(repo_id: str, filename: str, revision: str, cache_dir: Path) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache_dir))


def fetch(
    plan: FetchPlan,
    download: Downloader | None = None,
    cache_dir: Path | None = None,
    say: Callable[[str], None] = print,
) -> FetchPlan:
    """Download the plan's missing files, one by one, into the cache (with `hf_download` unless
    told otherwise); returns the plan after it."""
    if offline() and not plan.complete:
        raise refuse(plan, "HF_HUB_OFFLINE is set and the cache lacks files")
    cache = cache_dir or default_cache_dir()
    todo = plan.missing
    for k, (repo_id, name) in enumerate(todo, 1):
        source = next(r.source for r in plan.repos if r.source.repo_id == repo_id)
        say(f"fetch {k}/{len(todo)}: {repo_id}/{name}")
        (download or hf_download)(repo_id, name, source.revision, cache)
    after = plan_fetch(plan.preset, cache)
    if not after.complete:  # a downloader that returned without the file: never load half a release
        raise refuse(after, "the download ended without every file")
    return after


def snapshot(plan: FetchPlan, composed_root: Path | None = None) -> Path:
    """The directory the loaders read, for a complete plan."""
    assert plan.complete, "snapshot of an incomplete plan"
    if plan.hub.assets is None:
        return plan.repos[0].snapshot
    return compose(plan.repos[0].snapshot, plan.repos[1].snapshot, composed_root)
