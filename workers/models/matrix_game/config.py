"""Matrix-Game 2.0's DiT shapes and its three released distilled variants.

Every value below is read from the release (SkyworkAI/Matrix-Game, `Matrix-Game-2/configs/`):
`distilled_model/{universal,gta_drive,templerun}/config.json` for the DiT and its `action_config`,
`inference_yaml/*.yaml` for the 3-frame chunk. The trunk is Wan2.1-1.3B's (dim 1536, 30 layers,
12 heads of 128, FFN 8960, q/k RMSNorm, affine cross-attention norm) in its I2V form: 36 input
channels (noise 16 + mask 4 + image latent 16) and the first frame's 257 CLIP tokens of width 1280
as the only cross-attention context (no text).

Actions are per video frame; the action module sits in blocks 0..14 and attends with 16 heads of
64 over a window of 3 latent frames' worth of video frames (12), each latent frame offset by 4
video frames (the VAE's temporal stride).
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.models.configs import DiTConfig


@dataclass(frozen=True)
class MatrixGameConfig:
    keyboard_dim: int  # keys per video frame: universal 4 [W, S, A, D], GTA 2 [W, S], Temple Run 7 (one-hot)
    mouse_dim: int | None  # [pitch, yaw] per video frame; None: no mouse path (Temple Run)
    local_attn_size_frames: int  # rolling window in latent frames, for self-attention and both action caches
    dim: int = 1536
    ffn_dim: int = 8960
    num_layers: int = 30
    num_heads: int = 12
    in_dim: int = 36  # noise 16 + mask 4 + image-condition latent 16
    out_dim: int = 16
    freq_dim: int = 256
    patch_size: tuple[int, int, int] = (1, 2, 2)
    eps: float = 1e-6
    image_dim: int = 1280  # CLIP ViT-H/14 token width
    image_tokens: int = 257  # 1 class token + 16 × 16 patches of the 224 × 224 first frame
    action_blocks: int = 15  # blocks 0..action_blocks-1 carry an action module
    action_heads: int = 16
    action_head_dim: int = 64  # mouse and keyboard attention alike (hidden 1024 each)
    keyboard_embed_dim: int = 128  # per-video-frame keyboard embedding ("hidden_size")
    action_rope_time_dim: int = 8  # channels of each action head rotated by the latent frame index
    action_rope_theta: float = 256.0
    frames_per_latent: int = 4  # video frames per latent frame ("vae_time_compression_ratio")
    action_window_latents: int = 3  # latent frames' worth of video frames each latent frame reads ("windows_size")
    chunk_frames: int = 3  # latent frames denoised together ("num_frame_per_block")
    sink_size_frames: int = 0  # the release keeps no sink frames

    def __post_init__(self) -> None:
        if not 0 <= self.action_blocks <= self.num_layers:
            raise ValueError(f"action_blocks {self.action_blocks} must lie in 0..{self.num_layers}")
        if self.action_rope_time_dim % 2 or not 0 < self.action_rope_time_dim <= self.action_head_dim:
            raise ValueError(
                f"action_rope_time_dim {self.action_rope_time_dim} must be even and at most {self.action_head_dim}"
            )
        if self.local_attn_size_frames < self.chunk_frames + self.sink_size_frames + 1:
            raise ValueError(
                f"window of {self.local_attn_size_frames} frames cannot hold a {self.chunk_frames}-frame chunk, "
                f"{self.sink_size_frames} sink frames and any history"
            )
        _ = self.trunk  # validates the trunk's shapes (head dim, RoPE split)

    @property
    def trunk(self) -> DiTConfig:
        """The Wan trunk's shapes in the form the building blocks shared with LingBot's DiT take
        (`workers/models/dit.py`); its text and camera fields play no part here."""
        return DiTConfig(
            dim=self.dim,
            ffn_dim=self.ffn_dim,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            in_dim=self.in_dim,
            out_dim=self.out_dim,
            freq_dim=self.freq_dim,
            patch_size=self.patch_size,
            eps=self.eps,
            cross_attn_norm=True,
            local_attn_size_frames=self.local_attn_size_frames,
            sink_size_frames=self.sink_size_frames,
        )

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def action_hidden_dim(self) -> int:
        return self.action_heads * self.action_head_dim

    @property
    def action_window_frames(self) -> int:
        """Video frames each latent frame's action window holds (12)."""
        return self.frames_per_latent * self.action_window_latents


# `base_distilled_model`: keyboard [W, S, A, D] multi-hot, mouse [pitch, yaw]; window 6.
UNIVERSAL = MatrixGameConfig(keyboard_dim=4, mouse_dim=2, local_attn_size_frames=6)
# `gta_distilled_model`: keyboard [W, S], mouse [pitch, yaw] (the release drives yaw only); window 4.
GTA_DRIVE = MatrixGameConfig(keyboard_dim=2, mouse_dim=2, local_attn_size_frames=4)
# `templerun_distilled_model`: 7 one-hot actions [none, jump, slide, turn left, turn right, left, right]; no mouse.
TEMPLERUN = MatrixGameConfig(keyboard_dim=7, mouse_dim=None, local_attn_size_frames=6)
