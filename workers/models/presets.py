"""Model presets as data: the shapes of every component, frozen and validated once.

A preset names a DiT, a VAE and a text encoder configuration. The production presets mirror the
public LingBot-World v2 checkpoints (Wan2.2-I2V-A14B base with camera layers). `gridworld`, the
default, uses the same classes with small widths and ships weights trained here on a procedural
town, so the whole stack runs on a CPU; `tiny`, smaller and with random weights, is a test
fixture and says so through `weights_note`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from workers.controls import CAMERA_VOCABULARY, ControlVocabulary


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
class ModelPreset:
    name: str
    dit: DiTConfig
    vae: VAEConfig
    t5: T5Config
    height_px: int
    width_px: int
    chunk_latent_frames: int = 4
    fps: int = 16
    num_train_timesteps: int = 1000
    schedule_kind: ScheduleKind = ScheduleKind.UNIPC
    sample_shift: float = 10.0
    timestep_indices: tuple[int, ...] = (0, 250, 500, 750)
    sigma_rule: SigmaRule = SigmaRule.BY_TIMESTEP
    move_step_per_frame: float = 0.10
    turn_step_deg_per_frame: float = 0.5
    # Camera translations are normalised per chunk (largest = 1) and scaled by this: TeleFuser's
    # real-time rule. The offline release normalises once over a whole clip, which a live session
    # cannot do, since it does not know the path ahead; so here every preset follows the real-time rule.
    translation_scale: float = 3.0
    # The keys and look this family's control adapter turns into model input (GET /v1/model `accepts`).
    controls: ControlVocabulary = CAMERA_VOCABULARY
    weights_note: str = "official checkpoint (load with --checkpoint)"
    tags: tuple[str, ...] = field(default_factory=tuple)
    # Weights that ship inside the package (a directory under workers/models/weights/), loaded when
    # no checkpoint directory is given; None: random weights unless a checkpoint is passed.
    bundled_weights: str | None = None

    def __post_init__(self) -> None:
        cell = self.vae.spatial_stride * self.dit.patch_size[1]
        if self.height_px % cell or self.width_px % cell:
            raise ValueError(f"{self.name}: resolution {self.width_px}x{self.height_px} must be a multiple of {cell}")
        if self.dit.text_dim != self.t5.dim:
            raise ValueError(f"{self.name}: DiT text_dim {self.dit.text_dim} != T5 dim {self.t5.dim}")
        if self.dit.text_len != self.t5.text_len:
            raise ValueError(f"{self.name}: DiT text_len {self.dit.text_len} != T5 text_len {self.t5.text_len}")
        if self.dit.camera_cell_pixels != self.vae.spatial_stride:
            raise ValueError(f"{self.name}: camera cell must equal the VAE spatial stride")
        if self.dit.in_dim != 2 * self.vae.z_dim + self.vae.temporal_stride:
            raise ValueError(f"{self.name}: DiT in_dim must be 2·z_dim + mask channels")
        if self.chunk_latent_frames < 1:
            raise ValueError("chunk_latent_frames must be at least 1")
        local = self.dit.local_attn_size_frames
        if local != -1 and local <= self.chunk_latent_frames + self.dit.sink_size_frames:
            raise ValueError(f"{self.name}: local_attn_size_frames ({local}) must exceed chunk + sink frames")

    @property
    def latent_height(self) -> int:
        return self.height_px // self.vae.spatial_stride

    @property
    def latent_width(self) -> int:
        return self.width_px // self.vae.spatial_stride

    @property
    def tokens_per_latent_frame(self) -> int:
        _, ph, pw = self.dit.patch_size
        return (self.latent_height // ph) * (self.latent_width // pw)


LINGBOT_14B = ModelPreset(
    name="lingbot-world-v2-14b",
    dit=DiTConfig(dim=5120, ffn_dim=13824, num_layers=40, num_heads=40),
    vae=VAEConfig(),
    t5=T5Config(),
    height_px=480,
    width_px=832,
    tags=("gpu",),
)

# Wan 1.3B shape; DiT only, reusing the 14B release's T5 and VAE. Inferred until released.
LINGBOT_1_3B = ModelPreset(
    name="lingbot-world-v2-1.3b",
    dit=DiTConfig(dim=1536, ffn_dim=8960, num_layers=30, num_heads=12),
    vae=VAEConfig(),
    t5=T5Config(),
    height_px=480,
    width_px=832,
    tags=("gpu",),
)

TINY = ModelPreset(
    name="tiny",
    dit=DiTConfig(
        dim=128,
        ffn_dim=256,
        num_layers=4,
        num_heads=4,
        freq_dim=64,
        text_dim=64,
        text_len=32,
        local_attn_size_frames=12,
        sink_size_frames=2,
    ),
    vae=VAEConfig(base_dim=8),
    t5=T5Config(
        vocab_size=259,  # 3 specials (pad, eos, unk) + 256 bytes
        dim=64,
        dim_attn=64,
        dim_ffn=128,
        num_heads=4,
        num_layers=2,
        num_buckets=32,
        text_len=32,
        tokenizer="bytes",
    ),
    height_px=128,
    width_px=128,
    weights_note="random weights (seeded): the output is not a trained world",
    tags=("cpu", "random-weights"),
)

# The embedded default world: the same classes, trained in this repository on the procedural grid
# world (workers/world, workers/training) and shipped in workers/models/weights/gridworld. Its VAE
# latents are normalised inside the weights (the statistics are folded into conv1/conv2 at export),
# hence zero mean and unit std here. Slower walking and faster turning than LingBot's defaults suit
# a small place seen through 128×128 frames.
GRIDWORLD = ModelPreset(
    name="gridworld",
    dit=DiTConfig(
        dim=160,
        ffn_dim=512,
        num_layers=5,
        num_heads=4,
        freq_dim=64,
        text_dim=64,
        text_len=32,
        local_attn_size_frames=12,
        sink_size_frames=2,
    ),
    vae=VAEConfig(base_dim=8, latent_mean=(0.0,) * 16, latent_std=(1.0,) * 16),
    t5=TINY.t5,
    height_px=128,
    width_px=128,
    move_step_per_frame=0.06,
    turn_step_deg_per_frame=1.5,
    # The rule its DiT was trained with (workers/training/dit_train.py noises at the row's σ).
    sigma_rule=SigmaRule.TABLE_ROW,
    weights_note="trained here on a procedural town: blurry, and it follows keys about 19 times in 20",
    tags=("cpu", "embedded"),
    bundled_weights="gridworld",
)

DEFAULT_PRESET = GRIDWORLD.name

PRESETS: dict[str, ModelPreset] = {p.name: p for p in (LINGBOT_14B, LINGBOT_1_3B, GRIDWORLD, TINY)}


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
