"""Released weights as people get them: the published file names, a DiT-only release with its
assets, and resolution through a Hugging Face cache in huggingface_hub's layout. Nothing here
reaches the network: the caches are built by tests/support/releases.py, and downloads go to a
test double that moves files into the cache the way the library would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.releases import header_only_release, populate_hf_cache, write_index
from workers.__main__ import main as models_main
from workers.models import checkpoint_files, hub
from workers.models.checkpoint_files import CheckpointMissing
from workers.models.hub_files import LINGBOT_1_3B_HUB, LINGBOT_14B_HUB, LINGBOT_14B_REPO, HubFiles
from workers.models.presets import LINGBOT_1_3B, LINGBOT_14B, MATRIX_GAME_UNIVERSAL, PRESETS
from workers.models.resolve import resolve_weights

REPO_13B = LINGBOT_1_3B_HUB.dit.repo_id


@pytest.fixture(scope="module")
def release_14b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 14B release's files under their published names, header-only at full size. Read-only."""
    return header_only_release(tmp_path_factory.mktemp("release_14b"), LINGBOT_14B, LINGBOT_14B_HUB.dit)


def _fresh_14b(root: Path) -> Path:
    return header_only_release(root, LINGBOT_14B, LINGBOT_14B_HUB.dit)


def _fresh_13b(root: Path) -> dict[str, Path]:
    """The 1.3B's own repository (its DiT at the root) and the 14B's assets, each in a folder."""
    assets = LINGBOT_1_3B_HUB.assets
    assert assets is not None
    return {
        REPO_13B: header_only_release(root / "13b", LINGBOT_1_3B, LINGBOT_1_3B_HUB.dit),
        LINGBOT_14B_REPO: header_only_release(root / "14b-assets", LINGBOT_1_3B, assets, with_dit=False),
    }


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


# ---- the files as published ----


def test_the_14b_release_as_published_passes_verify(release_14b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dit = release_14b / "transformers"
    assert sorted(p.name for p in dit.iterdir()) == [
        "diffusion_pytorch_model.safetensors.index.json",
        *(f"model-0000{k}-of-00008.safetensors" for k in range(1, 9)),
    ]
    assert checkpoint_files.missing_files(LINGBOT_14B, release_14b) == []
    assert models_main(["verify", LINGBOT_14B.name, "--checkpoint-dir", str(release_14b)]) == 0
    out = capsys.readouterr().out
    assert "dit: ok" in out and "vae: ok" in out and "t5: ok" in out and "checkpoint matches the preset" in out


@pytest.mark.heavy
def test_the_13b_starts_from_its_own_download_and_the_14b_assets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folders = _fresh_13b(tmp_path)
    dit_only, assets = folders[REPO_13B], folders[LINGBOT_14B_REPO]
    assert sorted(p.name for p in dit_only.iterdir())[-1] == "model.safetensors.index.json"
    # Alone it is refused, saying what would complete it.
    with pytest.raises(CheckpointMissing, match=r"it holds a DiT alone.*pass --assets-dir DIR") as info:
        resolve_weights(LINGBOT_1_3B, dit_only)
    assert "Wan2.1_VAE.pth" in str(info.value)
    # With the assets: one directory in the released layout, its files links to the two downloads.
    composed = resolve_weights(LINGBOT_1_3B, dit_only, assets, composed_root=tmp_path / "composed")
    assert composed is not None and composed.is_relative_to(tmp_path / "composed")
    assert os.readlink(composed / "transformers" / "model-00006-of-00006.safetensors") == str(
        dit_only / "model-00006-of-00006.safetensors"
    )
    assert os.readlink(composed / "Wan2.1_VAE.pth") == str(assets / "Wan2.1_VAE.pth")
    # Composing again reuses it; verify passes on the pair.
    assert resolve_weights(LINGBOT_1_3B, dit_only, assets, composed_root=tmp_path / "composed") == composed
    args = ["verify", LINGBOT_1_3B.name, "--checkpoint-dir", str(dit_only), "--assets-dir", str(assets)]
    assert models_main(args) == 0
    assert "checkpoint matches the preset" in capsys.readouterr().out


def test_a_dit_index_is_found_by_its_suffix_and_two_that_disagree_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "transformers"
    folder.mkdir()
    write_index(folder / "diffusion_pytorch_model.safetensors.index.json", {"a": "s1.safetensors"}, 4)
    assert checkpoint_files.find_index(folder) == folder / "diffusion_pytorch_model.safetensors.index.json"
    # A copy under another name agrees: accepted.
    write_index(folder / "model.safetensors.index.json", {"a": "s1.safetensors"}, 4)
    assert checkpoint_files.index_shards(checkpoint_files.find_index(folder)) == ["s1.safetensors"]
    # One that names other shards: refused, naming both.
    write_index(folder / "model.safetensors.index.json", {"a": "s2.safetensors"}, 4)
    with pytest.raises(ValueError, match="two safetensors indexes that disagree") as info:
        checkpoint_files.find_index(folder)
    assert "diffusion_pytorch_model.safetensors.index.json" in str(info.value)
    assert "model.safetensors.index.json" in str(info.value)
    assert checkpoint_files.missing_files(LINGBOT_14B, tmp_path)[0].startswith("transformers/ (")


# ---- the Hugging Face cache ----


def test_presets_pin_a_revision_and_name_only_the_files_they_read() -> None:
    for preset in PRESETS.values():
        if preset.hub is None:
            continue
        for source in preset.hub.repos:
            assert len(source.revision) == 40, preset.name
            assert all("*" not in f for f in source.files), "exact files, no patterns"
    matrix = MATRIX_GAME_UNIVERSAL.hub
    assert matrix is not None and not any(f.startswith(("base_model/", "gta_")) for f in matrix.dit.files)
    with pytest.raises(ValueError, match="full commit hash"):
        HubFiles("org/name", "main", ("a",), 1)


@pytest.mark.heavy
def test_a_complete_cache_resolves_without_a_directory(tmp_path: Path, offline: None) -> None:
    cache = tmp_path / "hub"
    populate_hf_cache(cache, LINGBOT_14B_HUB, {LINGBOT_14B_REPO: _fresh_14b(tmp_path / "release")})
    path = resolve_weights(LINGBOT_14B, cache_dir=cache)
    assert (
        path
        == cache / "models--robbyant--lingbot-world-v2-14b-causal-fast" / "snapshots" / LINGBOT_14B_HUB.dit.revision
    )
    assert (path / "transformers" / "diffusion_pytorch_model.safetensors.index.json").is_symlink()


@pytest.mark.heavy
def test_the_13b_resolves_from_two_repositories_in_the_cache(tmp_path: Path, offline: None) -> None:
    cache = tmp_path / "hub"
    populate_hf_cache(cache, LINGBOT_1_3B_HUB, _fresh_13b(tmp_path / "release"))
    path = resolve_weights(LINGBOT_1_3B, cache_dir=cache, composed_root=tmp_path / "composed")
    assert path is not None and checkpoint_files.missing_files(LINGBOT_1_3B, path) == []
    assert (path / "transformers" / "model.safetensors.index.json").resolve().is_relative_to(cache.resolve())


def test_offline_with_an_empty_cache_refuses_naming_repository_files_and_command(tmp_path: Path, offline: None) -> None:
    with pytest.raises(hub.WeightsNotCached) as info:
        resolve_weights(LINGBOT_14B, cache_dir=tmp_path / "empty", download=True)
    message = str(info.value)
    assert "HF_HUB_OFFLINE is set" in message and LINGBOT_14B_REPO in message
    assert "transformers/model-00008-of-00008.safetensors" in message and "Wan2.1_VAE.pth" in message
    assert "`worldrtc fetch lingbot-world-v2-14b`" in message


@pytest.mark.heavy
def test_a_partial_cache_asks_for_exactly_the_missing_files_at_the_pinned_revision(
    tmp_path: Path, online: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, release = tmp_path / "hub", _fresh_14b(tmp_path / "release")
    source = LINGBOT_14B_HUB.dit
    have = {f for f in source.files if not f.endswith(("00003-of-00008.safetensors", "Wan2.1_VAE.pth"))}
    populate_hf_cache(cache, LINGBOT_14B_HUB, {LINGBOT_14B_REPO: release}, only=have)
    plan = hub.plan_fetch(LINGBOT_14B, cache)
    assert plan.missing == [
        (LINGBOT_14B_REPO, "transformers/model-00003-of-00008.safetensors"),
        (LINGBOT_14B_REPO, "Wan2.1_VAE.pth"),
    ]
    asked: list[tuple[str, str, str]] = []

    def downloader_double(repo_id: str, filename: str, revision: str, cache_dir: Path) -> Path:
        """Stands in for hf_hub_download: the file into the cache the way the library lays it out."""
        asked.append((repo_id, filename, revision))
        populate_hf_cache(cache_dir, LINGBOT_14B_HUB, {LINGBOT_14B_REPO: release}, only={filename})
        return cache_dir / filename

    monkeypatch.setattr(hub, "hf_download", downloader_double)
    checked: list[hub.FetchPlan] = []
    path = resolve_weights(
        LINGBOT_14B, cache_dir=cache, download=True, before_download=checked.append, say=lambda _: None
    )
    assert asked == [(r, f, source.revision) for r, f in plan.missing]
    assert [c.missing for c in checked] == [plan.missing], "the placement was checked once, before any download"
    assert path == plan.repos[0].snapshot and hub.plan_fetch(LINGBOT_14B, cache).complete
    # Without network permission (verify), the same gap is refused rather than fetched.
    partial = tmp_path / "hub2"
    populate_hf_cache(partial, LINGBOT_14B_HUB, {LINGBOT_14B_REPO: _fresh_14b(tmp_path / "r2")}, only=have)
    with pytest.raises(hub.WeightsNotCached, match="the Hugging Face cache lacks files"):
        resolve_weights(LINGBOT_14B, cache_dir=partial, download=False)


def test_a_download_waits_for_the_placement_check_and_a_failed_check_downloads_nothing(
    tmp_path: Path, online: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched: list[hub.FetchPlan] = []
    monkeypatch.setattr(hub, "hf_download", lambda *a: fetched.append(a))  # never reached

    def placement_does_not_fit(plan: hub.FetchPlan) -> None:
        raise ValueError(f"placement '4gpu': no GPU here ({len(plan.missing)} files not fetched)")

    with pytest.raises(ValueError, match=rf"no GPU here \({len(LINGBOT_14B_HUB.dit.files)} files not fetched\)"):
        resolve_weights(LINGBOT_14B, cache_dir=tmp_path / "hub", download=True, before_download=placement_does_not_fit)
    assert fetched == []


def test_files_under_another_revision_do_not_count(tmp_path: Path, offline: None) -> None:
    cache = tmp_path / "hub"
    other = HubFiles(LINGBOT_14B_REPO, "0" * 40, LINGBOT_14B_HUB.dit.files, 1)
    populate_hf_cache(cache, type(LINGBOT_14B_HUB)(other), {LINGBOT_14B_REPO: _fresh_14b(tmp_path / "release")})
    plan = hub.plan_fetch(LINGBOT_14B, cache)
    assert len(plan.missing) == len(LINGBOT_14B_HUB.dit.files)
    with pytest.raises(hub.WeightsNotCached):
        resolve_weights(LINGBOT_14B, cache_dir=cache)
