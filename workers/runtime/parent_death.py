"""Child processes exit when the process that started them goes away, however it went.

A worker that outlives its parent holds CPU, memory and shared memory that nobody will release, so
the stage workers and the training's encoder pool call `die_with_parent` first. A dying child runs
`on_exit` first (a stage worker unlinks its shared-memory slot files there: nobody else will).

The kernel tells us (PR_SET_PDEATHSIG, as SIGUSR2 so that a handler can run) and a thread polls the
parent pid as well (not Linux, or a parent that died before the call). SIGTERM and SIGINT are the
parent's to act on: a service manager that signals the whole process group must not take the
workers away from a server that is draining its sessions.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable

PARENT_POLL_S = 0.5
PARENT_DEATH_SIGNAL = signal.SIGUSR2
EXIT_CODE = 3


def die_with_parent(parent_pid: int, on_exit: Callable[[], object] | None = None) -> None:
    """Exit when `parent_pid` is no longer this process's parent (SIGKILL of the parent included)."""
    lock = threading.Lock()

    def leave(*_: object) -> None:
        if not lock.acquire(blocking=False):
            return  # the other path is already leaving
        try:
            if on_exit is not None:
                on_exit()
        finally:
            os._exit(EXIT_CODE)

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(PARENT_DEATH_SIGNAL, leave)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, PARENT_DEATH_SIGNAL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the polling thread below still covers it

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        leave()

    if os.getppid() != parent_pid:  # the parent died before this call: the signal will never come
        leave()
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
