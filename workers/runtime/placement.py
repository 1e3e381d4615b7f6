"""Placement as data: which devices each stage's ranks run on.

A placement lists one device per rank for the encode, DiT and decode stages. Multi-rank DiT runs
Ulysses sequence parallelism (heads and tokens per frame split across ranks); multi-rank decode
splits latent rows into bands. Invalid placements fail at start with a message that says what to
change. Custom placements are JSON: {"name": …, "encode": ["cuda:0"], "dit": […], "decode": […]}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workers.determinism import DEFAULT_CPU_THREADS
from workers.families.registry import family_for
from workers.models.presets import ModelPreset


class PlacementError(ValueError):
    """A placement that cannot run this preset on this machine."""


@dataclass(frozen=True)
class Placement:
    name: str
    encode: tuple[str, ...]
    dit: tuple[str, ...]
    decode: tuple[str, ...]
    # torch intra-op threads in each CPU worker process; part of the determinism contract
    cpu_threads_per_worker: int = DEFAULT_CPU_THREADS

    def __post_init__(self) -> None:
        for stage in ("encode", "dit", "decode"):
            devices = getattr(self, stage)
            if not devices:
                raise PlacementError(f"placement {self.name!r}: stage {stage!r} needs at least one device")
            for d in devices:
                try:
                    dev = torch.device(d)
                except RuntimeError:
                    raise PlacementError(f"placement {self.name!r}: {d!r} is not a device name") from None
                if dev.type not in ("cpu", "cuda"):
                    raise PlacementError(f"placement {self.name!r}: only cpu and cuda devices are supported, got {d!r}")
            types = {torch.device(d).type for d in devices}
            if len(types) > 1:
                raise PlacementError(f"placement {self.name!r}: stage {stage!r} mixes cpu and cuda ranks")
        if len(self.encode) != 1:
            raise PlacementError(f"placement {self.name!r}: the encode stage runs on exactly one device")
        if self.cpu_threads_per_worker < 1:
            raise PlacementError("cpu_threads_per_worker must be at least 1")

    def stage_devices(self, stage: str) -> tuple[torch.device, ...]:
        return tuple(torch.device(d) for d in getattr(self, stage))

    def stage_record(self) -> dict[str, list[str]]:
        """Each stage's devices by name, as a recording keeps them (and a replay compares them)."""
        return {s: [str(d) for d in self.stage_devices(s)] for s in ("encode", "dit", "decode")}

    def validate_for(self, preset: ModelPreset, cuda_device_count: int | None = None) -> None:
        """Raise PlacementError naming what to change if `preset` cannot run on this placement."""
        cfg = preset.dit
        sp = len(self.dit)
        most = family_for(preset).max_dit_ranks
        if most is not None and sp > most:
            raise PlacementError(
                f"placement {self.name!r}: {preset.name} runs its DiT on at most {most} rank(s), this placement "
                f"gives it {sp}; use one with a single DiT rank ('1gpu', or 'cpu')"
            )
        if cfg.num_heads % sp:
            raise PlacementError(
                f"placement {self.name!r}: {cfg.num_heads} attention heads are not divisible by the DiT's "
                f"{sp} Ulysses ranks; use a DiT rank count that divides {cfg.num_heads}"
            )
        tokens = preset.tokens_per_latent_frame
        if tokens % sp:
            raise PlacementError(
                f"placement {self.name!r}: {tokens} tokens per latent frame are not divisible by {sp} DiT ranks; "
                f"choose a rank count that divides {tokens} or another resolution"
            )
        rows = preset.latent_height
        if rows % len(self.decode):
            raise PlacementError(
                f"placement {self.name!r}: {rows} latent rows cannot be split into {len(self.decode)} decode bands; "
                f"use a decode rank count that divides {rows}"
            )
        count = torch.cuda.device_count() if cuda_device_count is None else cuda_device_count
        for stage in ("encode", "dit", "decode"):
            for dev in self.stage_devices(stage):
                if dev.type == "cuda" and (dev.index or 0) >= count:
                    raise PlacementError(
                        f"placement {self.name!r}: stage {stage!r} wants {dev} but this machine has {count} CUDA "
                        f"device(s); pick a placement that fits (e.g. 'cpu' without a GPU)"
                    )
            devices = self.stage_devices(stage)
            if devices[0].type == "cuda" and len(set(devices)) != len(devices):
                raise PlacementError(f"placement {self.name!r}: stage {stage!r} lists a CUDA device twice")

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Placement:
        try:
            return Placement(
                name=str(data.get("name", "custom")),
                encode=tuple(data["encode"]),
                dit=tuple(data["dit"]),
                decode=tuple(data["decode"]),
                cpu_threads_per_worker=int(data.get("cpu_threads_per_worker", DEFAULT_CPU_THREADS)),
            )
        except KeyError as exc:
            raise PlacementError(
                f"placement JSON needs 'encode', 'dit' and 'decode' device lists; missing {exc}"
            ) from None
        except TypeError as exc:
            raise PlacementError(f"placement JSON is malformed: {exc}") from None


def _gpus(*indices: int) -> tuple[str, ...]:
    return tuple(f"cuda:{i}" for i in indices)


PLACEMENTS: dict[str, Placement] = {
    p.name: p
    for p in (
        Placement("cpu", ("cpu",), ("cpu",), ("cpu",)),
        Placement("cpu-sp2", ("cpu",), ("cpu", "cpu"), ("cpu", "cpu")),
        Placement("1gpu", _gpus(0), _gpus(0), _gpus(0)),
        Placement("2gpu", _gpus(0), _gpus(0, 1), _gpus(1)),
        Placement("4gpu", _gpus(0), _gpus(0, 1, 2, 3), _gpus(0, 1, 2, 3)),
        Placement("7gpu-split", _gpus(0), _gpus(2, 3, 4, 5, 6), _gpus(1)),
    )
}


def get_placement(name_or_path: str) -> Placement:
    """A preset name, or a path to a JSON placement."""
    if name_or_path in PLACEMENTS:
        return PLACEMENTS[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".json" and path.is_file():
        try:
            return Placement.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as exc:
            raise PlacementError(f"{path}: not valid JSON ({exc})") from None
    raise PlacementError(f"unknown placement {name_or_path!r}; use one of {sorted(PLACEMENTS)} or a .json file")
