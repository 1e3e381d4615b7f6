"""Camera control: key integration, relative poses, Plücker rays."""

from __future__ import annotations

import math

import pytest
import torch

from workers.controls import ChunkControl, canonical_key
from workers.models.camera import (
    MAX_PITCH_DEG,
    CameraMotion,
    CameraState,
    CameraTrack,
    Intrinsics,
    integrate_chunk,
    plucker_cells,
    plucker_rays,
    relative_chunk_poses,
)

MOTION = CameraMotion(move_step_per_frame=0.1, turn_step_deg_per_frame=0.5, look_deg_per_px=0.1)


def test_key_aliases() -> None:
    assert canonical_key("ArrowUp") == "w"
    assert canonical_key("KeyD") == "d"
    assert canonical_key("L") == "l"
    assert canonical_key("Space") is None
    assert ChunkControl.from_keys(["ArrowLeft", "x", "J"]).keys == frozenset({"a", "j"})


def test_forward_walk_hand_computed() -> None:
    poses, state = integrate_chunk(CameraState(), ChunkControl.from_keys(["w"]), 4, first_chunk=True, motion=MOTION)
    # First latent frame is the start image (no motion); each later one is 4 video frames of 0.1.
    assert poses.shape == (4, 4, 4)
    expected_z = [0.0, 0.4, 0.8, 1.2]
    for pose, z in zip(poses, expected_z):
        assert pose[:3, 3].tolist() == pytest.approx([0.0, 0.0, z])
        assert torch.allclose(pose[:3, :3], torch.eye(3, dtype=torch.float64))
    assert state.position == pytest.approx((0.0, 0.0, 1.2))


def test_walk_while_turning_hand_computed() -> None:
    poses, state = integrate_chunk(
        CameraState(), ChunkControl.from_keys(["w", "l"]), 1, first_chunk=False, motion=MOTION
    )
    # Each frame moves along the heading before that frame's turn: yaw 0, 0.5, 1.0, 1.5 degrees.
    yaws = [math.radians(d) for d in (0.0, 0.5, 1.0, 1.5)]
    x = 0.1 * sum(math.sin(a) for a in yaws)
    z = 0.1 * sum(math.cos(a) for a in yaws)
    assert poses[0, :3, 3].tolist() == pytest.approx([x, 0.0, z])
    assert state.yaw_deg == pytest.approx(2.0)
    # Yaw right turns the camera's forward axis (+z) towards +x.
    forward = poses[0, :3, 2]
    assert forward.tolist() == pytest.approx([math.sin(math.radians(2.0)), 0.0, math.cos(math.radians(2.0))])


def test_strafe_and_pitch_clamp() -> None:
    _, state = integrate_chunk(CameraState(), ChunkControl.from_keys(["d"]), 2, first_chunk=False, motion=MOTION)
    assert state.position == pytest.approx((0.8, 0.0, 0.0))
    state = CameraState()
    for _ in range(100):
        _, state = integrate_chunk(state, ChunkControl.from_keys(["i"]), 4, first_chunk=False, motion=MOTION)
    assert state.pitch_deg == MAX_PITCH_DEG
    # Pitch up tilts forward towards -y (OpenCV y points down).
    assert state.c2w()[1, 2] < 0


def test_mouse_look_spread_over_chunk() -> None:
    control = ChunkControl(look_dx_px=40.0, look_dy_px=-20.0)
    _, state = integrate_chunk(CameraState(), control, 4, first_chunk=False, motion=MOTION)
    assert state.yaw_deg == pytest.approx(4.0)
    assert state.pitch_deg == pytest.approx(2.0)  # moving the mouse up looks up


def test_relative_poses_normalised_and_scaled() -> None:
    poses, _ = integrate_chunk(CameraState(), ChunkControl.from_keys(["w"]), 4, first_chunk=True, motion=MOTION)
    rel = relative_chunk_poses(poses, None, translation_scale=3.0)
    assert torch.allclose(rel[0], torch.eye(4, dtype=torch.float64))
    for r in rel[1:]:
        assert r[:3, 3].tolist() == pytest.approx([0.0, 0.0, 3.0])
    # Continuing from the previous chunk's last pose: every frame is one step of 0.4, normalised to 3.
    more, _ = integrate_chunk(CameraState(position=(0.0, 0.0, 1.2)), ChunkControl.from_keys(["w"]), 4, False, MOTION)
    rel2 = relative_chunk_poses(more, poses[-1], translation_scale=3.0)
    assert rel2.shape == (4, 4, 4)
    for r in rel2:
        assert r[:3, 3].tolist() == pytest.approx([0.0, 0.0, 3.0])
    # Standing still: no translation, nothing to normalise.
    still, _ = integrate_chunk(CameraState(), ChunkControl(), 4, True, MOTION)
    assert relative_chunk_poses(still, None, 3.0)[:, :3, 3].abs().max() == 0


def test_plucker_rays_shape_and_units() -> None:
    poses = torch.stack([CameraState().c2w(), CameraState(position=(1.0, 2.0, 3.0), yaw_deg=30.0).c2w()])
    rays = plucker_rays(poses, Intrinsics.default(32, 16), 16, 32)
    assert rays.shape == (2, 16, 32, 6)
    norms = rays[..., 3:].norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-6)
    assert rays[1, ..., :3].reshape(-1, 3).unique(dim=0).tolist() == [[1.0, 2.0, 3.0]]
    # Identity pose: the ray through pixel (row 8, col 16)'s centre points at +z, slightly right/down.
    d = rays[0, 8, 16, 3:]
    assert d[2] > 0.99 and d[0] > 0 and d[1] > 0


def test_plucker_cells_channel_order() -> None:
    rays = torch.randn(3, 16, 24, 6)
    cells = plucker_cells(rays, 8)
    assert cells.shape == (384, 3, 2, 3)
    c, r, q, f, i, j = 4, 3, 5, 2, 1, 2
    assert cells[c * 64 + r * 8 + q, f, i, j] == rays[f, i * 8 + r, j * 8 + q, c]


def test_camera_track_chunks() -> None:
    track = CameraTrack(MOTION, Intrinsics.default(64, 32), 32, 64, 8, 3.0)
    first = track.next_chunk(ChunkControl.from_keys(["w"]), 4)
    second = track.next_chunk(ChunkControl.from_keys(["w"]), 4)
    assert first.shape == second.shape == (384, 4, 4, 8)
    assert track.state.position == pytest.approx((0.0, 0.0, 2.8))
