"""The shapes of the model components every family builds from, and the names of the families.

Frozen and validated once; presets (workers/models/presets.py) combine them. The Wan causal trunk
(`DiTConfig`) and the Wan2.1 VAE (`VAEConfig`) are shared by every family here; umT5 (`T5Config`)
conditions the text-driven ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Family(StrEnum):
    """Which model family builds and runs a preset (workers/families/family.py: what a family gives)."""

    LINGBOT_WORLD = "lingbot-world"  # Wan DiT with camera (Plücker) control, umT5 text and image condition
    MATRIX_GAME = "matrix-game"  # Wan DiT with keyboard and mouse action modules, CLIP image context


class ScheduleKind(StrEnum):
    """Which 1000-row flow table a preset's sampling steps index (workers/models/sampler.py)."""

    UNIPC = "unipc"  # LingBot-World v2: sigmas 0.999…0 shifted, integer timesteps
    SELF_FORCING = "self_forcing"  # Self-Forcing distillations (Matrix-Game 2.0): sigmas 1…0 shifted, float timesteps


class SigmaRule(StrEnum):
    """Which σ a sampling step uses (workers/models/sampler.py says how they differ)."""

    TABLE_ROW = "table_row"  # σ of the sampled table row, for x0 and re-noising alike
    BY_TIMESTEP = "by_timestep"  # σ looked up by integer timestep, as the released scheduler does


@dataclass(frozen=True)
class DiTConfig:
    dim: int
    ffn_dim: int
    num_layers: int
    num_heads: int
    in_dim: int = 36  # noise 16 + mask 4 + image-condition latent 16
    out_dim: int = 16
    freq_dim: int = 256
    text_dim: int = 4096
    text_len: int = 512
    patch_size: tuple[int, int, int] = (1, 2, 2)
    eps: float = 1e-6
    cross_attn_norm: bool = True
    camera_channels: int = 6  # Plücker [origin(3), direction(3)]
    camera_cell_pixels: int = 8  # pixels per latent cell along each axis (the VAE's spatial stride)
    local_attn_size_frames: int = 18  # rolling self-attention window in latent frames; -1 = global
    sink_size_frames: int = 6  # first frames of a session that are never evicted

    def __post_init__(self) -> None:
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} must be divisible by num_heads {self.num_heads}")
        head_dim = self.dim // self.num_heads
        if head_dim % 2 or head_dim < 6:
            raise ValueError(f"head dim {head_dim} must be even and at least 6 for 3D RoPE")
        if self.local_attn_size_frames != -1 and self.sink_size_frames >= self.local_attn_size_frames:
            raise ValueError(
                f"sink_size_frames ({self.sink_size_frames}) must be smaller than "
                f"local_attn_size_frames ({self.local_attn_size_frames})"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def camera_in_features(self) -> int:
        """Plücker channels regrouped per latent cell, then per 1×2×2 patch: 6·64·4 = 1536."""
        pt, ph, pw = self.patch_size
        return self.camera_channels * self.camera_cell_pixels**2 * pt * ph * pw


@dataclass(frozen=True)
class VAEConfig:
    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_downsample: tuple[bool, ...] = (False, True, True)
    # Temporal kernel of the decoder's last (full-resolution) stage and head convs. Wan's is 3; 1
    # makes that stage per-frame (time is already mixed at the coarser stages), a third of the
    # decoder's dominant cost and no stream history to keep there.
    decoder_full_res_kernel_t: int = 3
    # Per-channel latent statistics: latents are stored as (mu - mean) / std.
    latent_mean: tuple[float, ...] = (
        -0.7571,
        -0.7089,
        -0.9113,
        0.1075,
        -0.1745,
        0.9653,
        -0.1517,
        1.5508,
        0.4134,
        -0.0715,
        0.5517,
        -0.3632,
        -0.1922,
        -0.9497,
        0.2503,
        -0.2921,
    )
    latent_std: tuple[float, ...] = (
        2.8184,
        1.4541,
        2.3275,
        2.6558,
        1.2196,
        1.7708,
        2.6052,
        2.0743,
        3.2687,
        2.1526,
        2.8652,
        1.5579,
        1.6382,
        1.1253,
        2.8251,
        1.9160,
    )

    def __post_init__(self) -> None:
        if len(self.latent_mean) != self.z_dim or len(self.latent_std) != self.z_dim:
            raise ValueError(f"latent_mean/latent_std need {self.z_dim} entries each")
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError("temporal_downsample needs one entry per downsampling stage")
        if self.decoder_full_res_kernel_t not in (1, 3):
            raise ValueError(f"decoder_full_res_kernel_t must be 1 or 3, got {self.decoder_full_res_kernel_t}")

    @property
    def spatial_stride(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def temporal_stride(self) -> int:
        return 2 ** sum(self.temporal_downsample)


@dataclass(frozen=True)
class T5Config:
    vocab_size: int = 256384
    dim: int = 4096
    dim_attn: int = 4096
    dim_ffn: int = 10240
    num_heads: int = 64
    num_layers: int = 24
    num_buckets: int = 32
    text_len: int = 512
    # "umt5" loads `google/umt5-xxl/tokenizer.json` from the checkpoint directory; "bytes" is a
    # built-in UTF-8 byte tokenizer for small presets that ship no tokenizer file.
    tokenizer: str = "umt5"

    def __post_init__(self) -> None:
        if self.dim_attn % self.num_heads:
            raise ValueError(f"dim_attn {self.dim_attn} must be divisible by num_heads {self.num_heads}")
        if self.tokenizer not in ("umt5", "bytes"):
            raise ValueError(f"tokenizer must be 'umt5' or 'bytes', got {self.tokenizer!r}")


@dataclass(frozen=True)
class CLIPVisionConfig:
    """ViT-H/14's visual tower as released (`clip_xlm_roberta_vit_h_14`: `vision_*` settings). The
    structure the module docstring lists (class token, pre-norm, no patch bias, exact GELU, fused
    q/k/v) is fixed; these are its sizes, and how deep the taken output lies."""

    image_size: int = 224
    patch_size: int = 14
    dim: int = 1280
    num_heads: int = 16
    mlp_ratio: int = 4
    num_layers: int = 32  # blocks in the released tower, all of them stored
    output_layer: int = 31  # blocks run; the last one's output is the result (`use_31_block`)
    embed_dim: int = 1024  # width of the pooled projection `visual.head`, stored but unused
    norm_eps: float = 1e-5
    # OpenAI CLIP's normalisation, which the release applies (`_clip`: any non-SigLIP name).
    mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} must be a multiple of patch_size {self.patch_size}")
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} must be a multiple of num_heads {self.num_heads}")
        if not 1 <= self.output_layer <= self.num_layers:
            raise ValueError(f"output_layer {self.output_layer} must lie in 1..{self.num_layers}")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        return self.grid * self.grid + 1  # the class token first

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def mlp_dim(self) -> int:
        return self.dim * self.mlp_ratio


VIT_H_14 = CLIPVisionConfig()
