"""The procedural world: determinism, poses identical to the server's key integration, and views
whose geometry follows the OpenCV conventions of workers/models/camera.py."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from workers.chunk_geometry import video_frames
from workers.controls import ChunkControl
from workers.models.camera import CameraMotion, CameraState, Intrinsics, integrate_chunk, plucker_rays
from workers.world import World, free_distance, random_controls, recut_control, render_path, simulate_path
from workers.world.map import TOWER, WALL
from workers.world.render import FLOOR, SKY, TOWER_HIT, WALL_HIT

SEED = 7
RES = 64
INTR = Intrinsics.default(RES, RES)
MOTION = CameraMotion()


@pytest.fixture(scope="module")
def world() -> World:
    return World.generate(SEED)


def _steps(state: CameraState, keys: list[str], n: int) -> CameraState:
    control = ChunkControl.from_keys(keys)
    for _ in range(n):
        state = state.step(control, MOTION, 0.0, 0.0)
    return state


def _layers(world: World, state: CameraState, res: int = RES):
    return world.render_layers(state.c2w().numpy(), Intrinsics.default(res, res), res, res)


def test_same_seed_same_frames_other_seed_other_world(world: World) -> None:
    controls = random_controls(np.random.default_rng(1), 3, world=world, chunk_latent_frames=2)
    assert controls == random_controls(np.random.default_rng(1), 3, world=world, chunk_latent_frames=2)
    frames_a, c2w_a = render_path(world, controls, 2, RES, RES)
    frames_b, c2w_b = render_path(World.generate(SEED), controls, 2, RES, RES)
    assert np.array_equal(frames_a, frames_b) and np.array_equal(c2w_a, c2w_b)
    other = World.generate(SEED + 1)
    assert not np.array_equal(other.map.cells, world.map.cells)
    assert not np.array_equal(other.render(world.start_pose(), INTR, RES, RES), frames_a[0])


def test_poses_equal_key_integration(world: World) -> None:
    chunk = 2
    controls = [
        ChunkControl.from_keys(["w", "l"]),
        ChunkControl.from_keys(["i", "a"]),
        ChunkControl(keys=frozenset({"s"}), look_dx_px=30.0, look_dy_px=-12.0),
    ]
    path = simulate_path(world, controls, chunk)
    assert not path.blocked.any()
    assert np.array_equal(path.c2w, path.commanded_c2w)
    assert len(path.c2w) == video_frames(chunk, True) + 2 * video_frames(chunk, False) == 5 + 8 + 8
    assert np.array_equal(path.c2w[0], np.eye(4)) and np.array_equal(world.start_pose(), np.eye(4))

    # Per latent frame: exactly integrate_chunk's poses (frames 0, 4, … of the first chunk, 3, 7, … later).
    state, start = CameraState(), 0
    for i, control in enumerate(controls):
        poses, state = integrate_chunk(state, control, chunk, i == 0, MOTION)
        picks = [start + 4 * j for j in range(chunk)] if i == 0 else [start + 4 * j + 3 for j in range(chunk)]
        assert np.array_equal(path.c2w[picks], poses.numpy())
        start += video_frames(chunk, i == 0)
    # Per video frame: one CameraState.step each, mouse look spread over the chunk's steps.
    state, expected = CameraState(), [CameraState().c2w()]
    for i, control in enumerate(controls):
        steps = 4 * (chunk - 1 if i == 0 else chunk)
        for _ in range(steps):
            state = state.step(control, MOTION, control.look_dx_px * 0.1 / steps, -control.look_dy_px * 0.1 / steps)
            expected.append(state.c2w())
    assert np.array_equal(path.c2w, torch.stack(expected).numpy())
    _, c2w = render_path(world, controls, chunk, 16, 16)
    assert np.array_equal(c2w, path.c2w)


def test_walls_stop_the_walker_but_not_the_commanded_pose(world: World) -> None:
    controls = [ChunkControl.from_keys(["w"])] * 16  # 250 frames of W: 25 units, longer than the map
    path = simulate_path(world, controls, 4)
    assert path.blocked.any()
    first = int(np.argmax(path.blocked))
    assert np.array_equal(path.c2w[:first], path.commanded_c2w[:first])
    assert path.commanded_c2w[-1, 2, 3] == pytest.approx(0.1 * (len(path.c2w) - 1))
    assert all(world.is_free(p[0, 3], p[2, 3], 0.2) for p in path.c2w)
    assert path.c2w[-1, 2, 3] == pytest.approx(free_distance(world, 0.0, 0.0, 0.0, max_m=40.0), abs=0.3)
    assert world.is_free(0.0, 0.0, 0.4) and not world.is_free(*world.map.towers[0, :2])
    assert not world.is_free(world.map.origin_xz[0] + 0.5, world.map.origin_xz[1] + 0.5)  # border cell


def test_identity_pose_sky_on_top_floor_below(world: World) -> None:
    layers = _layers(world, CameraState())
    assert (layers.kind[0] == SKY).mean() > 0.8  # OpenCV y points down: row 0 looks up
    assert (layers.kind[-1] == FLOOR).all()
    sky = layers.rgb[layers.kind == SKY].astype(float).mean(axis=0)
    assert sky[2] > sky[0]  # blue above
    assert np.isinf(layers.depth_m[layers.kind == SKY]).all()
    assert np.isfinite(layers.depth_m[layers.kind != SKY]).all()


def _tower_view(world: World) -> tuple[int, CameraState]:
    """A tower and a free spot 2 cells from it, looking 5° to the tower's left (tower right of centre)."""
    for tid, (cx, cz, _, _) in enumerate(world.map.towers):
        for yaw in (0.0, 90.0, 180.0, 270.0):
            sx, sz = math.sin(math.radians(yaw)), math.cos(math.radians(yaw))
            x, z = float(cx - 2 * sx), float(cz - 2 * sz)
            if world.is_free(x, z, 0.3) and world.is_free(float(cx - sx), float(cz - sz), 0.3):
                return tid, CameraState(position=(x, 0.0, z), yaw_deg=yaw - 5.0)
    raise AssertionError("no tower with a free viewpoint")


def test_turn_right_moves_landmark_left(world: World) -> None:
    tid, state = _tower_view(world)
    before = _layers(world, state).tower_id == tid
    after = _layers(world, _steps(state, ["l"], 10)).tower_id == tid  # 5° to the right
    col_before, col_after = np.nonzero(before)[1].mean(), np.nonzero(after)[1].mean()
    # The tower's centre projects at fx·tan(5°) right of the image centre; turning right by 5° centres it.
    assert col_before == pytest.approx(RES / 2 + RES * math.tan(math.radians(5.0)), abs=1.5)
    assert col_after == pytest.approx(RES / 2, abs=1.5)
    assert col_after < col_before - 3


def test_walking_towards_a_wall_makes_it_bigger(world: World) -> None:
    solid = (WALL_HIT, TOWER_HIT)  # whatever stands straight ahead of the start (the border at worst)
    start = _layers(world, CameraState())
    centre = RES // 2
    assert start.kind[centre, centre] in solid
    d0 = float(start.depth_m[centre, centre])
    n = int((d0 - 2.0) / 0.1)
    assert n > 5
    near = _layers(world, _steps(CameraState(), ["w"], n))
    assert near.kind[centre, centre] in solid
    assert near.depth_m[centre, centre] == pytest.approx(d0 - 0.1 * n, abs=1e-3)  # W moves along +z

    # Its foot (row cy + fy·eye_height / distance) comes down the image and it covers more of it.
    def foot_row(kind: np.ndarray) -> int:
        return int(np.nonzero(np.isin(kind[:, centre], solid))[0].max())

    expected = [RES / 2 + RES * world.map.config.eye_height_m / d - 0.5 for d in (d0, d0 - 0.1 * n)]
    assert [foot_row(start.kind), foot_row(near.kind)] == pytest.approx(expected, abs=1.0)
    assert np.isin(near.kind, solid).sum() > 1.25 * np.isin(start.kind, solid).sum()


def test_pitch_up_moves_horizon_down(world: World) -> None:
    def horizon_row(state: CameraState) -> float:
        floor = _layers(world, state).kind == FLOOR
        return float(np.argmax(floor, axis=0).mean())  # first floor row per column

    level = horizon_row(CameraState())
    up = horizon_row(_steps(CameraState(), ["i"], 10))  # pitch +5°
    down = horizon_row(_steps(CameraState(), ["k"], 10))
    shift = RES * math.tan(math.radians(5.0))
    assert up > level + 0.6 * shift and down < level - 0.6 * shift


def test_hits_lie_on_the_geometry_along_plucker_rays(world: World) -> None:
    """Depth along camera.py's own ray directions lands on wall faces, the floor or a tower."""
    wm = world.map
    state = CameraState(position=(0.3, 0.0, -0.2), yaw_deg=-130.0, pitch_deg=-12.0)
    layers = _layers(world, state)
    rays = plucker_rays(state.c2w()[None], INTR, RES, RES)[0].double().numpy()
    pts = rays[..., :3] + rays[..., 3:] * layers.depth_m[..., None]
    floor = pts[layers.kind == FLOOR]
    assert np.allclose(floor[:, 1], wm.floor_y, atol=1e-3)
    walls = pts[layers.kind == WALL_HIT]
    assert len(walls) > 100
    assert ((walls[:, 1] >= wm.wall_top_y - 1e-3) & (walls[:, 1] <= wm.floor_y + 1e-3)).all()
    gx = (walls[:, 0] - wm.origin_xz[0]) / wm.config.cell_m
    gz = (walls[:, 2] - wm.origin_xz[1]) / wm.config.cell_m
    assert (np.minimum(np.abs(gx - np.round(gx)), np.abs(gz - np.round(gz))) < 1e-3).all()
    # One side of each hit is a wall cell, the side facing the camera is open.
    towards = -rays[layers.kind == WALL_HIT][:, 3:] * 0.02
    inside = [wm.cell_code(p[0], p[2]) for p in walls - towards]
    outside = [wm.cell_code(p[0], p[2]) for p in walls + towards]
    assert np.mean([c == WALL for c in inside]) > 0.97 and np.mean([c != WALL for c in outside]) > 0.97
    towers = _layers(world, _tower_view(world)[1])
    assert (towers.kind == TOWER_HIT).sum() > 20
    assert set(np.unique(towers.kind)) <= {SKY, FLOOR, WALL_HIT, TOWER_HIT}
    assert (wm.cells == TOWER).sum() == len(wm.towers)


def test_frames_have_content_and_strip(world: World, tmp_path: Path) -> None:
    controls = random_controls(np.random.default_rng(3), 4, world=world)
    frames, c2w = render_path(world, controls, 4, 96, 128)
    assert frames.shape == (13 + 3 * 16, 96, 128, 3) and frames.dtype == np.uint8
    assert c2w.shape == (len(frames), 4, 4)
    for frame in frames[::8]:
        assert frame.std() > 15
        assert len(np.unique(frame.reshape(-1, 3), axis=0)) > 200
    strip = np.concatenate(list(frames[::12]), axis=1)
    Image.fromarray(strip).save(tmp_path / "strip.png")
    assert Image.open(tmp_path / "strip.png").size == (strip.shape[1], 96)


def test_random_controls_are_walks(world: World) -> None:
    rng = np.random.default_rng(0)
    controls = random_controls(rng, 40)
    assert len(controls) == 40
    assert all(c.keys <= set("wasdjlik") for c in controls)
    assert sum("w" in c.keys for c in controls) >= 10
    assert any(a == b for a, b in itertools.pairwise(controls))  # keys are held across chunks
    state = CameraState()
    for i, control in enumerate(controls):
        _, state = integrate_chunk(state, control, 4, i == 0, MOTION)
        assert abs(state.pitch_deg) < 35.0
    steered = simulate_path(world, random_controls(np.random.default_rng(0), 20, world=world), 4)
    assert steered.blocked.mean() < 0.15


def test_paths_can_start_anywhere(world: World) -> None:
    from workers.world import random_start

    start = random_start(np.random.default_rng(3), world)
    assert world.is_free(start.position[0], start.position[2], 0.4) and start.pitch_deg == 0.0
    poses = simulate_path(world, [ChunkControl.from_keys(["w"])], 1, MOTION, collision="none", start=start)
    assert np.allclose(poses.c2w[0], start.c2w().numpy())
    heading = np.array([math.sin(math.radians(start.yaw_deg)), 0.0, math.cos(math.radians(start.yaw_deg))])
    moved = poses.c2w[-1][:3, 3] - poses.c2w[0][:3, 3]
    assert np.allclose(moved, heading * MOTION.move_step_per_frame * (len(poses.c2w) - 1))


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_a_path_recut_into_shorter_chunks_walks_the_same_frames(world: World, chunk: int) -> None:
    controls = random_controls(np.random.default_rng(5), 6, world=world)
    controls[1] = ChunkControl(keys=frozenset("w"), look_dx_px=90.0, look_dy_px=-12.0)  # a mouse look to share
    controls[0] = ChunkControl(keys=frozenset("wl"), look_dx_px=-30.0)  # and one in the first chunk
    pieces = [p for k, c in enumerate(controls) for p in recut_control(c, 4, k == 0, chunk)]
    assert len(pieces) == len(controls) * 4 // chunk
    path = simulate_path(world, controls, 4)
    recut = simulate_path(world, pieces, chunk)
    assert path.c2w.shape == recut.c2w.shape
    np.testing.assert_allclose(recut.c2w, path.c2w, atol=1e-9)  # shared look: same sums, up to rounding


def test_a_chunk_that_does_not_split_is_refused() -> None:
    with pytest.raises(ValueError, match="does not split into chunks of 3"):
        recut_control(ChunkControl(), 4, False, 3)
