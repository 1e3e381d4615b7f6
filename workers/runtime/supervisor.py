"""Worker supervision: spawn a stage's ranks, wait until they are warm, notice deaths, kill, restart.

Each stage is one process per rank (spawn start method), joined to its rank-0 peers by a
torch.distributed file rendezvous when it has several. The supervisor owns the processes and their
pipes; it makes no scheduling decision.

The first start blocks until every stage is warm. A restart does not: `restart` spawns the stage
and returns, the engine's thread keeps serving, and feeds the new workers' start-up messages to
`on_start_message` until the stage is ready (or `check_starting` finds it dead or late).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from workers.runtime.channel import remove_segments
from workers.runtime.messages import STAGES, Stage, StageFailed, WorkerReady
from workers.runtime.spec import WorkerSpec
from workers.runtime.worker import worker_main

READY_POLL_S = 0.1
REAP_GRACE_S = 5.0  # a killed child, and the resource tracker once its pipe is closed, exit within this


class EngineError(RuntimeError):
    """The engine cannot serve a request (not started, full, workers failed to start)."""


@dataclass
class StageProcesses:
    stage: Stage
    specs: tuple[WorkerSpec, ...]  # one per rank, without the rendezvous (set per spawn)
    procs: list[mp.process.BaseProcess] = field(default_factory=list)
    conns: list[Connection] = field(default_factory=list)
    alive: bool = False
    dist_dir: str | None = None
    starting_until: float | None = None  # a restart in progress must be ready by then (monotonic)
    ready_ranks: set[int] = field(default_factory=set)


class WorkerSupervisor:
    def __init__(self, specs: dict[Stage, tuple[WorkerSpec, ...]], start_timeout_s: float) -> None:
        self.stages = {s: StageProcesses(s, specs[s]) for s in STAGES}
        self.start_timeout_s = start_timeout_s
        self.restarts = 0

    def start(self, stages: tuple[Stage, ...] = STAGES) -> None:
        """Spawn the stages' workers and wait until all have loaded their models; kill them all on failure."""
        try:
            for stage in stages:
                self._spawn(stage)
            for stage in stages:
                self._await_ready(stage)
        except BaseException:
            for stage in stages:
                self.kill(stage)
            raise

    def restart(self, stage: Stage) -> None:
        """Kill what is left of the stage and spawn it again, without waiting for it."""
        self.kill(stage)
        self.restarts += 1
        self._spawn(stage)
        p = self.stages[stage]
        p.starting_until = time.monotonic() + self.start_timeout_s
        p.ready_ranks = set()

    def starting(self, stage: Stage) -> bool:
        return self.stages[stage].starting_until is not None

    def on_start_message(self, stage: Stage, rank: int, msg: object) -> bool:
        """A restarting stage's worker reported; True once all its ranks are ready."""
        p = self.stages[stage]
        if isinstance(msg, StageFailed):
            raise EngineError(msg.error)
        if not isinstance(msg, WorkerReady):
            raise EngineError(f"{stage.value} worker rank {rank} sent {type(msg).__name__} while starting")
        p.ready_ranks.add(rank)
        if len(p.ready_ranks) < len(p.procs):
            return False
        p.starting_until, p.alive = None, True
        return True

    def check_starting(self) -> None:
        """Raise if a restarting stage's worker died or is late."""
        for stage, p in self.stages.items():
            if p.starting_until is None:
                continue
            for rank, proc in enumerate(p.procs):
                if rank not in p.ready_ranks and not proc.is_alive():
                    raise EngineError(f"{stage.value} worker rank {rank} exited during start-up")
            if time.monotonic() > p.starting_until:
                raise EngineError(f"{stage.value} worker not ready after {self.start_timeout_s:.0f} s")

    def kill(self, stage: Stage) -> None:
        p = self.stages[stage]
        for proc in p.procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            if proc.pid is not None:
                # A worker that did not exit cleanly cannot unlink its own slot files.
                remove_segments(proc.pid)
        for conn in p.conns:
            conn.close()
        p.procs, p.conns, p.alive, p.starting_until = [], [], False, None
        if p.dist_dir:
            shutil.rmtree(p.dist_dir, ignore_errors=True)
            p.dist_dir = None

    def kill_all(self) -> None:
        for stage in STAGES:
            self.kill(stage)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for p in self.stages.values():
            for proc in p.procs:
                proc.join(max(0.0, deadline - time.monotonic()))

    def pids(self) -> dict[str, list[int]]:
        return {s.value: [p.pid for p in sp.procs if p.pid is not None] for s, sp in self.stages.items()}

    def all_alive(self) -> bool:
        return all(p.alive for p in self.stages.values())

    def _spawn(self, stage: Stage) -> None:
        p = self.stages[stage]
        ctx = mp.get_context("spawn")
        # Idle OpenMP threads that spin would steal the cores other stages' processes are using.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if len(p.specs) > 1:
            p.dist_dir = tempfile.mkdtemp(prefix=f"worldrtc-{stage.value}-")
        p.procs, p.conns = [], []
        for spec in p.specs:
            if p.dist_dir:
                spec = spec.with_rendezvous(f"file://{p.dist_dir}/rendezvous")
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(spec, child), name=f"worldrtc-{spec.name}", daemon=True)
            proc.start()
            child.close()
            p.procs.append(proc)
            p.conns.append(parent)

    def _await_ready(self, stage: Stage) -> None:
        p = self.stages[stage]
        deadline = time.monotonic() + self.start_timeout_s
        for rank, conn in enumerate(p.conns):
            while not conn.poll(READY_POLL_S):
                if not p.procs[rank].is_alive():
                    raise EngineError(f"{stage.value} worker rank {rank} exited during start-up")
                if time.monotonic() > deadline:
                    raise EngineError(f"{stage.value} worker rank {rank} not ready after {self.start_timeout_s:.0f} s")
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                raise EngineError(f"{stage.value} worker rank {rank} exited during start-up") from None
            if isinstance(msg, StageFailed):
                raise EngineError(msg.error)
            assert isinstance(msg, WorkerReady), msg
        p.alive = True


def reap_children(timeout_s: float = REAP_GRACE_S) -> list[int]:
    """Before the server process exits: every process it started is gone and reaped, so that its
    exit means everything is gone (a service manager, or `wait`, takes it so). Stage workers the
    engine has stopped are gone by now; any left are killed and their channel files unlinked.
    multiprocessing's spawn start method also starts a resource tracker beside them, which exits
    only once every holder of its pipe has: after this process, unless it is stopped here. Returns
    the pids of the stage workers that had to be killed."""
    left = mp.active_children()
    for child in left:
        child.kill()
    for child in left:
        child.join(timeout_s)
        if child.pid is not None:
            remove_segments(child.pid)
    _stop_resource_tracker(timeout_s)
    return [child.pid for child in left if child.pid is not None]


def _stop_resource_tracker(timeout_s: float) -> None:
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker  # the process-wide one spawn started (private API)
    pid = tracker._pid
    if pid is None:
        return
    # Closing its pipe ends it once no child holds the pipe; `_stop` then reaps it.
    stopper = threading.Thread(target=tracker._stop, name="resource-tracker-stop", daemon=True)
    stopper.start()
    stopper.join(timeout_s)
    if stopper.is_alive():  # a child we did not start holds its pipe
        os.kill(pid, signal.SIGKILL)
        stopper.join(timeout_s)
