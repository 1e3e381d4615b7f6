"""Every stage process starts the same way: die with the parent, set the device, join the stage's
process group, build its part of the model, report ready, then serve typed commands until told
to stop. A failed command is reported upward naming the stage; nobody retries silently.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from workers.runtime.messages import Shutdown, Stage, StageFailed, WorkerReady
from workers.runtime.parent_death import die_with_parent
from workers.runtime.synthetic import SyntheticModel


@dataclass(frozen=True)
class FaultSpec:
    """Injected faults for tests of the runtime: random delays before each chunk, and/or raising at a chunk."""

    chunk_index: int | None = None  # raise the first time this chunk is reached
    message: str = "injected fault"
    max_delay_s: float = 0.0  # sleep uniformly in [0, max_delay_s) before each chunk
    seed: int = 0


@dataclass(frozen=True)
class WorkerSpec:
    stage: Stage
    rank: int
    world_size: int
    device: str
    preset: str
    checkpoint_dir: str | None
    weights_seed: int
    dist_init: str | None  # rendezvous for multi-rank stages, e.g. "file:///tmp/…"
    parent_pid: int
    cpu_threads: int = 1
    output_shards: int = 1  # consumer ranks of this stage's output (decode ranks for the DiT's latents)
    frame_ring_slots: int = 4  # decode: chunks of uint8 frames the server may hold at once
    synthetic: SyntheticModel | None = None  # hold for fixed times instead of computing
    fault: FaultSpec | None = None

    @property
    def name(self) -> str:
        return f"{self.stage.value}[{self.rank}/{self.world_size}]"


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Process entry point (spawn start method)."""
    die_with_parent(spec.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    from workers.parallel.group import destroy_stage_group, init_stage_group
    from workers.runtime.servers import build_server

    server = None
    group = None
    try:
        t0 = time.perf_counter()
        device = torch.device(spec.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(spec.cpu_threads)
        group = init_stage_group(spec.dist_init or "", spec.rank, spec.world_size, device)
        server = build_server(spec, group)
        conn.send(WorkerReady(spec.stage, spec.rank, os.getpid(), spec.device, time.perf_counter() - t0))
    except BaseException as exc:  # startup failure is always fatal
        conn.send(StageFailed(spec.stage, spec.rank, None, f"{spec.name} failed to start: {exc!r}", fatal=True))
        traceback.print_exc(file=sys.stderr)
        os._exit(1)

    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                break  # the scheduler is gone
            if isinstance(msg, Shutdown):
                break
            session_id = getattr(msg, "session_id", None)
            try:
                for reply in server.handle(msg):
                    conn.send(reply)
            except Exception as exc:
                # A multi-rank stage may be mid-collective on its peers: it cannot continue safely.
                fatal = spec.world_size > 1
                server.drop_session(session_id)
                error = f"{spec.stage.value} stage (rank {spec.rank}): {type(exc).__name__}: {exc}"
                conn.send(StageFailed(spec.stage, spec.rank, session_id, error, fatal=fatal))
                if fatal:
                    traceback.print_exc(file=sys.stderr)
                    os._exit(1)
    finally:
        server.close()
        if group is not None:
            destroy_stage_group(group)
