"""Small shared helpers for benchmark reports: percentiles, memory, environment."""

from __future__ import annotations

import os
import platform
import resource
import sys

import numpy as np
import torch


def summarize(values: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/max/mean of a sample (None fields for an empty sample)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None, "count": 0}
    arr = np.asarray(values, dtype=np.float64)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
        "max": float(arr.max()),
        "mean": float(arr.mean()),
        "count": len(values),
    }


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_model() -> str | None:
    """The CPU's model name (Linux), which decides whether thread counts change bits (see workers/determinism.py)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def environment(device: torch.device) -> dict[str, object]:
    uname = platform.uname()  # its system/release/machine fields only: `processor` would run `uname -p`
    env: dict[str, object] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": f"{uname.system}-{uname.release}",
        "machine": uname.machine,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env
