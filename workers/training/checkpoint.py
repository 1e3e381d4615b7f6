"""Training checkpoints: model, optimiser and step in one file, written atomically, resumed on start.

Each save also writes the run's resume point (`resume_point.py`), the compact copy that is committed
to the repository, and a run resumes from whichever of the two is further on. SIGINT or SIGTERM
(`stop_on_signals`) lets the current step finish, saves both, and stops the phase.

A checkpoint also carries its history: one entry per run that trained it (the steps it covered, its
config, its wall time), so a model card says exactly how resumed weights were made, even when a
later run changed the schedule or the recipe.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.nn as nn

from workers.training.resume_point import ResumePoint

_stop = threading.Event()


class Interrupted(Exception):
    """A phase stopped on request after saving its checkpoint (and resume point) at `step`."""

    def __init__(self, phase: str, step: int) -> None:
        super().__init__(f"{phase} stopped at step {step}")
        self.phase, self.step = phase, step


def stop_on_signals() -> None:
    """SIGINT and SIGTERM finish the current step, save, and raise `Interrupted` from the training
    loop; a second one stops at once."""

    def handle(signum: int, _frame: FrameType | None) -> None:
        if stop_requested():
            raise KeyboardInterrupt
        request_stop()
        print(f"[training] {signal.Signals(signum).name}: saving after this step", file=sys.stderr, flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)


def request_stop() -> None:
    """Ask the running phase to save after its current step and raise `Interrupted`."""
    _stop.set()


def clear_stop() -> None:
    _stop.clear()


def stop_requested() -> bool:
    return _stop.is_set()


def save(path: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, **extra: Any) -> None:
    """Write to a temporary file and rename, so an interrupted save never leaves a torn checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(), **extra}, tmp)
    os.replace(tmp, path)


def resume(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any] | None:
    """Load a checkpoint into `model` (and `optimizer`); None when there is none yet."""
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state


def resume_run(
    path: Path, phase: str, model: nn.Module, optimizer: torch.optim.Optimizer, keep: ResumePoint | None
) -> dict[str, Any] | None:
    """Resume from whichever is further on: the work directory's checkpoint or the committed resume
    point (a fresh clone has only the latter). Prints where it resumed from."""
    local = torch.load(path, map_location="cpu", weights_only=False) if path.is_file() else None
    committed = keep.step(phase) if keep is not None else None
    if keep is not None and committed is not None and (local is None or committed > local["step"]):
        state = keep.load(phase, model, optimizer)
        print(f"[{phase}] resumed at step {committed} from the resume point in {keep.directory}", flush=True)
        return state
    if local is None:
        return None
    model.load_state_dict(local["model"])
    optimizer.load_state_dict(local["optimizer"])
    print(f"[{phase}] resumed at step {local['step']} from {path}", flush=True)
    return local


def save_run(
    path: Path,
    phase: str,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    keep: ResumePoint | None,
    **extra: Any,
) -> None:
    """`save`, then the compact copy into the resume point (when the run keeps one); raises
    `Interrupted` once saved if a stop was requested."""
    save(path, step, model, optimizer, **extra)
    if keep is not None:
        keep.save(phase, {"step": step, **extra}, model, optimizer)
    if stop_requested():
        raise Interrupted(phase, step)


def history(state: dict[str, Any] | None, start_step: int, step: int, config: Any, wall_s: float) -> list[dict]:
    """The resumed checkpoint's history plus this run (steps start_step → step, `config` a dataclass)."""
    earlier = list(state.get("history", [])) if state else []
    return [*earlier, {"steps": [start_step, step], "config": asdict(config), "wall_s": round(wall_s, 1)}]
