"""Worker supervision: spawn a stage's ranks, wait until they are warm, notice deaths, kill, restart.

Each stage is one process per rank (spawn start method), joined to its rank-0 peers by a
torch.distributed file rendezvous when it has several. The supervisor owns the processes and their
pipes; it makes no scheduling decision.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from workers.runtime.channel import remove_segments
from workers.runtime.messages import STAGES, Stage, StageFailed, WorkerReady
from workers.runtime.spec import WorkerSpec
from workers.runtime.worker import worker_main

READY_POLL_S = 0.1


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

    def restart_dead(self) -> list[Stage]:
        """Start again every stage that is down; the stages restarted."""
        dead = [s for s, p in self.stages.items() if not p.alive]
        if dead:
            self.restarts += len(dead)
            self.start(tuple(dead))
        return dead

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
        p.procs, p.conns, p.alive = [], [], False
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
            msg = conn.recv()
            if isinstance(msg, StageFailed):
                raise EngineError(msg.error)
            assert isinstance(msg, WorkerReady), msg
        p.alive = True
