"""A procedural 3D place rendered in numpy: training data and a CPU stand-in for a world model.

Conventions, shared with workers/models/camera.py: OpenCV camera-to-world poses (x right, y down,
z forward); the world frame is the start camera's frame (eye at the origin, floor at
y = +eye_height_m); yaw positive turns right, pitch positive looks up, moves are horizontal along
the heading. See map.py (layout and units), render.py (ray casting) and paths.py (chunk geometry,
walls and random walks).
"""

from workers.world.events import EVENT_PROMPTS, WorldEvent, apply_event, event_of_prompt
from workers.world.map import MapConfig, WorldMap, generate_map
from workers.world.paths import (
    PathPoses,
    free_distance,
    random_controls,
    random_start,
    recut_control,
    render_path,
    simulate_path,
)
from workers.world.render import RenderLayers, render_layers, render_view
from workers.world.world import EMBEDDED_WORLD_SEED, World

__all__ = [
    "EMBEDDED_WORLD_SEED",
    "EVENT_PROMPTS",
    "MapConfig",
    "PathPoses",
    "RenderLayers",
    "World",
    "WorldEvent",
    "WorldMap",
    "apply_event",
    "event_of_prompt",
    "free_distance",
    "generate_map",
    "random_controls",
    "random_start",
    "recut_control",
    "render_layers",
    "render_path",
    "render_view",
    "simulate_path",
]
