"""Camera control: held keys and mouse look -> camera poses -> Plücker ray maps for the DiT.

Conventions (OpenCV camera-to-world): x right, y down, z forward. The world frame is the start
camera's frame. Yaw turns about the world's vertical axis (positive = right), pitch about the
camera's x axis (positive = up), clamped to ±85°. Moves are horizontal (walking), along the yawed
heading; they ignore pitch so looking down does not walk into the floor.

Per latent frame the camera integrates 4 per-video-frame steps; the first latent frame of a
session is the start image itself and does not move. The DiT sees framewise relative poses whose
translations are normalised per chunk (largest = 1) then scaled by `translation_scale`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from workers.chunk_geometry import VAE_TIME_STRIDE
from workers.controls import MOVE_KEYS, TURN_KEYS, ChunkControl
from workers.models.presets import ModelPreset

MAX_PITCH_DEG = 85.0


@dataclass(frozen=True)
class CameraMotion:
    move_step_per_frame: float = 0.10
    turn_step_deg_per_frame: float = 0.5
    look_deg_per_px: float = 0.1


@dataclass(frozen=True)
class CameraState:
    position: tuple[float, float, float] = (0.0, 0.0, 0.0)
    yaw_deg: float = 0.0
    pitch_deg: float = 0.0

    def c2w(self) -> torch.Tensor:
        """4×4 float64 camera-to-world matrix."""
        yaw, pitch = math.radians(self.yaw_deg), math.radians(self.pitch_deg)
        cy, sy, cp, sp = math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch)
        rot_yaw = torch.tensor([[cy, 0.0, sy], [0.0, 1.0, 0.0], [-sy, 0.0, cy]], dtype=torch.float64)
        # Pitch up tilts the forward axis towards -y (y points down in OpenCV).
        rot_pitch = torch.tensor([[1.0, 0.0, 0.0], [0.0, cp, -sp], [0.0, sp, cp]], dtype=torch.float64)
        pose = torch.eye(4, dtype=torch.float64)
        pose[:3, :3] = rot_yaw @ rot_pitch
        pose[:3, 3] = torch.tensor(self.position, dtype=torch.float64)
        return pose

    def step(
        self, control: ChunkControl, motion: CameraMotion, look_yaw_deg: float, look_pitch_deg: float
    ) -> CameraState:
        """Advance one video frame under held keys plus this frame's share of mouse look."""
        right = sum(MOVE_KEYS[k][0] for k in control.keys if k in MOVE_KEYS)
        forward = sum(MOVE_KEYS[k][1] for k in control.keys if k in MOVE_KEYS)
        dyaw = sum(TURN_KEYS[k][0] for k in control.keys if k in TURN_KEYS)
        dpitch = sum(TURN_KEYS[k][1] for k in control.keys if k in TURN_KEYS)
        yaw = self.yaw_deg + dyaw * motion.turn_step_deg_per_frame + look_yaw_deg
        pitch = self.pitch_deg + dpitch * motion.turn_step_deg_per_frame + look_pitch_deg
        pitch = max(-MAX_PITCH_DEG, min(MAX_PITCH_DEG, pitch))
        # Move along the heading before this frame's turn (the turn applies from the next frame).
        rad = math.radians(self.yaw_deg)
        heading = (math.sin(rad), 0.0, math.cos(rad))
        right_dir = (math.cos(rad), 0.0, -math.sin(rad))
        step = motion.move_step_per_frame
        x, y, z = self.position
        position = (
            x + step * (forward * heading[0] + right * right_dir[0]),
            y,
            z + step * (forward * heading[2] + right * right_dir[2]),
        )
        return CameraState(position=position, yaw_deg=yaw, pitch_deg=pitch)


def integrate_chunk(
    state: CameraState, control: ChunkControl, num_latent_frames: int, first_chunk: bool, motion: CameraMotion
) -> tuple[torch.Tensor, CameraState]:
    """Poses [F, 4, 4] (float64, one per latent frame) for a chunk, and the state after it."""
    steps_per_latent = [0 if (first_chunk and i == 0) else VAE_TIME_STRIDE for i in range(num_latent_frames)]
    total_steps = max(1, sum(steps_per_latent))
    # Mouse look is spread evenly over the chunk so a flick becomes a smooth turn.
    look_yaw = control.look_dx_px * motion.look_deg_per_px / total_steps
    look_pitch = -control.look_dy_px * motion.look_deg_per_px / total_steps  # screen y grows downwards
    poses = []
    for steps in steps_per_latent:
        for _ in range(steps):
            state = state.step(control, motion, look_yaw, look_pitch)
        poses.append(state.c2w())
    return torch.stack(poses), state


def _se3_inverse(poses: torch.Tensor) -> torch.Tensor:
    rot_t = poses[:, :3, :3].transpose(-1, -2)
    out = torch.eye(4, dtype=poses.dtype).repeat(poses.shape[0], 1, 1)
    out[:, :3, :3] = rot_t
    out[:, :3, 3:] = -rot_t @ poses[:, :3, 3:]
    return out


def relative_chunk_poses(
    poses: torch.Tensor, previous_pose: torch.Tensor | None, translation_scale: float
) -> torch.Tensor:
    """Framewise relative poses for a chunk, continuing from the previous chunk's last pose.

    Frame i's pose is expressed relative to frame i-1 (the first frame relative to
    `previous_pose`, or identity at the session start). Translations are divided by the chunk's
    largest one (when the camera moves at all) and multiplied by `translation_scale`.
    """
    seq = poses if previous_pose is None else torch.cat([previous_pose[None], poses])
    rel = torch.eye(4, dtype=seq.dtype).repeat(seq.shape[0], 1, 1)
    rel[1:] = _se3_inverse(seq[:-1]) @ seq[1:]
    if previous_pose is not None:
        rel = rel[1:]
    trans = rel[:, :3, 3]
    max_norm = trans.norm(dim=-1).max()
    if max_norm > 0:
        rel[:, :3, 3] = trans / max_norm * translation_scale
    return rel


@dataclass(frozen=True)
class Intrinsics:
    fx: float
    fy: float
    cx: float
    cy: float

    @staticmethod
    def default(width_px: int, height_px: int) -> Intrinsics:
        return Intrinsics(fx=float(width_px), fy=float(width_px), cx=width_px / 2, cy=height_px / 2)


def pixel_directions(
    intrinsics: Intrinsics, height_px: int, width_px: int, device: torch.device | None = None
) -> torch.Tensor:
    """Unit ray directions through every pixel centre in the camera frame, [H, W, 3] float64."""
    ys, xs = torch.meshgrid(
        torch.arange(height_px, dtype=torch.float64, device=device) + 0.5,
        torch.arange(width_px, dtype=torch.float64, device=device) + 0.5,
        indexing="ij",
    )
    dirs = torch.stack(
        [(xs - intrinsics.cx) / intrinsics.fx, (ys - intrinsics.cy) / intrinsics.fy, torch.ones_like(xs)], dim=-1
    )
    return dirs / dirs.norm(dim=-1, keepdim=True)


def rays_through(poses: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """Poses [F, 4, 4] and pixel directions [H, W, 3] (same device) -> Plücker map [F, H, W, 6]
    = [ray origin (3), unit ray direction (3)] in float32."""
    poses = poses.to(torch.float64)
    rays_d = torch.einsum("hwj,fij->fhwi", directions, poses[:, :3, :3])
    rays_o = poses[:, None, None, :3, 3].expand_as(rays_d)
    return torch.cat([rays_o, rays_d], dim=-1).float()


def plucker_rays(poses: torch.Tensor, intrinsics: Intrinsics, height_px: int, width_px: int) -> torch.Tensor:
    """Per-pixel Plücker map [F, H, W, 6] for poses on the host."""
    return rays_through(poses, pixel_directions(intrinsics, height_px, width_px))


def plucker_cells(rays: torch.Tensor, cell_px: int) -> torch.Tensor:
    """[F, H, W, 6] -> [6·cell², F, H/cell, W/cell], channels ordered (component, row, column)."""
    f, h, w, c = rays.shape
    grid = rays.view(f, h // cell_px, cell_px, w // cell_px, cell_px, c)
    return grid.permute(5, 2, 4, 0, 1, 3).reshape(c * cell_px * cell_px, f, h // cell_px, w // cell_px)


@dataclass
class CameraTrack:
    """A session's camera: integrates chunk controls and emits the DiT's camera input per chunk."""

    motion: CameraMotion
    intrinsics: Intrinsics
    height_px: int
    width_px: int
    cell_px: int
    translation_scale: float
    state: CameraState = field(default_factory=CameraState)
    last_pose: torch.Tensor | None = None

    @staticmethod
    def for_preset(preset: ModelPreset, motion: CameraMotion | None = None) -> CameraTrack:
        """A session's track at the preset's resolution, step sizes and default intrinsics."""
        return CameraTrack(
            motion=motion or CameraMotion(preset.move_step_per_frame, preset.turn_step_deg_per_frame),
            intrinsics=Intrinsics.default(preset.width_px, preset.height_px),
            height_px=preset.height_px,
            width_px=preset.width_px,
            cell_px=preset.vae.spatial_stride,
            translation_scale=preset.translation_scale,
        )

    def next_inputs(self, control: ChunkControl, num_latent_frames: int) -> torch.Tensor:
        """Controls for the next chunk -> the DiT's relative poses [F, 4, 4] (float64, host)."""
        poses, self.state = integrate_chunk(self.state, control, num_latent_frames, self.last_pose is None, self.motion)
        rel = relative_chunk_poses(poses, self.last_pose, self.translation_scale)
        self.last_pose = poses[-1]
        return rel

    def next_chunk(self, control: ChunkControl, num_latent_frames: int) -> torch.Tensor:
        """Controls for the next chunk -> Plücker cells [384, F, h, w] (float32, host)."""
        rel = self.next_inputs(control, num_latent_frames)
        return plucker_cells(plucker_rays(rel, self.intrinsics, self.height_px, self.width_px), self.cell_px)

    def reset_pose(self) -> None:
        """Start a fresh pose frame at the current view (the model only sees relative motion)."""
        self.state = CameraState()
        if self.last_pose is not None:
            self.last_pose = self.state.c2w()


class PluckerEncoder:
    """Relative poses -> Plücker cells on the DiT's device.

    The pixel directions (H × W × 3 float64) are built there once; a chunk then uploads only its
    F 4 × 4 poses and computes its rays where the DiT runs, instead of building an H × W map on
    the host and copying it over (at 480 × 832 that map is 38 MB per chunk)."""

    def __init__(self, preset: ModelPreset, device: torch.device) -> None:
        intrinsics = Intrinsics.default(preset.width_px, preset.height_px)
        self.directions = pixel_directions(intrinsics, preset.height_px, preset.width_px, device)
        self.cell_px = preset.vae.spatial_stride

    def cells(self, poses: torch.Tensor) -> torch.Tensor:
        """poses [F, 4, 4] on the encoder's device -> [384, F, h, w] float32."""
        return plucker_cells(rays_through(poses, self.directions), self.cell_px)
