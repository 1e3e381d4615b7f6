"""Camera paths through a World: chunk controls -> per-video-frame poses -> frames; random walks.

Chunk geometry (`workers/chunk_geometry.py`): a chunk of C latent frames is 4C video frames, the first
chunk 4C−3.
The first video frame is the start pose; every other video frame is one `CameraState.step` of its
chunk's controls, with mouse look spread evenly over the chunk's steps — exactly the integration of
`integrate_chunk` (its per-latent poses are video frames 0, 4, 8, … of the first chunk and frames
3, 7, 11, … of every later chunk).

Walls. The server's camera integration knows nothing about walls, so the world model has to learn
what a blocked walk looks like. Here the walker is a square of half-size `body_radius_m`; with
collision="stop" (the default) a video frame whose move would enter a wall or tower keeps the
previous position but still applies that frame's turn and pitch; "slide" keeps the free axis of the
move; "none" walks through walls. `simulate_path` returns both the poses rendered (`c2w`) and the
wall-free poses the server would integrate from the same keys (`commanded_c2w`), plus which frames
were blocked, so training can choose its conditioning; the two agree until the first blocked frame.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from workers.chunk_geometry import video_frames
from workers.controls import ChunkControl
from workers.models.camera import CameraMotion, CameraState, Intrinsics
from workers.world.events import WorldEvent, apply_event
from workers.world.world import World

Collision = Literal["stop", "slide", "none"]
BODY_RADIUS_M = 0.2


def _chunk_steps(chunk_latent_frames: int, first_chunk: bool) -> int:
    """Camera steps a chunk integrates: one per video frame after the session's start frame."""
    return video_frames(chunk_latent_frames, first_chunk) - (1 if first_chunk else 0)


def _look_per_step(control: ChunkControl, motion: CameraMotion, steps: int) -> tuple[float, float]:
    # Same spreading as integrate_chunk, so the poses match it bit for bit.
    total = max(1, steps)
    return control.look_dx_px * motion.look_deg_per_px / total, -control.look_dy_px * motion.look_deg_per_px / total


def recut_control(
    control: ChunkControl, path_chunk_latent_frames: int, first_chunk: bool, chunk_latent_frames: int
) -> list[ChunkControl]:
    """One chunk's control of a path drawn in chunks of `path_chunk_latent_frames`, as the controls of
    the shorter chunks of `chunk_latent_frames` that cover the same video frames: the same keys, and
    the mouse look shared by camera steps, so every frame moves as it did (the first chunk's first
    piece, the start frame alone, takes no step and no look)."""
    if chunk_latent_frames < 1 or path_chunk_latent_frames % chunk_latent_frames:
        raise ValueError(
            f"a chunk of {path_chunk_latent_frames} latent frames does not split into chunks of {chunk_latent_frames}"
        )
    pieces = path_chunk_latent_frames // chunk_latent_frames
    total = _chunk_steps(path_chunk_latent_frames, first_chunk)
    out = []
    for i in range(pieces):
        share = _chunk_steps(chunk_latent_frames, first_chunk and i == 0) / total if total else 0.0
        out.append(
            dataclasses.replace(control, look_dx_px=control.look_dx_px * share, look_dy_px=control.look_dy_px * share)
        )
    return out


def _collide(
    world: World | None, prev: CameraState, nxt: CameraState, collision: Collision, radius_m: float
) -> tuple[CameraState, bool]:
    x1, _, z1 = nxt.position
    if collision == "none" or nxt.position == prev.position:
        return nxt, False
    assert world is not None, "collision needs a world"
    if world.is_free(x1, z1, radius_m):
        return nxt, False
    x0, y0, z0 = prev.position
    position = prev.position
    if collision == "slide":
        if world.is_free(x1, z0, radius_m):
            position = (x1, y0, z0)
        elif world.is_free(x0, z1, radius_m):
            position = (x0, y0, z1)
    return CameraState(position=position, yaw_deg=nxt.yaw_deg, pitch_deg=nxt.pitch_deg), True


def _advance(
    world: World | None,
    state: CameraState,
    control: ChunkControl,
    steps: int,
    motion: CameraMotion,
    collision: Collision,
    radius_m: float,
) -> tuple[list[CameraState], list[bool]]:
    look_yaw, look_pitch = _look_per_step(control, motion, steps)
    states, blocked = [], []
    for _ in range(steps):
        state, hit = _collide(world, state, state.step(control, motion, look_yaw, look_pitch), collision, radius_m)
        states.append(state)
        blocked.append(hit)
    return states, blocked


@dataclasses.dataclass(frozen=True)
class PathPoses:
    c2w: np.ndarray  # [T, 4, 4] float64 poses rendered (after collision)
    commanded_c2w: np.ndarray  # [T, 4, 4] float64 poses the server integrates from the keys (no walls)
    blocked: np.ndarray  # [T] bool: the frame's move was stopped (or cut short) by a wall
    chunk_index: np.ndarray  # [T] int: which control chunk each video frame belongs to


def simulate_path(
    world: World,
    controls: list[ChunkControl],
    chunk_latent_frames: int,
    motion: CameraMotion | None = None,
    collision: Collision = "stop",
    body_radius_m: float = BODY_RADIUS_M,
    start: CameraState | None = None,
) -> PathPoses:
    """Per-video-frame poses for one control per chunk, from `start` (default: the world's start pose)."""
    if chunk_latent_frames < 1:
        raise ValueError(f"chunk_latent_frames must be >= 1, got {chunk_latent_frames}")
    if collision not in ("stop", "slide", "none"):
        raise ValueError(f"collision must be 'stop', 'slide' or 'none', got {collision!r}")
    motion = motion or CameraMotion()
    state = commanded = start if start is not None else world.start_state()
    states, cmd_states, blocked, chunk_index = [state], [commanded], [False], [0]
    for i, control in enumerate(controls):
        steps = _chunk_steps(chunk_latent_frames, first_chunk=i == 0)
        new, hit = _advance(world, state, control, steps, motion, collision, body_radius_m)
        cmd, _ = _advance(world, commanded, control, steps, motion, "none", body_radius_m)
        states += new
        cmd_states += cmd
        blocked += hit
        chunk_index += [i] * steps
        state, commanded = states[-1], cmd_states[-1]
    if not controls:
        states, cmd_states, blocked, chunk_index = [], [], [], []

    def stack(seq: list[CameraState]) -> np.ndarray:
        return np.stack([s.c2w().numpy() for s in seq]) if seq else np.zeros((0, 4, 4))

    return PathPoses(
        c2w=stack(states),
        commanded_c2w=stack(cmd_states),
        blocked=np.array(blocked, dtype=bool),
        chunk_index=np.array(chunk_index, dtype=np.int64),
    )


def render_path(
    world: World,
    controls: list[ChunkControl],
    chunk_latent_frames: int,
    height_px: int = 128,
    width_px: int = 128,
    intrinsics: Intrinsics | None = None,
    motion: CameraMotion | None = None,
    collision: Collision = "stop",
    start: CameraState | None = None,
    events: Sequence[WorldEvent] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Frames [T, H, W, 3] uint8 and their c2w [T, 4, 4] float64, T = 4C−3 + 4C·(len(controls) − 1).

    `events`: one per chunk (default: day throughout). Frame 0, the start image, is always the day:
    a session starts from a day scene and an event changes what follows it."""
    intrinsics = intrinsics or Intrinsics.default(width_px, height_px)
    path = simulate_path(world, controls, chunk_latent_frames, motion, collision, start=start)
    if events is not None and len(events) != len(controls):
        raise ValueError(f"events: one per chunk ({len(controls)}), got {len(events)}")
    frames = np.zeros((len(path.c2w), height_px, width_px, 3), dtype=np.uint8)
    for i, pose in enumerate(path.c2w):
        event = WorldEvent.DAY if events is None or i == 0 else events[path.chunk_index[i]]
        if event is WorldEvent.DAY:
            frames[i] = world.render(pose, intrinsics, height_px, width_px)
        else:
            frames[i] = apply_event(world.render_layers(pose, intrinsics, height_px, width_px), event, i)
    return frames, path.c2w


def free_distance(world: World, x: float, z: float, yaw_deg: float, max_m: float = 8.0, step_m: float = 0.25) -> float:
    """How far a walker can go straight along a heading before touching a wall (capped at max_m)."""
    sx, sz = math.sin(math.radians(yaw_deg)), math.cos(math.radians(yaw_deg))
    dist = 0.0
    while dist < max_m and world.is_free(x + (dist + step_m) * sx, z + (dist + step_m) * sz, BODY_RADIUS_M):
        dist += step_m
    return dist


# (weight, key sets to pick from) for one held segment of 1–3 chunks.
_SEGMENTS: list[tuple[float, list[set[str]]]] = [
    (0.30, [{"w"}]),
    (0.18, [{"w", "j"}, {"w", "l"}]),
    (0.12, [{"j"}, {"l"}]),
    (0.08, [{"a"}, {"d"}, {"w", "a"}, {"w", "d"}]),
    (0.05, [{"s"}, {"s", "j"}, {"s", "l"}]),
    (0.10, [{"i"}, {"k"}, {"w", "i"}, {"w", "k"}]),  # look up/down a little (one chunk)
    (0.12, [{"w"}, set()]),  # with mouse look
    (0.05, [set()]),  # stand still
]
_MOUSE_SEGMENT = 6
_MAX_PITCH_DRIFT_DEG = 15.0


def _run_chunks(
    world: World | None,
    state: CameraState,
    controls: list[ChunkControl],
    starts_session: bool,
    chunk_latent_frames: int,
    motion: CameraMotion,
) -> tuple[CameraState, int, int]:
    """State after `controls` (collision "stop" with a world, free walking without), blocked and total frames."""
    blocked = total = 0
    for j, control in enumerate(controls):
        steps = _chunk_steps(chunk_latent_frames, first_chunk=starts_session and j == 0)
        collision: Collision = "stop" if world is not None else "none"
        states, hit = _advance(world, state, control, steps, motion, collision, BODY_RADIUS_M)
        state = states[-1] if states else state
        blocked, total = blocked + sum(hit), total + steps
    return state, blocked, total


def random_controls(
    rng: np.random.Generator,
    num_chunks: int,
    *,
    world: World | None = None,
    chunk_latent_frames: int = 4,
    motion: CameraMotion | None = None,
    start: CameraState | None = None,
) -> list[ChunkControl]:
    """Plausible walking controls, one per chunk: keys held for 1–3 chunks (1–3 s at C = 4) — walks,
    curves, turns, strafes, a few steps back, short looks up or down that drift back towards level,
    some mouse look, some standing still.

    With `world`, the walk is simulated (collision "stop") and a segment that would spend more than a
    quarter of its frames pushing against a wall is replaced by a turn towards the more open side.
    """
    motion = motion or CameraMotion()
    weights = np.array([w for w, _ in _SEGMENTS])
    weights /= weights.sum()
    controls: list[ChunkControl] = []
    state = start if start is not None else world.start_state() if world is not None else CameraState()
    while len(controls) < num_chunks:
        kind = int(rng.choice(len(_SEGMENTS), p=weights))
        options = _SEGMENTS[kind][1]
        keys = set(options[int(rng.integers(len(options)))])
        length = int(rng.integers(1, 4))
        if keys & {"i", "k"}:  # look up or down a little, towards level when already tilted
            length = 1
            keys -= {"i", "k"}
            pitch = state.pitch_deg
            keys.add("k" if pitch > 5.0 else "i" if pitch < -5.0 else str(rng.choice(["i", "k"])))
        look = (float(rng.normal(0.0, 40.0)), float(rng.normal(0.0, 8.0))) if kind == _MOUSE_SEGMENT else (0.0, 0.0)
        segment = [
            ChunkControl(keys=frozenset(keys), look_dx_px=look[0], look_dy_px=look[1])
            for _ in range(min(length, num_chunks - len(controls)))
        ]
        if abs(state.pitch_deg) > _MAX_PITCH_DRIFT_DEG and not keys & {"i", "k"}:
            level = "k" if state.pitch_deg > 0 else "i"  # drift back towards level
            segment[0] = ChunkControl(keys=frozenset(keys | {level}), look_dx_px=look[0], look_dy_px=look[1])
        end, blocked, total = _run_chunks(world, state, segment, not controls, chunk_latent_frames, motion)
        if world is not None and blocked > total // 4:
            x, _, z = state.position
            left = free_distance(world, x, z, state.yaw_deg - 60.0)
            right = free_distance(world, x, z, state.yaw_deg + 60.0)
            turn = frozenset({"j" if left > right else "l"})
            segment = [ChunkControl(keys=turn)] * min(len(segment), int(rng.integers(1, 3)))
            end, _, _ = _run_chunks(world, state, segment, not controls, chunk_latent_frames, motion)
        controls += segment
        state = end
    return controls


def random_start(rng: np.random.Generator, world: World, clearance_m: float = 0.45) -> CameraState:
    """A random level pose on open ground: at least `clearance_m` from walls and towers, any heading."""
    cfg = world.map.config
    ox, oz = world.map.origin_xz
    extent = cfg.size_cells * cfg.cell_m
    for _ in range(10_000):
        x, z = ox + rng.uniform(0.0, extent), oz + rng.uniform(0.0, extent)
        if world.is_free(x, z, clearance_m):
            return CameraState(position=(x, 0.0, z), yaw_deg=float(rng.uniform(-180.0, 180.0)))
    raise ValueError("no open ground found for a start pose")
