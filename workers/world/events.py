"""World events: night, snow, fog and dusk, drawn over a rendered view from its layers alone.

An event changes how the whole town looks from one frame to the next (palette, distance haze,
falling snow), not where anything is, so it is a function of a view's colour, depth and hit kind
(`RenderLayers`) and of the frame's index (snowflakes fall). The embedded world learns events from
walks whose prompt switches at a chunk boundary (`workers/training/latents.py`); the prompts that
name each event are listed here, the one the page's chips send first.

    layers ──► apply_event(layers, event, frame) ──► rgb
               day: the layers' own colour, unchanged
"""

from __future__ import annotations

import enum
import functools

import numpy as np

from workers.world.render import FLOOR, SKY, RenderLayers

_F = np.float32


class WorldEvent(enum.StrEnum):
    DAY = "day"
    NIGHT = "night"
    SNOW = "snow"
    FOG = "fog"
    DUSK = "dusk"


# Prompts that name each event in training; the first is the one a chip sends ("" brings the day back).
EVENT_PROMPTS: dict[WorldEvent, tuple[str, ...]] = {
    WorldEvent.DAY: ("", "day", "a sunny day", "the sun comes out", "daytime"),
    WorldEvent.NIGHT: ("night falls", "night", "it is night", "a dark night"),
    WorldEvent.SNOW: ("it starts to snow", "snow", "snowfall", "a snowy day"),
    WorldEvent.FOG: ("thick fog rolls in", "fog", "a foggy day", "mist"),
    WorldEvent.DUSK: ("dusk", "sunset", "the sun sets", "evening light"),
}

SNOWFLAKES = 90  # per 128×128 view; scaled with the view's area
_FLAKE_SEED = 11


def event_of_prompt(text: str) -> WorldEvent | None:
    """The event a prompt names, if it is one of the training prompts (case and spaces ignored)."""
    key = " ".join(text.lower().split())
    for event, prompts in EVENT_PROMPTS.items():
        if key in prompts:
            return event
    return None


def _sky_gradient(height_px: int, width_px: int, top: tuple[float, ...], bottom: tuple[float, ...]) -> np.ndarray:
    """[H, W, 3] colour from `top` at the first row to `bottom` at the horizon row (the middle)."""
    up = np.clip(1.0 - np.arange(height_px, dtype=_F) / (0.5 * height_px), 0.0, 1.0)[:, None, None]
    grad = np.asarray(bottom, _F) + (np.asarray(top, _F) - np.asarray(bottom, _F)) * up
    return np.broadcast_to(grad, (height_px, width_px, 3))


def _haze(rgb: np.ndarray, depth_m: np.ndarray, colour: tuple[float, ...], distance_m: float) -> np.ndarray:
    keep = np.exp(-np.where(np.isfinite(depth_m), depth_m, 1e4) / _F(distance_m))[..., None]
    return rgb * keep + np.asarray(colour, _F) * (1.0 - keep)


@functools.lru_cache(maxsize=4)
def _flakes(height_px: int, width_px: int) -> np.ndarray:
    """[N, 4] float32: each flake's column, row at frame 0, fall speed (px/frame) and sideways drift."""
    n = max(1, round(SNOWFLAKES * height_px * width_px / (128 * 128)))
    rng = np.random.default_rng(_FLAKE_SEED)
    cols = rng.uniform(0, width_px, n)
    rows = rng.uniform(0, height_px, n)
    speed = rng.uniform(0.8, 2.0, n)
    drift = rng.uniform(-0.3, 0.3, n)
    return np.stack([cols, rows, speed, drift], axis=1).astype(_F)


def _draw_flakes(rgb: np.ndarray, frame: int) -> np.ndarray:
    h, w = rgb.shape[:2]
    f = _flakes(h, w)
    rows = np.floor((f[:, 1] + f[:, 2] * frame) % h).astype(np.int64)
    cols = np.floor((f[:, 0] + f[:, 3] * frame) % w).astype(np.int64)
    out = rgb.copy()
    out[rows, cols] = 0.15 * out[rows, cols] + 0.85
    return out


def apply_event(layers: RenderLayers, event: WorldEvent, frame: int = 0) -> np.ndarray:
    """[H, W, 3] uint8: the view under `event`; `frame` moves the falling snow."""
    if event is WorldEvent.DAY:
        return layers.rgb
    rgb = layers.rgb.astype(_F) / 255.0
    h, w = rgb.shape[:2]
    sky = (layers.kind == SKY)[..., None]
    depth = layers.depth_m
    if event is WorldEvent.NIGHT:
        scene = _haze(rgb * np.asarray([0.26, 0.3, 0.48], _F), depth, (0.02, 0.03, 0.07), 16.0)
        out = np.where(sky, _sky_gradient(h, w, (0.01, 0.01, 0.05), (0.06, 0.08, 0.16)), scene)
    elif event is WorldEvent.DUSK:
        scene = _haze(rgb * np.asarray([0.95, 0.62, 0.45], _F), depth, (0.55, 0.3, 0.25), 22.0)
        out = np.where(sky, _sky_gradient(h, w, (0.25, 0.16, 0.4), (0.98, 0.55, 0.25)), scene)
    elif event is WorldEvent.FOG:
        grey = (0.74, 0.76, 0.79)
        out = _haze(0.8 * rgb + 0.15, depth, grey, 5.0)
        out = np.where(sky, np.asarray(grey, _F), out)
    elif event is WorldEvent.SNOW:
        luma = rgb @ np.asarray([0.299, 0.587, 0.114], _F)
        ground = (0.78 + 0.2 * luma)[..., None] * np.asarray([0.97, 0.98, 1.0], _F)
        scene = np.where((layers.kind == FLOOR)[..., None], ground, 0.55 * rgb + 0.3 * luma[..., None] + 0.12)
        scene = _haze(scene, depth, (0.82, 0.84, 0.88), 18.0)
        out = _draw_flakes(np.where(sky, _sky_gradient(h, w, (0.7, 0.72, 0.76), (0.86, 0.87, 0.9)), scene), frame)
    else:
        raise ValueError(f"unknown event {event!r}")
    return (np.clip(out, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
