"""Where a run's CPU went: cores used per process over a window, beside the machine's total.

A viewer that gets fewer frames than the model makes per second is either waiting on one stage
that is too slow (a worker near one full core at its one intra-op thread) or on a machine that is
full (busy near its core count). The readings tell which: CPU seconds of the server process, each
stage's workers and this process (the benchmark's own clients) between two readings, over the
window's wall time, and the machine's busy, idle and stolen time from /proc/stat (stolen: time the
hypervisor gave the virtual CPUs to someone else, which makes the same work take longer).

    before = read(worker_pids)        # worker_pids as /v1/engine lists them: {"dit": [pid], ...}
    ...
    usage = cores_used(before, read(worker_pids))
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import psutil

CLIENTS = "clients"  # this process: the benchmark's aiortc peers, decoders and bookkeeping
SERVER = "server"  # the worker processes' parent: HTTP, signaling, pacers, video encoders


@dataclass(frozen=True)
class CpuReading:
    at_s: float  # time.monotonic()
    process_cpu_s: dict[str, float]  # role -> user + system seconds of its processes so far
    machine_s: dict[str, float]  # busy, idle and steal seconds over all cores so far


def _cpu_s(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system


def roles(worker_pids: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each role's processes: every stage's workers, their parent (the server) and this process."""
    out = {stage: list(pids) for stage, pids in worker_pids.items() if pids}
    parents = set()
    for pids in out.values():
        for pid in pids:
            try:
                parents.add(psutil.Process(pid).ppid())
            except psutil.Error:
                continue
    parents.discard(os.getpid())  # an in-process engine's workers are this process's children
    if parents:
        out[SERVER] = sorted(parents)
    out[CLIENTS] = [os.getpid()]
    return out


def read(worker_pids: dict[str, list[int]]) -> CpuReading:
    processes: dict[str, float] = {}
    for role, pids in roles(worker_pids).items():
        seconds = [s for s in map(_cpu_s, pids) if s is not None]
        if seconds:
            processes[role] = sum(seconds)
    m = psutil.cpu_times()
    idle = m.idle + getattr(m, "iowait", 0.0)
    steal = getattr(m, "steal", 0.0)
    busy = sum(m) - idle - steal - getattr(m, "guest", 0.0) - getattr(m, "guest_nice", 0.0)
    return CpuReading(time.monotonic(), processes, {"busy": busy, "idle": idle, "steal": steal})


def cores_used(before: CpuReading, after: CpuReading) -> dict[str, Any]:
    """Cores used on average over the window: per role (those read at both ends), the machine's busy
    cores, what the roles do not account for (`other`: the rest of the machine), idle and stolen."""
    wall = after.at_s - before.at_s
    if wall <= 0:
        raise ValueError("the second reading must come after the first")
    per_role = {
        role: (after.process_cpu_s[role] - before.process_cpu_s[role]) / wall
        for role in after.process_cpu_s
        if role in before.process_cpu_s
    }
    machine = {k: (after.machine_s[k] - before.machine_s[k]) / wall for k in after.machine_s}
    return {
        "window_s": wall,
        "cores": psutil.cpu_count() or 0,
        "processes": per_role,
        "machine_busy": machine["busy"],
        "other": max(0.0, machine["busy"] - sum(per_role.values())),
        "idle": machine["idle"],
        "steal": machine["steal"],
    }


def describe(usage: dict[str, Any]) -> str:
    parts = ", ".join(f"{role} {cores:.2f}" for role, cores in usage["processes"].items())
    return (
        f"cores used over {usage['window_s']:.0f} s: {parts}, other {usage['other']:.2f}; machine busy "
        f"{usage['machine_busy']:.2f} of {usage['cores']}, idle {usage['idle']:.2f}, stolen {usage['steal']:.2f}"
    )
