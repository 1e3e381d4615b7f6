"""The determinism contract, and the one tolerance for where it does not promise bits.

Contract: the same preset, seed, control trace, placement and torch intra-op thread count give the
same frames, bit for bit, on any CPU, whichever engine (in-process serial, or the multi-process
pipeline under either schedule) runs them.

The thread count is part of the contract because oneDNN and MKL choose their reduction order by the
number of threads on some CPUs (seen on Intel Xeons with AVX-512/AMX: 1 and 2 threads differ by one
uint8 step on a few pixels; on AMD EPYC the same runs are bit-exact). So every engine that claims
equality runs its model code at a stated thread count: CPU stage workers at the placement's
`cpu_threads_per_worker`, the in-process engine at `DEFAULT_CPU_THREADS` (the `cpu` placement's
count) unless told otherwise. Benchmarks record the count next to the frame hash.

Where bits may legitimately differ (other thread counts, height-sharded decode, which convolves
bands instead of whole frames, GPU kernels) frames are compared under `FRAME_TOLERANCE`, stated here
once: at most one uint8 step on any pixel, on under 1 % of pixel values.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

DEFAULT_CPU_THREADS = 1  # the `cpu` placement's cpu_threads_per_worker; the in-process engine's default


@contextmanager
def intra_op_threads(num_threads: int) -> Iterator[None]:
    """Run the body with torch on `num_threads` intra-op threads, then restore the caller's count."""
    if num_threads < 1:
        raise ValueError(f"intra-op thread count must be at least 1, got {num_threads}")
    before = torch.get_num_threads()
    if before != num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@dataclass(frozen=True)
class FrameTolerance:
    max_step: int  # largest allowed |a − b| on any uint8 value
    max_fraction: float  # largest allowed fraction of values that differ at all


FRAME_TOLERANCE = FrameTolerance(max_step=1, max_fraction=0.01)


@dataclass(frozen=True)
class FrameDifference:
    max_step: int
    fraction: float  # of uint8 values that differ

    @property
    def exact(self) -> bool:
        return self.max_step == 0

    def within(self, tolerance: FrameTolerance = FRAME_TOLERANCE) -> bool:
        return self.max_step <= tolerance.max_step and self.fraction <= tolerance.max_fraction

    def __str__(self) -> str:
        return f"max step {self.max_step}, {self.fraction:.4%} of values differ"


def frame_difference(a: np.ndarray, b: np.ndarray) -> FrameDifference:
    """How far apart two uint8 frame arrays of the same shape are."""
    if a.shape != b.shape or a.dtype != np.uint8 or b.dtype != np.uint8:
        raise ValueError(f"need two uint8 arrays of one shape, got {a.dtype}{a.shape} and {b.dtype}{b.shape}")
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return FrameDifference(int(diff.max(initial=0)), float((diff > 0).mean()) if diff.size else 0.0)
