"""Named start views of the embedded world, for the browser's built-in scenes and the replay default.

    python -m workers.world.scenes --out server/scenes     # re-render the PNGs (deterministic)

`main-street` is the world's start pose (looking down its longest free run); the others are the
best of a fixed, seeded set of candidate poses by a simple criterion (most distant landmark
towers in view; longest open view), so they are the same on every machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from workers.models.camera import CameraState, Intrinsics
from workers.world.paths import free_distance, random_start
from workers.world.render import TOWER_HIT
from workers.world.world import EMBEDDED_WORLD_SEED, World

_CANDIDATES = 200
_CANDIDATE_SEED = 11


def scene_poses(world: World, height_px: int, width_px: int) -> dict[str, CameraState]:
    intr = Intrinsics.default(width_px, height_px)
    rng = np.random.default_rng(_CANDIDATE_SEED)
    candidates = [random_start(rng, world) for _ in range(_CANDIDATES)]

    def open_view(s: CameraState) -> float:
        return free_distance(world, s.position[0], s.position[2], s.yaw_deg, max_m=30.0)

    def towers_in_view(s: CameraState) -> tuple[int, float]:
        layers = world.render_layers(s.c2w().numpy(), intr, height_px, width_px)
        far = (layers.kind == TOWER_HIT) & (layers.depth_m > 4.0)  # landmarks in the distance, not a wall of one
        return len(np.unique(layers.tower_id[far])), open_view(s)

    return {
        "main-street": world.start_state(),
        "towers": max(candidates, key=towers_in_view),
        "long-view": max(candidates, key=open_view),
    }


def render_scenes(world: World, height_px: int, width_px: int) -> dict[str, np.ndarray]:
    intr = Intrinsics.default(width_px, height_px)
    return {
        name: world.render(state.c2w().numpy(), intr, height_px, width_px)
        for name, state in scene_poses(world, height_px, width_px).items()
    }


def main(argv: list[str] | None = None) -> None:
    from workers.models.presets import DEFAULT_PRESET, get_preset

    p = argparse.ArgumentParser(prog="python -m workers.world.scenes", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for <name>.png")
    args = p.parse_args(argv)
    preset = get_preset(DEFAULT_PRESET)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rgb in render_scenes(World.generate(EMBEDDED_WORLD_SEED), preset.height_px, preset.width_px).items():
        Image.fromarray(rgb).save(args.out / f"{name}.png")
        print(f"wrote {args.out / name}.png")


if __name__ == "__main__":
    main()
