"""`World`: a generated place plus its renderer and collision test, the object callers hold."""

from __future__ import annotations

import numpy as np

from workers.models.camera import CameraState, Intrinsics
from workers.world.map import MapConfig, WorldMap, generate_map
from workers.world.render import RenderLayers, render_layers

EMBEDDED_WORLD_SEED = 7  # the place the embedded `gridworld` preset was trained on


class World:
    """A procedural grid place (see map.py for frames and units), deterministic from its seed."""

    def __init__(self, world_map: WorldMap) -> None:
        self.map = world_map

    @staticmethod
    def generate(seed: int, config: MapConfig | None = None) -> World:
        return World(generate_map(seed, config))

    @property
    def seed(self) -> int:
        return self.map.seed

    def start_state(self) -> CameraState:
        """The start camera: the world frame's origin and axes (so CameraState() itself)."""
        return CameraState()

    def start_pose(self) -> np.ndarray:
        """[4, 4] float64 camera-to-world of the start camera (identity: the world frame is its frame)."""
        return self.start_state().c2w().numpy()

    def is_free(self, x: float, z: float, radius_m: float = 0.0) -> bool:
        """Whether a walker of half-size radius_m can stand at world (x, z)."""
        return self.map.is_free(x, z, radius_m)

    def render(self, c2w: np.ndarray, intrinsics: Intrinsics, height_px: int, width_px: int) -> np.ndarray:
        """[H, W, 3] uint8 view from an OpenCV camera-to-world pose (numpy or CPU torch, 4×4)."""
        return render_layers(self.map, c2w, intrinsics, height_px, width_px).rgb

    def render_layers(self, c2w: np.ndarray, intrinsics: Intrinsics, height_px: int, width_px: int) -> RenderLayers:
        """Colour plus depth, hit kind and tower id per pixel."""
        return render_layers(self.map, c2w, intrinsics, height_px, width_px)
