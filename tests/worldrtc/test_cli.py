"""`worldrtc`, the one command, as a person runs it: help, serve, verify, plan, replay and fetch,
against Hugging Face caches and release directories laid out as published (tests/support/releases.py).
These start processes (the command itself, and a server), so they are not in the fast tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.local_server import local_server
from tests.conftest import TINY_WEIGHTS_SEED
from tests.support.releases import header_only_release, populate_hf_cache, tiny_release
from workers.models.hub_files import LINGBOT_14B_HUB, LINGBOT_14B_REPO
from workers.models.presets import LINGBOT_14B, TINY

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
OFFLINE_REFUSAL_S = 5.0


def worldrtc(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`worldrtc ARGS` (the console script's module, so the test needs no installed entry point)."""
    full_env = {**os.environ, **(env or {})}
    cmd = [sys.executable, "-m", "worldrtc", *args]
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def cache_14b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face cache holding the 14B release's files (header-only), as huggingface_hub lays it out."""
    root = tmp_path_factory.mktemp("hf")
    release = header_only_release(root / "release", LINGBOT_14B, LINGBOT_14B_HUB.dit)
    populate_hf_cache(root / "hub", LINGBOT_14B_HUB, {LINGBOT_14B_REPO: release})
    return root / "hub"


def offline(cache: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "WORLDRTC_CACHE": str(cache.parent / "worldrtc")}


def test_help_lists_commands_presets_and_placements() -> None:
    done = worldrtc("--help")
    assert done.returncode == 0, done.stderr
    for word in ("serve", "fetch", "verify", "plan", "replay", "gridworld", LINGBOT_14B_REPO, "4gpu", "7gpu-split"):
        assert word in done.stdout, word
    script = Path(sys.executable).parent / "worldrtc"
    if script.exists():  # installed by `pip install -e .` (make setup): the console script is this module
        assert subprocess.run([str(script), "--help"], capture_output=True, text=True).stdout == done.stdout


@pytest.mark.long
def test_verify_and_serve_resolve_the_14b_from_the_cache_without_a_directory(cache_14b: Path) -> None:
    env = offline(cache_14b)
    snapshot = cache_14b / "models--robbyant--lingbot-world-v2-14b-causal-fast" / "snapshots"
    done = worldrtc("verify", LINGBOT_14B.name, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"weights: {snapshot / LINGBOT_14B_HUB.dit.revision} (the Hugging Face cache)" in done.stdout
    assert "checkpoint matches the preset" in done.stdout
    # serve finds every file, then stops where this machine cannot go on: it has no GPU.
    done = worldrtc("serve", LINGBOT_14B.name, "--placement", "4gpu", env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{LINGBOT_14B.name} weights in {snapshot / LINGBOT_14B_HUB.dit.revision}" in done.stdout
    assert "placement '4gpu'" in done.stderr and "CUDA device(s)" in done.stderr


@pytest.mark.parametrize("command", [("verify",), ("serve",), ("replay", "--out", "unused.json", "--model")])
def test_an_empty_cache_offline_is_refused_quickly_with_what_to_do(tmp_path: Path, command: tuple[str, ...]) -> None:
    t0 = time.monotonic()
    extra = ("--placement", "4gpu") if command == ("serve",) else ()
    done = worldrtc(*command, LINGBOT_14B.name, *extra, env=offline(tmp_path / "empty"))
    elapsed = time.monotonic() - t0
    assert done.returncode in (1, 2), done.stdout + done.stderr
    assert elapsed <= OFFLINE_REFUSAL_S, f"refused after {elapsed:.1f} s"
    for words in (
        LINGBOT_14B_REPO,
        "transformers/model-00001-of-00008.safetensors",
        "worldrtc fetch lingbot-world-v2-14b",
    ):
        assert words in done.stderr, (words, done.stderr)


def test_fetch_offline_says_what_it_would_download(tmp_path: Path) -> None:
    done = worldrtc("fetch", LINGBOT_14B.name, "--dry-run", env=offline(tmp_path / "empty"))
    assert done.returncode == 0, done.stderr
    assert "0 of 12 files cached" in done.stdout and "about 86.1 GB" in done.stdout
    done = worldrtc("fetch", LINGBOT_14B.name, env=offline(tmp_path / "empty"))
    assert done.returncode == 1 and "HF_HUB_OFFLINE is set" in done.stderr


@pytest.mark.long
def test_plan_and_replay_run_from_the_command(tmp_path: Path) -> None:
    done = worldrtc("plan", "lingbot-world-v2-1.3b", "--placement", "1gpu", "--device-gib", "80")
    assert done.returncode == 0 and "cuda:0" in done.stdout, done.stdout + done.stderr
    out = tmp_path / "run.json"
    done = worldrtc("replay", "--model", "tiny", "--chunks", "2", "--quiet", "--out", str(out), timeout_s=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(out.read_text())["num_frames"] > 0


@pytest.mark.long
def test_a_server_starts_from_a_directory_with_the_14b_file_names(tmp_path: Path) -> None:
    """`tiny`'s weights under the published names (diffusion_pytorch_model.safetensors.index.json and
    eight model-0000k-of-00008 shards): `worldrtc serve` loads them and becomes ready."""
    release = tiny_release(tmp_path / "release", TINY, LINGBOT_14B_HUB.dit, TINY_WEIGHTS_SEED)
    args = ["tiny", "--checkpoint-dir", str(release), "--max-sessions", "1"]
    with local_server(args, tmp_path / "server.log", entry=("-m", "worldrtc", "serve")) as server:
        model = httpx.get(f"{server.url}/v1/model", timeout=10).json()
        assert model["model"] == "tiny"
    log = (tmp_path / "server.log").read_text()
    assert "worldrtc: open http://127.0.0.1:" in log
