"""Matrix-Game's control adapter: the one wire vocabulary (held keys, mouse look; `ChunkControl`)
turned into the per-video-frame keyboard and mouse actions each released variant was trained on
(the keys per variant: `mapping.py`).

Mouse look (pixels summed since the last chunk) is spread evenly over the chunk's video frames at
`LOOK_PER_PX` per pixel per frame, so a 5 px/frame flick turns as fast as a held key; each frame's
pitch and yaw are clamped to ±`MAX_MOUSE` (twice the release's demo value: further out the model
saw little).

`ActionTrack` keeps a session's actions per video frame, only as far back as the next chunk's
action windows reach (12 video frames before its first latent frame), and hands the DiT each
chunk's `ChunkActions`.
"""

from __future__ import annotations

import torch

from workers.chunk_geometry import video_frames
from workers.controls import ChunkControl
from workers.models.matrix_game.actions import ChunkActions
from workers.models.matrix_game.config import MatrixGameConfig
from workers.models.matrix_game.mapping import KEY_MOUSE, ActionMapping

LOOK_PER_PX = KEY_MOUSE / 5.0
MAX_MOUSE = 2 * KEY_MOUSE


def frame_actions(
    mapping: ActionMapping, control: ChunkControl, num_video_frames: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chunk's control held over its video frames -> keyboard [N, K] and mouse [N, 2] (or None)."""
    keyboard = torch.tensor([mapping.keyboard_row(control.keys)] * num_video_frames, dtype=torch.float32)
    if not mapping.mouse:
        return keyboard, None
    pitch, yaw = mapping.key_mouse(control.keys)
    # Screen y grows downwards: dragging up looks up (+pitch).
    pitch -= control.look_dy_px / num_video_frames * LOOK_PER_PX
    yaw += control.look_dx_px / num_video_frames * LOOK_PER_PX
    mouse = torch.tensor([[pitch, yaw]], dtype=torch.float32).clamp(-MAX_MOUSE, MAX_MOUSE)
    return keyboard, mouse.expand(num_video_frames, 2).clone()


class ActionTrack:
    """A session's actions per video frame and the windows each chunk's latent frames read."""

    def __init__(self, cfg: MatrixGameConfig, mapping: ActionMapping) -> None:
        if len(mapping.keyboard) != cfg.keyboard_dim or mapping.mouse != (cfg.mouse_dim is not None):
            raise ValueError("the action mapping does not fit the model's keyboard and mouse inputs")
        self.cfg, self.mapping = cfg, mapping
        self.start_frame = 0  # latent frames handed out so far: the next chunk's first
        self.offset = 0  # video frame index of the history's first row
        self.keyboard = torch.zeros(0, cfg.keyboard_dim)
        self.mouse: torch.Tensor | None = None if cfg.mouse_dim is None else torch.zeros(0, cfg.mouse_dim)

    def next_inputs(self, control: ChunkControl, num_latent_frames: int) -> ChunkActions:
        """Fold the chunk's control in over its video frames and gather its latent frames' windows."""
        first = self.start_frame == 0
        keyboard, mouse = frame_actions(self.mapping, control, video_frames(num_latent_frames, first))
        self.keyboard = torch.cat([self.keyboard, keyboard])
        if self.mouse is not None and mouse is not None:
            self.mouse = torch.cat([self.mouse, mouse])
        # Windows read from 12 video frames before their latent frame: rows earlier than the first
        # window of this chunk are never read again. Dropped in whole latent frames (4 rows), so the
        # windows of the history match those of the whole session.
        cfg = self.cfg
        keep_from = max(0, cfg.frames_per_latent * self.start_frame - cfg.action_window_frames)
        drop = keep_from - self.offset
        if drop > 0:
            self.keyboard = self.keyboard[drop:]
            self.mouse = None if self.mouse is None else self.mouse[drop:]
            self.offset = keep_from
        start = self.start_frame - self.offset // cfg.frames_per_latent
        actions = ChunkActions.gather(
            cfg,
            self.keyboard[None],
            None if self.mouse is None else self.mouse[None],
            start,
            num_latent_frames,
        )
        self.start_frame += num_latent_frames
        return actions

    def reset_pose(self) -> None:
        """Nothing to reset: actions are per frame, not a pose, and the model keeps no frame of reference."""
