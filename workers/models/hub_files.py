"""Where a released preset's files live on the Hugging Face Hub: repository, pinned revision, and
the exact files a load reads (never a whole repository: the releases hold files no preset reads).

Torch-free data, named by the presets (workers/models/presets.py); workers/models/hub.py resolves
it through the Hugging Face cache. The facts, as published:

- `robbyant/lingbot-world-v2-14b-causal-fast` keeps its DiT (18.5 B parameters in F32, about 74 GB)
  as `transformers/diffusion_pytorch_model.safetensors.index.json` with shards
  `transformers/model-0000k-of-00008.safetensors`, beside `Wan2.1_VAE.pth` (0.5 GB),
  `models_t5_umt5-xxl-enc-bf16.pth` (11.4 GB) and the tokenizer in `google/umt5-xxl/`.
- `robbyant/lingbot-world-v2-1.3b-causal-fast` holds its DiT alone at its root
  (`model.safetensors.index.json` + 6 shards, 1.71 B parameters in F32, 6.84 GB); its VAE, umT5
  and tokenizer are the 14B repository's.
- `Skywork/Matrix-Game-2.0` holds the three distilled DiTs in folders of their own, the VAE and
  the CLIP image encoder (4.8 GB); its `base_model/` (a 3.7 GB non-distilled model) is not read.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9


@dataclass(frozen=True)
class HubFiles:
    """Files of one repository at one commit, relative to the repository's root."""

    repo_id: str
    revision: str  # a commit, so that a later push cannot change what a preset loads
    files: tuple[str, ...]
    approx_bytes: int  # what those files take, for the plan's printout before a download

    def __post_init__(self) -> None:
        if len(self.revision) != 40 or any(c not in "0123456789abcdef" for c in self.revision):
            raise ValueError(f"{self.repo_id}: the revision must be a full commit hash, got {self.revision!r}")
        if not self.files or len(set(self.files)) != len(self.files):
            raise ValueError(f"{self.repo_id}: files must be listed, each once")


@dataclass(frozen=True)
class HubWeights:
    """A preset's weights on the Hub: the repository with its DiT and, for a release that ships
    its DiT alone, the repository its VAE, umT5 and tokenizer come from."""

    dit: HubFiles
    assets: HubFiles | None = None

    @property
    def repos(self) -> tuple[HubFiles, ...]:
        return (self.dit,) if self.assets is None else (self.dit, self.assets)

    @property
    def approx_bytes(self) -> int:
        return sum(r.approx_bytes for r in self.repos)


def shards(prefix: str, stem: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{stem}-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1))


LINGBOT_14B_REPO = "robbyant/lingbot-world-v2-14b-causal-fast"
LINGBOT_14B_REVISION = "5c33dd40b213598c418fd25bff30fdbd23fd38a7"
# What every LingBot-World v2 preset reads besides its DiT, as the 14B repository lays it out.
LINGBOT_ASSET_FILES = ("Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth", "google/umt5-xxl/tokenizer.json")
LINGBOT_ASSET_BYTES = 507_609_880 + 11_361_920_418 + 16_837_417

LINGBOT_14B_HUB = HubWeights(
    HubFiles(
        LINGBOT_14B_REPO,
        LINGBOT_14B_REVISION,
        (
            "transformers/diffusion_pytorch_model.safetensors.index.json",
            *shards("transformers/", "model", 8),
            *LINGBOT_ASSET_FILES,
        ),
        approx_bytes=74_176_000_000 + LINGBOT_ASSET_BYTES,
    )
)

LINGBOT_1_3B_HUB = HubWeights(
    HubFiles(
        "robbyant/lingbot-world-v2-1.3b-causal-fast",
        "7e36a5f919f86cb4255cc9bfc30adb44963fbde1",
        ("model.safetensors.index.json", *shards("", "model", 6)),
        approx_bytes=6_840_000_000,
    ),
    assets=HubFiles(LINGBOT_14B_REPO, LINGBOT_14B_REVISION, LINGBOT_ASSET_FILES, approx_bytes=LINGBOT_ASSET_BYTES),
)

MATRIX_GAME_REPO = "Skywork/Matrix-Game-2.0"
MATRIX_GAME_REVISION = "f1729d99a80e0f07993a77d7dad4a3190e23c2c8"
MATRIX_GAME_SHARED_BYTES = 507_609_880 + 4_772_359_047  # the VAE and the CLIP image encoder


MATRIX_GAME_SHARED_FILES = ("Wan2.1_VAE.pth", "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth")


def matrix_game_hub(dit_file: str, dit_bytes: int) -> HubWeights:
    """A Matrix-Game variant's files: its DiT, and the VAE and CLIP encoder the variants share."""
    files = (dit_file, *MATRIX_GAME_SHARED_FILES)
    return HubWeights(HubFiles(MATRIX_GAME_REPO, MATRIX_GAME_REVISION, files, dit_bytes + MATRIX_GAME_SHARED_BYTES))
