"""One walk, turned into the DiT's camera input by our camera code and by the released one.

Our side is the live path: `CameraTrack` integrates held keys per video frame, emits each chunk's
framewise relative poses and builds its Plücker cells. The reference side is the released
offline path as FastVideo ships it (`cam_utils.prepare_camera_embedding`): the walk's video-frame
poses and intrinsics written as `poses.npy` / `intrinsics.npy`, resampled to latent frames, made
framewise relative over the whole clip, normalised once, turned into rays and regrouped per cell.

They meet where the two rules coincide: the release normalises translations once per clip, we
normalise per chunk (a live session cannot see the path ahead) and then scale by the preset's
`translation_scale` (3.0, the real-time rule). With a steady walk every latent frame moves the same
distance, so both normalisations divide by the same length; our side runs at scale 1 here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from tests.parity.references import fastvideo_module
from workers.chunk_geometry import VAE_TIME_STRIDE
from workers.controls import ChunkControl
from workers.models.camera import CameraMotion, CameraState, CameraTrack, Intrinsics
from workers.models.presets import TINY, ModelPreset

# Forward, turning right and looking up, all held: every latent frame moves the same distance.
STEADY_WALK = ChunkControl.from_keys(["w", "l", "i"])
RELEASE_SIZE = (480, 832)  # (height, width) the released intrinsics files are written for


def walk_preset(height_px: int, width_px: int) -> ModelPreset:
    return replace(TINY, height_px=height_px, width_px=width_px, translation_scale=1.0)


def our_cells(preset: ModelPreset, chunk_frames: int, num_chunks: int) -> list[torch.Tensor]:
    """Per chunk, our Plücker cells [1, 384, F, h, w] for the steady walk."""
    track = CameraTrack.for_preset(preset)
    return [track.next_chunk(STEADY_WALK, chunk_frames)[None] for _ in range(num_chunks)]


def _video_frame_poses(preset: ModelPreset, num_latent_frames: int) -> np.ndarray:
    """The walk's camera-to-world pose at every video frame [N, 4, 4]; latent frame i is video frame 4i."""
    motion = CameraMotion(preset.move_step_per_frame, preset.turn_step_deg_per_frame)
    state = CameraState()
    poses = [state.c2w()]
    for _ in range(VAE_TIME_STRIDE * (num_latent_frames - 1)):
        state = state.step(STEADY_WALK, motion, 0.0, 0.0)
        poses.append(state.c2w())
    return torch.stack(poses).numpy()


def reference_cells(preset: ModelPreset, chunk_frames: int, num_chunks: int, workdir: Path) -> list[torch.Tensor]:
    """Per chunk, the released code's Plücker cells [1, 384, F, h, w] for the same walk."""
    cam_utils = fastvideo_module("models.dits.lingbotworld2.cam_utils")
    num_latent = chunk_frames * num_chunks
    poses = _video_frame_poses(preset, num_latent)
    # The release rescales intrinsics written for 832 × 480 to the output size; these values land
    # on our default intrinsics (fx = fy = width, principal point at the centre) after it.
    ours = Intrinsics.default(preset.width_px, preset.height_px)
    release_h, release_w = RELEASE_SIZE
    fx = ours.fx * release_w / preset.width_px
    fy = ours.fy * release_h / preset.height_px
    cx, cy = ours.cx * release_w / preset.width_px, ours.cy * release_h / preset.height_px
    np.save(workdir / "poses.npy", poses)
    np.save(workdir / "intrinsics.npy", np.tile(np.array([[fx, fy, cx, cy]], dtype=np.float32), (len(poses), 1)))
    cells, used_frames = cam_utils.prepare_camera_embedding(
        str(workdir), len(poses), preset.height_px, preset.width_px, spatial_scale=preset.vae.spatial_stride
    )
    assert used_frames == len(poses) and cells.shape[2] == num_latent
    return list(cells.float().split(chunk_frames, dim=2))
