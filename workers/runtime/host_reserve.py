"""Host memory kept touched and ready for a CPU stage's next snapshot.

A snapshot is taken at a chunk boundary, in the command loop: the next chunk waits for it. On a GPU
that is a device copy. On a CPU it is a copy into host memory, and a fresh allocation of a large
state costs several times the copy itself in page faults (512 MiB: about 0.55 s against 0.11 s on
two cores), more when the kernel must first evict page cache (a stream stalled 0.75 s that way).
So a CPU stage keeps one buffer as large as the largest session state it has seen, with its pages
already touched, and a capture copies into it; a thread then touches the next one, off the command
loop. The cost is that much resident memory per CPU stage worker (a few MiB for the embedded
world's DiT), from the moment a session opens.
"""

from __future__ import annotations

import threading

import torch


class HostReserve:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: torch.Tensor | None = None  # touched, of `_want` bytes (or being made)
        self._want = 0
        self._filling = False

    def expect(self, nbytes: int) -> None:
        """A capture of up to `nbytes` may come: have a buffer that large ready (made on a thread)."""
        with self._lock:
            if nbytes <= self._want:
                return
            self._want = nbytes
        self._refill()

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least `nbytes`: the ready one if it is large enough and made, else a
        fresh one; either way the next one is made on a thread."""
        with self._lock:
            self._want = max(self._want, nbytes)
            ready = self._ready if self._ready is not None and self._ready.numel() >= nbytes else None
            if ready is not None:
                self._ready = None
        self._refill()
        return ready if ready is not None else torch.empty(nbytes, dtype=torch.uint8)

    def _refill(self) -> None:
        with self._lock:
            if self._filling or (self._ready is not None and self._ready.numel() >= self._want):
                return
            self._filling, self._ready = True, None  # a smaller one goes: the next capture may be larger
        threading.Thread(target=self._fill, name="host-reserve", daemon=True).start()

    def _fill(self) -> None:
        while True:
            with self._lock:
                want = self._want
            buffer = torch.empty(want, dtype=torch.uint8)
            buffer.fill_(0)  # touches every page (the op releases the GIL)
            with self._lock:
                if want >= self._want:  # else a larger capture was announced meanwhile
                    self._ready, self._filling = buffer, False
                    return
