"""Which per-video-frame actions each latent frame of a chunk reads.

Actions arrive per video frame. Latent frame L reads the 12 video frames [4L − 12, 4L) (3 latent
frames' worth at the VAE's temporal stride 4); indices before the session's first frame repeat
frame 0's action. So the frames a latent frame reads end just before its own last video frame
(4L), and latent frame 0 reads frame 0's action twelve times. This is the release's rule
(`ActionModule.forward` in Matrix-Game-2/wan/modules/action_module.py: pad 12 copies of frame 0
on the left, then take `[4(i − 3) + 12, 4i + 12)` of the padded sequence for latent frame i).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.models.matrix_game.config import MatrixGameConfig


def action_windows(actions: torch.Tensor, start_frame: int, num_frames: int, cfg: MatrixGameConfig) -> torch.Tensor:
    """actions [B, N, C] of video frames 0..N-1 -> [B, num_frames, 12, C]: latent frame
    start_frame + i reads row i. Needs N ≥ 4·(start_frame + num_frames − 1) video frames (the
    release passes one more, 1 + 4·(last latent frame), which no window reads)."""
    stride, width = cfg.frames_per_latent, cfg.action_window_frames
    last_needed = stride * (start_frame + num_frames - 1) - 1  # the last video frame any window reads
    if actions.shape[1] <= max(last_needed, 0):
        raise ValueError(
            f"latent frames {start_frame}..{start_frame + num_frames - 1} read video frames up to "
            f"{max(last_needed, 0)}; got actions for {actions.shape[1]} frames"
        )
    latent = torch.arange(start_frame, start_frame + num_frames, device=actions.device)
    video = stride * latent[:, None] - width + torch.arange(width, device=actions.device)  # [F, 12]
    return actions[:, video.clamp(min=0)]


@dataclass(frozen=True)
class ChunkActions:
    """A chunk's action windows, shared by its forwards (the sampling steps and the commit)."""

    keyboard: torch.Tensor  # [B, F, 12, keyboard_dim]
    mouse: torch.Tensor | None  # [B, F, 12, mouse_dim]; None for a keyboard-only model

    @classmethod
    def gather(
        cls,
        cfg: MatrixGameConfig,
        keyboard: torch.Tensor,  # [B, N, keyboard_dim] per video frame from the session's first
        mouse: torch.Tensor | None,  # [B, N, mouse_dim] likewise
        start_frame: int,
        num_frames: int,
    ) -> ChunkActions:
        if keyboard.shape[-1] != cfg.keyboard_dim:
            raise ValueError(f"keyboard actions have {keyboard.shape[-1]} keys; the model takes {cfg.keyboard_dim}")
        if (mouse is None) != (cfg.mouse_dim is None):
            raise ValueError("mouse actions must be given exactly when the model has a mouse path")
        if mouse is not None and mouse.shape[-1] != cfg.mouse_dim:
            raise ValueError(f"mouse actions have {mouse.shape[-1]} values; the model takes {cfg.mouse_dim}")
        return cls(
            keyboard=action_windows(keyboard, start_frame, num_frames, cfg),
            mouse=None if mouse is None else action_windows(mouse, start_frame, num_frames, cfg),
        )

    def to(self, device: torch.device) -> ChunkActions:
        return ChunkActions(
            keyboard=self.keyboard.to(device), mouse=None if self.mouse is None else self.mouse.to(device)
        )
