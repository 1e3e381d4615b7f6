"""One-line progress reports for long loops: step, rate, running metrics and ETA."""

from __future__ import annotations

import sys
import time
from collections import deque


class Progress:
    def __init__(self, name: str, total: int, start: int = 0, every: int = 10, window: int = 50) -> None:
        self.name = name
        self.total = total
        self.every = every
        self.step = start
        self._times: deque[tuple[int, float]] = deque(maxlen=window)
        self._times.append((start, time.perf_counter()))
        self._metrics: dict[str, deque[float]] = {}
        self.started = time.perf_counter()

    def update(self, step: int, **metrics: float) -> None:
        self.step = step
        self._times.append((step, time.perf_counter()))
        for key, value in metrics.items():
            self._metrics.setdefault(key, deque(maxlen=self.every * 5)).append(float(value))
        if step % self.every == 0 or step == self.total:
            self.print()

    @property
    def rate_per_s(self) -> float:
        (s0, t0), (s1, t1) = self._times[0], self._times[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def print(self) -> None:
        rate = self.rate_per_s
        eta = (self.total - self.step) / rate if rate > 0 else float("nan")
        shown = " ".join(f"{k} {sum(v) / len(v):.4g}" for k, v in self._metrics.items() if v)
        print(
            f"[{self.name}] {self.step}/{self.total} {shown} | {rate:.2f} it/s, ETA {_clock(eta)}",
            file=sys.stderr,
            flush=True,
        )


def _clock(seconds: float) -> str:
    if seconds != seconds:  # NaN: no rate yet
        return "--:--"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
