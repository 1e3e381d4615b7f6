"""Model presets as data: the shapes of every component, frozen and validated once.

A preset names its family (workers/families/family.py), a DiT, a VAE and the context encoder's
configuration. The LingBot-World presets mirror the public LingBot-World v2 checkpoints
(Wan2.2-I2V-A14B base with camera layers); the Matrix-Game ones the three released Matrix-Game 2.0
distillations (Wan-1.3B trunk with keyboard and mouse action modules, CLIP image context). `gridworld`, the
default, uses the same classes with small widths and ships weights trained here on a procedural
town, so the whole stack runs on a CPU; `tiny` and `matrix-game-2-tiny`, smaller and with random
weights, are test fixtures and say so through `weights_note`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from workers.controls import CAMERA_VOCABULARY, ControlVocabulary
from workers.models.configs import DiTConfig, Family, ScheduleKind, SigmaRule, T5Config, VAEConfig
from workers.models.hub_files import LINGBOT_1_3B_HUB, LINGBOT_14B_HUB, HubWeights, matrix_game_hub
from workers.models.matrix_game.variants import (
    GTA_VARIANT,
    TEMPLERUN_VARIANT,
    TINY_VARIANT,
    UNIVERSAL_VARIANT,
    MatrixGameVariant,
)


@dataclass(frozen=True)
class ModelPreset:
    name: str
    dit: DiTConfig  # the Wan causal trunk (a Matrix-Game variant's `model.trunk`)
    vae: VAEConfig
    t5: T5Config | None  # the prompt's encoder; None: the family takes no text (Matrix-Game)
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
    weights_note: str = "released weights (the Hugging Face cache, or --checkpoint-dir)"
    tags: tuple[str, ...] = field(default_factory=tuple)
    # Weights that ship inside the package (a directory under workers/models/weights/), loaded when
    # no checkpoint directory is given; None: random weights unless a checkpoint is passed.
    bundled_weights: str | None = None
    # Released weights on the Hugging Face Hub (workers/models/hub_files.py): what `worldrtc fetch`
    # downloads and what a start without --checkpoint-dir resolves through the cache.
    hub: HubWeights | None = None
    # A Matrix-Game preset's variant (action DiT, key mapping, CLIP tower, released files); None for
    # the LingBot-World family. It decides `family`.
    matrix_game: MatrixGameVariant | None = None

    def __post_init__(self) -> None:
        cell = self.vae.spatial_stride * self.dit.patch_size[1]
        if self.height_px % cell or self.width_px % cell:
            raise ValueError(f"{self.name}: resolution {self.width_px}x{self.height_px} must be a multiple of {cell}")
        if self.matrix_game is not None:
            if self.t5 is not None:
                raise ValueError(f"{self.name}: Matrix-Game takes no text encoder")
            if self.dit != self.matrix_game.model.trunk:
                raise ValueError(f"{self.name}: dit must be the variant's trunk (matrix_game.model.trunk)")
            if self.controls != self.matrix_game.mapping.vocabulary:
                raise ValueError(f"{self.name}: controls must be the variant mapping's vocabulary")
        else:
            if self.t5 is None:
                raise ValueError(f"{self.name}: the LingBot-World family needs a text encoder (t5)")
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
    def family(self) -> Family:
        return Family.LINGBOT_WORLD if self.matrix_game is None else Family.MATRIX_GAME

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
    hub=LINGBOT_14B_HUB,
)

# Wan 1.3B shape; DiT only, reusing the 14B release's T5 and VAE.
LINGBOT_1_3B = ModelPreset(
    name="lingbot-world-v2-1.3b",
    dit=DiTConfig(dim=1536, ffn_dim=8960, num_layers=30, num_heads=12),
    vae=VAEConfig(),
    t5=T5Config(),
    height_px=480,
    width_px=832,
    tags=("gpu",),
    hub=LINGBOT_1_3B_HUB,
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


# The sharper embedded world: the same DiT trunk over a VAE that compresses 4× in space instead of 8×
# (32×32×16 latents for 128×128 frames), patchified 4×4 instead of 2×2, so the DiT still sees 8×8
# tokens per frame and costs what gridworld's does. Its decoder's full-resolution stage runs frame by
# frame, which is what makes it faster live (docs/embedded-world.md). Trained
# with `python -m workers.training --preset gridworld-4x`, which resumes from the state kept in the
# repository; its shipped weights lose to gridworld's on world_eval, so gridworld stays the default.
GRIDWORLD_4X = replace(
    GRIDWORLD,
    name="gridworld-4x",
    dit=replace(GRIDWORLD.dit, patch_size=(1, 4, 4), camera_cell_pixels=4),
    # decoder_full_res_kernel_t 1: a third of the decoder's dominant cost; the decoder phase tunes
    # those kernels from the 3-frame ones (workers/training/decoder_tune.py).
    vae=replace(GRIDWORLD.vae, dim_mult=(1, 2, 4), temporal_downsample=(True, True), decoder_full_res_kernel_t=1),
    weights_note="trained here like gridworld, with a sharper VAE; its frames are noisier and it follows "
    "keys about 9 times in 10 (docs/embedded-world.md)",
    tags=("cpu", "embedded"),
    bundled_weights="gridworld-4x",
)


# The responsive embedded world: gridworld's latent space and DiT trunk, fine-tuned to chunks of one latent
# frame (4 video frames, 0.25 s; the first chunk is the start image alone), so a key press waits a
# quarter of the time for the next sample of the controls. Its first-chunk training steps span the
# first 4 latent frames (4 of its chunks), as gridworld's span its first chunk. Trained with
# `python -m workers.training --preset gridworld-responsive` (docs/embedded-world.md).
GRIDWORLD_RESPONSIVE = replace(
    GRIDWORLD,
    name="gridworld-responsive",
    chunk_latent_frames=1,
    # Its decoder's full-resolution stage runs frame by frame (tuned from gridworld's 3-frame one by
    # the decoder phase): a quarter off each latent frame's decode, which two viewers' decodes need
    # to fit one worker thread, and a sooner first frame.
    vae=replace(GRIDWORLD.vae, decoder_full_res_kernel_t=1),
    weights_note="gridworld fine-tuned to chunks of 0.25 s: a key press shows sooner (docs/embedded-world.md)",
    tags=("cpu", "embedded"),
    bundled_weights="gridworld-responsive",
)


def _matrix_game(
    name: str, variant: MatrixGameVariant, steps: tuple[int, ...], dit_bytes: int = 0, **kw: object
) -> ModelPreset:
    """A Matrix-Game 2.0 preset: 352 × 640 at 25 FPS, 3-latent-frame chunks (9 video frames first,
    then 12 = 0.48 s), the window of its variant and no sink; Self-Forcing sampling at shift 5 on the
    release's steps, written as t in 1000…0 (row 1000 − t of the table, workers/models/sampler.py)."""
    model = variant.model
    fields: dict[str, object] = {
        "vae": VAEConfig(),
        "height_px": 352,
        "width_px": 640,
        "weights_note": "released Matrix-Game 2.0 weights (the Hugging Face cache, or --checkpoint-dir)",
        "tags": ("gpu",),
        "hub": matrix_game_hub(variant.dit_file, dit_bytes),
    } | kw
    return ModelPreset(
        name=name,
        dit=model.trunk,
        t5=None,
        chunk_latent_frames=model.chunk_frames,
        fps=25,
        schedule_kind=ScheduleKind.SELF_FORCING,
        sample_shift=5.0,
        timestep_indices=tuple(1000 - t for t in steps),
        sigma_rule=SigmaRule.TABLE_ROW,  # every Self-Forcing timestep is distinct: the row is the released σ
        controls=variant.mapping.vocabulary,
        matrix_game=variant,
        **fields,  # type: ignore[arg-type]
    )


MATRIX_GAME_UNIVERSAL = _matrix_game("matrix-game-2-universal", UNIVERSAL_VARIANT, (1000, 666, 333), 6_480_000_000)
MATRIX_GAME_GTA = _matrix_game("matrix-game-2-gta", GTA_VARIANT, (1000, 666, 333), 6_480_000_000)
MATRIX_GAME_TEMPLERUN = _matrix_game("matrix-game-2-templerun", TEMPLERUN_VARIANT, (1000, 750, 500, 250), 6_030_000_000)
# The fixture: Matrix-Game's structure with random weights and a small VAE at a quarter of the
# release's area (176 × 320), so the whole stack runs through the real server on a CPU in tests.
MATRIX_GAME_TINY = _matrix_game(
    "matrix-game-2-tiny",
    TINY_VARIANT,
    (1000, 666, 333),
    vae=VAEConfig(base_dim=8),
    height_px=176,
    width_px=320,
    weights_note="random weights (seeded): the output is not a trained world",
    tags=("cpu", "random-weights"),
    hub=None,
)

DEFAULT_PRESET = GRIDWORLD.name

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        LINGBOT_14B,
        LINGBOT_1_3B,
        GRIDWORLD,
        GRIDWORLD_4X,
        GRIDWORLD_RESPONSIVE,
        TINY,
        MATRIX_GAME_UNIVERSAL,
        MATRIX_GAME_GTA,
        MATRIX_GAME_TEMPLERUN,
        MATRIX_GAME_TINY,
    )
}


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
