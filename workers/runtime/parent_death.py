"""Child processes exit when the process that started them goes away, however it went.

A worker that outlives its parent holds CPU, memory and shared memory that nobody will release, so
the stage workers and the training's encoder pool call `die_with_parent` first.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

PARENT_POLL_S = 0.5


def die_with_parent(parent_pid: int) -> None:
    """Exit when `parent_pid` is no longer this process's parent (SIGKILL of the parent included)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the polling thread below still covers it

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(3)
            time.sleep(PARENT_POLL_S)

    if os.getppid() != parent_pid:  # the parent died before this call: the signal will never come
        os._exit(3)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
