"""Training and evaluation clips from the procedural world: start poses, control paths, frames.

Held-out starts: the grid's cells are split once by a fixed rule, `eval` starts only in held-out
cells and `train` starts never do (paths may still walk through them, as a person would). Control
paths come from per-split seeds, so an evaluation path is never a training path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from workers.controls import ChunkControl
from workers.models.camera import CameraMotion, CameraState, Intrinsics
from workers.models.presets import ModelPreset
from workers.world import EMBEDDED_WORLD_SEED, World, WorldEvent, random_controls, random_start, render_path

WORLD_SEED = EMBEDDED_WORLD_SEED

Split = Literal["train", "eval"]
_SPLIT_SEED_OFFSET = {"train": 0, "eval": 1_000_003}


def heldout_cell(row: int, col: int) -> bool:
    """Every tenth cell, in a pattern that is spread over the whole grid."""
    return (row * 7 + col * 3) % 10 == 0


@dataclass(frozen=True)
class ClipSpec:
    height_px: int
    width_px: int
    chunk_latent_frames: int
    motion: CameraMotion

    @staticmethod
    def for_preset(preset: ModelPreset) -> ClipSpec:
        return ClipSpec(
            height_px=preset.height_px,
            width_px=preset.width_px,
            chunk_latent_frames=preset.chunk_latent_frames,
            motion=CameraMotion(preset.move_step_per_frame, preset.turn_step_deg_per_frame),
        )

    @property
    def intrinsics(self) -> Intrinsics:
        return Intrinsics.default(self.width_px, self.height_px)


@dataclass(frozen=True)
class Clip:
    start: CameraState
    controls: tuple[ChunkControl, ...]
    frames: np.ndarray  # [T, H, W, 3] uint8, T = 4C−3 + 4C·(chunks − 1)


def split_rng(seed: int, split: Split, index: int) -> np.random.Generator:
    """The generator for item `index` of a split: independent of every other item and split."""
    return np.random.default_rng([seed + _SPLIT_SEED_OFFSET[split], index])


def sample_start(rng: np.random.Generator, world: World, split: Split) -> CameraState:
    for _ in range(1000):
        start = random_start(rng, world)
        row, col = world.map.cell_of(start.position[0], start.position[2])
        if heldout_cell(row, col) == (split == "eval"):
            return start
    raise ValueError(f"no {split} start cell found")


def sample_controls(
    rng: np.random.Generator, world: World, spec: ClipSpec, start: CameraState, num_chunks: int
) -> tuple[ChunkControl, ...]:
    controls = random_controls(
        rng, num_chunks, world=world, chunk_latent_frames=spec.chunk_latent_frames, motion=spec.motion, start=start
    )
    return tuple(controls)


def render_clip(
    world: World,
    spec: ClipSpec,
    start: CameraState,
    controls: tuple[ChunkControl, ...],
    events: tuple[WorldEvent, ...] | None = None,
) -> Clip:
    """`events`: one per chunk (default: day throughout; see `render_path`)."""
    frames, _ = render_path(
        world,
        list(controls),
        spec.chunk_latent_frames,
        spec.height_px,
        spec.width_px,
        spec.intrinsics,
        spec.motion,
        start=start,
        events=events,
    )
    return Clip(start=start, controls=controls, frames=frames)


def sample_clip(world: World, spec: ClipSpec, rng: np.random.Generator, split: Split, num_chunks: int) -> Clip:
    start = sample_start(rng, world, split)
    return render_clip(world, spec, start, sample_controls(rng, world, spec, start, num_chunks))


def frames_to_model(frames: np.ndarray) -> torch.Tensor:
    """[T, H, W, 3] uint8 (or [B, T, H, W, 3]) -> [B, 3, T, H, W] float32 in [-1, 1]."""
    x = torch.from_numpy(frames if frames.ndim == 5 else frames[None]).float()
    return x.permute(0, 4, 1, 2, 3).div_(127.5).sub_(1.0)
