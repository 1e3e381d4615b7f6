"""A worker's peak memory: host resident set and, on CUDA, the caching allocator's peaks.

Reported through `StageStats` so a benchmark's RUN.json holds one figure per worker, which the
memory plan (`python -m workers plan`) is checked against.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PeakMemory:
    host_rss_bytes: int  # the process's peak resident set (ru_maxrss)
    device_allocated_bytes: int | None = None  # CUDA: peak bytes in live tensors
    device_reserved_bytes: int | None = None  # CUDA: peak bytes the allocator held from the driver


def measure_peak_memory(device: torch.device) -> PeakMemory:
    host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    if device.type != "cuda":
        return PeakMemory(host)
    return PeakMemory(host, torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device))
