"""Run a function on N gloo ranks in spawned processes and collect each rank's return value.

Test helper: `run_ranks(fn, world_size, *args)` -> [result of rank 0, result of rank 1, …].
`fn(group: StageGroup, *args)` must be a module-level function (spawn pickles it by reference).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch

from workers.parallel.group import destroy_stage_group, init_stage_group


def _entry(fn: Callable[..., Any], rank: int, world_size: int, init_file: str, args: tuple, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    try:
        group = init_stage_group(f"file://{init_file}", rank, world_size, torch.device("cpu"), timeout_s=60)
        try:
            result = fn(group, *args)
        finally:
            destroy_stage_group(group)
        out.put((rank, True, result))
    except BaseException:  # report every failure, including assertion errors, to the parent
        out.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="worldrtc-dist-")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it; a stale file would confuse rendezvous
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world_size, init_file, args, out), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            rank, ok, value = out.get(timeout=timeout_s)
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank} failed:\n{value}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        if os.path.exists(init_file):
            os.unlink(init_file)
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]
