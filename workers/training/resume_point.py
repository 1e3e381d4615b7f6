"""Resume points: the part of a training run that must outlive the machine it ran on, small enough
to commit.

A run's working state (`<out>/<phase>.ckpt.pt`: float32 weights, AdamW moments, step, history) lives
in its work directory, which a fresh machine does not have. Each time a phase writes that checkpoint
it also writes this compact copy into the repository, under `workers/training/resume/<preset>/`, and
a run started on a fresh clone picks it up where the committed copy left off:

  <phase>.weights.safetensors   the model's weights in float16
  <phase>.moments.safetensors   AdamW's first and second moments in bfloat16, which keeps float32's
                                range (float16 flushes second moments below 6e-8, and a zero second
                                moment turns the next update into a jump of lr/eps)
  <phase>.state.json            the step, which is the whole data cursor and RNG state (every batch,
                                clip and noise draw is drawn from (seed, step)), each parameter's
                                AdamW step count, the wall time and the history of the runs so far
  vae.safetensors, vae.json     the finished VAE (float32: it is the product, and small), which the
                                later phases need; the VAE's in-progress files go when it finishes

What does not carry over is rebuilt: the DiT's data sets are re-encoded from the committed VAE (the
same seeds give the same clips). Resuming from a resume point is a warm restart, not a bit-exact
continuation: weights come back rounded to float16 (relative error at most 2^-11) and moments to
bfloat16 (2^-8), and the first step after it behaves like any other step of the schedule. A point
is rewritten in place, so a commit of it replaces the superseded state; for gridworld-4x the largest
one (the DiT's) is about 18 MB.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

RESUME_ROOT = Path(__file__).resolve().parent / "resume"
WEIGHTS_DTYPE = torch.float16
MOMENTS_DTYPE = torch.bfloat16
FINISHED_VAE = ("vae.safetensors", "vae.json")  # what the vae phase leaves for the later ones


def _phase_files(phase: str) -> tuple[str, str, str]:
    return f"{phase}.weights.safetensors", f"{phase}.moments.safetensors", f"{phase}.state.json"


def _write_atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


@dataclass(frozen=True)
class ResumePoint:
    """The committed state of one preset's training (see the module docstring for the layout)."""

    directory: Path

    @classmethod
    def for_preset(cls, preset_name: str) -> ResumePoint:
        return cls(RESUME_ROOT / preset_name)

    def step(self, phase: str) -> int | None:
        """The step a phase's resume point holds; None when there is none."""
        meta = self.directory / _phase_files(phase)[2]
        return int(json.loads(meta.read_text())["step"]) if meta.is_file() else None

    def save(self, phase: str, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Write a phase's compact state from a checkpoint dict (`checkpoint.save`'s fields);
        returns the bytes the point now holds."""
        self.directory.mkdir(parents=True, exist_ok=True)
        weights_file, moments_file, meta_file = (self.directory / f for f in _phase_files(phase))
        weights = {k: v.detach().to("cpu", WEIGHTS_DTYPE).contiguous() for k, v in model.state_dict().items()}
        moments: dict[str, torch.Tensor] = {}
        adam_steps: dict[str, int] = {}
        for name, param in _named_optimizer_params(model, optimizer):
            slot = optimizer.state.get(param)
            if not slot:  # never stepped (frozen so far): a fresh slot on resume is exact
                continue
            moments[f"{name}.exp_avg"] = slot["exp_avg"].detach().to("cpu", MOMENTS_DTYPE).contiguous()
            moments[f"{name}.exp_avg_sq"] = slot["exp_avg_sq"].detach().to("cpu", MOMENTS_DTYPE).contiguous()
            adam_steps[name] = int(slot["step"])
        extra = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
        meta = {
            **extra,
            "adam_steps": adam_steps,
            "weights_dtype": str(WEIGHTS_DTYPE),
            "moments_dtype": str(MOMENTS_DTYPE),
        }
        _write_atomic(weights_file, lambda p: save_file(weights, str(p)))
        _write_atomic(moments_file, lambda p: save_file(moments, str(p)))
        _write_atomic(meta_file, lambda p: p.write_text(json.dumps(meta, indent=1) + "\n"))
        return self.bytes()

    def load(self, phase: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """Load a phase's point into `model` and `optimizer` (both built as the run builds them);
        returns its metadata as `checkpoint.resume` returns a checkpoint's, or None without one."""
        weights_file, moments_file, meta_file = (self.directory / f for f in _phase_files(phase))
        if not meta_file.is_file():
            return None
        meta = json.loads(meta_file.read_text())
        device = next(model.parameters()).device
        weights = load_file(str(weights_file))
        model.load_state_dict({k: v.to(device, torch.float32) for k, v in weights.items()}, strict=True)
        moments = load_file(str(moments_file))
        adam_steps: dict[str, int] = meta["adam_steps"]
        slots: dict[int, dict[str, torch.Tensor]] = {}
        for index, (name, param) in enumerate(_named_optimizer_params(model, optimizer)):
            if name not in adam_steps:
                continue
            slots[index] = {
                "step": torch.tensor(float(adam_steps[name])),
                "exp_avg": moments[f"{name}.exp_avg"].to(param.device, param.dtype),
                "exp_avg_sq": moments[f"{name}.exp_avg_sq"].to(param.device, param.dtype),
            }
        fresh = optimizer.state_dict()
        optimizer.load_state_dict({"state": slots, "param_groups": fresh["param_groups"]})
        return meta

    def finish_vae(self, out: Path) -> None:
        """Keep the finished VAE (`<out>/vae.safetensors`, `vae.json`) and drop its in-progress state."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in FINISHED_VAE:
            shutil.copyfile(out / name, self.directory / name)
        self.drop("vae")

    def restore_finished_vae(self, out: Path) -> bool:
        """Copy a committed finished VAE into the work directory; False when there is none."""
        if not all((self.directory / name).is_file() for name in FINISHED_VAE):
            return False
        out.mkdir(parents=True, exist_ok=True)
        for name in FINISHED_VAE:
            shutil.copyfile(self.directory / name, out / name)
        return True

    def drop(self, phase: str) -> None:
        for name in _phase_files(phase):
            (self.directory / name).unlink(missing_ok=True)

    def bytes(self) -> int:
        return sum(f.stat().st_size for f in self.directory.iterdir() if f.is_file()) if self.directory.is_dir() else 0


def _named_optimizer_params(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, nn.Parameter]]:
    """The optimizer's parameters in its own order (the order its state_dict indexes), with the
    model's names for them, so moments are stored by name and survive a change of grouping."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [(names[id(p)], p) for group in optimizer.param_groups for p in group["params"]]
