"""Shared fixtures (a tiny checkpoint in the official on-disk layout, single-threaded torch) and the
test tiers.

Tiers are markers: `processes` (starts worker processes, gloo ranks or subprocesses), `training`
(runs training loops), `browser` (drives Chromium), `gpu` (needs CUDA), `heavy` (builds, loads or
runs a model for half a second or more), `long` (11 s or more on two cores: `make test-long`), `slow`
(soak; only on purpose).
`make test-fast` runs the tests with none of them. The tier is enforced: a test without
one of the process-starting markers that starts a process fails, naming the marker to add.
"""

from __future__ import annotations

import json
import multiprocessing.process
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from workers.determinism import intra_op_threads
from workers.models import components, loading
from workers.models.presets import TINY
from workers.models.weights_dir import CACHE_ENV
from workers.runtime.channel import SEGMENT_PREFIX, leaked_segments, remove_segments

# The checkpoint is written from the weights `weights_seed` gives each component (components.SEED_OFFSETS),
# so an engine loading it and one seeded with it must agree.
TINY_WEIGHTS_SEED = 3
DIT_SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@dataclass(frozen=True)
class TinyCheckpoint:
    path: Path
    dit: dict[str, torch.Tensor]
    vae: dict[str, torch.Tensor]
    t5: dict[str, torch.Tensor]
    weight_map: dict[str, str]
    weights_seed: int

    def copy_to(self, dest: Path) -> Path:
        """A private copy the caller may break."""
        shutil.copytree(self.path, dest)
        return dest

    @staticmethod
    def edit_shard(checkpoint_dir: Path, shard: str, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
        """Load one DiT shard, let `edit` change the dict in place, write it back."""
        path = checkpoint_dir / loading.DIT_SUBDIR / shard
        state = load_file(str(path))
        edit(state)
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))


def write_dit_shards(root: Path, state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Split `state` across the two shards (first half of the keys, second half) plus the index."""
    sub = root / loading.DIT_SUBDIR
    sub.mkdir(parents=True, exist_ok=True)
    keys = list(state)
    half = len(keys) // 2
    weight_map: dict[str, str] = {}
    for shard, shard_keys in zip(DIT_SHARDS, (keys[:half], keys[half:]), strict=True):
        save_file({k: state[k].contiguous() for k in shard_keys}, str(sub / shard))
        weight_map.update(dict.fromkeys(shard_keys, shard))
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (sub / loading.DIT_INDEX).write_text(json.dumps(index, indent=1))
    return weight_map


def _clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> TinyCheckpoint:
    """The `tiny` preset's seeded random weights, written in the released checkpoint layout. Read-only."""
    root = tmp_path_factory.mktemp("tiny_checkpoint")
    cpu = torch.device("cpu")
    seed = TINY_WEIGHTS_SEED
    dit = _clone(components.load_dit(TINY, cpu, None, seed).state_dict())
    vae = _clone(components.load_vae(TINY, cpu, None, seed).state_dict())
    t5 = _clone(components.load_text_encoder(TINY, cpu, None, seed).encoder.state_dict())
    weight_map = write_dit_shards(root, dit)
    torch.save(vae, root / loading.VAE_FILE)
    torch.save(t5, root / loading.T5_FILE)
    return TinyCheckpoint(path=root, dit=dit, vae=vae, t5=t5, weight_map=weight_map, weights_seed=seed)


@pytest.fixture(scope="session", autouse=True)
def own_worldrtc_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """worldrtc's cache (composed weight directories, stored memory-plan traces) in a directory of the
    run's own, for every test and every process it starts: a run neither reads what another left nor
    leaves what a test's patched code traced; within the run, a server's start plans from the store."""
    path = tmp_path_factory.mktemp("worldrtc-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV, str(path))
        yield path


@pytest.fixture
def single_thread_torch() -> Iterator[None]:
    """Run torch on one intra-op thread for the test (2-core runners oversubscribe badly otherwise)."""
    with intra_op_threads(1):
        yield


PROCESS_MARKERS = ("processes", "training", "browser", "gpu", "slow", "container")

# `-m "not (a or b or ...)"` (the tiers in the Makefile) deselects every test of a module whose
# `pytestmark` carries one of the names: such a module is not even imported (the fast tier would
# otherwise spend seconds importing the servers, peers and harnesses it never runs).
EXCLUDING_ONLY = re.compile(r"not \((\w+(?: or \w+)*)\)")
MODULE_MARKS = re.compile(r"^pytestmark = (.+)$", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    excluded = EXCLUDING_ONLY.fullmatch(str(config.getoption("markexpr") or "").strip())
    if excluded is None or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    line = MODULE_MARKS.search(collection_path.read_text())
    marks = set(re.findall(r"pytest\.mark\.(\w+)", line.group(1))) if line else set()
    return True if marks & set(excluded.group(1).split(" or ")) else None


# Shared-memory channel files whose producer died, left behind by a test (its module fixtures'
# teardown included), by test id. Each test's own checks look at the processes it knows; this
# catches a stop path none of them anticipated, names the test, and fails the run at its end.
ORPHANED_SEGMENTS: dict[str, list[str]] = {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _orphans(names: set[str]) -> dict[int, list[str]]:
    by_pid: dict[int, list[str]] = {}
    for name in sorted(names):
        pid = int(name[len(SEGMENT_PREFIX) :].split("-", 1)[0])
        if not _pid_alive(pid):
            by_pid.setdefault(pid, []).append(name)
    return by_pid


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if ORPHANED_SEGMENTS:
        lines = [f"  {test}: {', '.join(names)}" for test, names in ORPHANED_SEGMENTS.items()]
        print("\nshared-memory files left by exited processes (removed now):\n" + "\n".join(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    """Refuse process starts (setup, call and teardown) in tests of the fast tier; in the others,
    record (and remove) the channel files of processes that exited without unlinking them."""
    if any(item.get_closest_marker(m) for m in PROCESS_MARKERS):
        before = set(leaked_segments())
        yield
        for pid, names in _orphans(set(leaked_segments()) - before).items():
            ORPHANED_SEGMENTS.setdefault(item.nodeid, []).extend(names)
            remove_segments(pid)
        return

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(
            f"{item.nodeid} starts a process but carries none of the markers {PROCESS_MARKERS}; "
            "mark it @pytest.mark.processes (or training/browser) so the fast tier stays process-free"
        )

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        mp.setattr(subprocess.Popen, "__init__", refuse)
        yield
