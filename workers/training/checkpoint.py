"""Training checkpoints: model, optimiser and step in one file, written atomically, resumed on start.

A checkpoint also carries its history: one entry per run that trained it (the steps it covered, its
config, its wall time), so a model card says exactly how resumed weights were made, even when a
later run changed the schedule or the recipe.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn


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


def history(state: dict[str, Any] | None, start_step: int, step: int, config: Any, wall_s: float) -> list[dict]:
    """The resumed checkpoint's history plus this run (steps start_step → step, `config` a dataclass)."""
    earlier = list(state.get("history", [])) if state else []
    return [*earlier, {"steps": [start_step, step], "config": asdict(config), "wall_s": round(wall_s, 1)}]
