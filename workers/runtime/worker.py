"""Every stage process starts the same way: die with the parent, set the device, join the stage's
process group, build its part of the model, report ready, then serve typed commands until told
to stop. A failed command is reported upward naming the stage; nobody retries silently.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

import torch

from workers.models.kernels import apply_to_process
from workers.parallel.group import destroy_stage_group, init_stage_group
from workers.runtime.channel import remove_segments
from workers.runtime.handlers import build_handler
from workers.runtime.messages import Reply, Shutdown, StageFailed, WorkerReady, raised
from workers.runtime.parent_death import die_with_parent
from workers.runtime.spec import WorkerSpec


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Process entry point (spawn start method)."""
    # The server decides when workers stop; if it dies, nobody else will unlink this worker's slot files.
    die_with_parent(spec.parent_pid, on_exit=lambda: remove_segments(os.getpid()))

    handler = None
    group = None
    try:
        t0 = time.perf_counter()
        device = torch.device(spec.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(spec.cpu_threads)
        apply_to_process(spec.kernels, device)
        group = init_stage_group(spec.dist_init or "", spec.rank, spec.world_size, device)
        handler = build_handler(spec, group)
        conn.send(WorkerReady(spec.stage, spec.rank, os.getpid(), spec.device, time.perf_counter() - t0))
    except BaseException as exc:  # startup failure is always fatal
        conn.send(StageFailed(spec.stage, spec.rank, None, f"{spec.name} failed to start: {exc!r}", fatal=True))
        traceback.print_exc(file=sys.stderr)
        os._exit(1)

    send_lock = threading.Lock()  # the command loop and a save's writer thread both reply

    def send(reply: Reply) -> None:
        with send_lock, contextlib.suppress(OSError):  # a scheduler that is gone hears nothing
            conn.send(reply)

    handler.reply_later = send
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
                for reply in handler.handle(msg):
                    send(reply)
            except Exception as exc:
                # A multi-rank stage may be mid-collective on its peers: it cannot continue safely.
                fatal = spec.world_size > 1
                handler.drop_session(session_id)
                send(StageFailed(spec.stage, spec.rank, session_id, raised(spec.stage, spec.rank, exc), fatal=fatal))
                if fatal:
                    traceback.print_exc(file=sys.stderr)
                    os._exit(1)
    finally:
        handler.close()
        if group is not None:
            destroy_stage_group(group)
    # Everything this process shares is released above; tearing down the interpreter (torch's
    # modules) would only make the server's shutdown wait a second longer.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
