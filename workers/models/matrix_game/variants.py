"""A Matrix-Game 2.0 variant as a preset names it: the DiT's shapes, the keys that drive it, the
CLIP tower it conditions on, and where its released files lie.

The release (Hugging Face `Skywork/Matrix-Game-2.0`) is one directory:
    Wan2.1_VAE.pth                                                  (the VAE, shared by the variants)
    models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth         (the CLIP image encoder)
    base_distilled_model/base_distill.safetensors                   (universal)
    gta_distilled_model/gta_keyboard2dim.safetensors                (GTA drive)
    templerun_distilled_model/templerun_7dim_onlykey.safetensors    (Temple Run)
each DiT file under the training wrapper's `model.` prefix, beside a `config.json` of its shapes.
Torch-free, so presets and the command lines that only read them stay light.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.models.configs import VIT_H_14, CLIPVisionConfig
from workers.models.matrix_game.config import GTA_DRIVE, TEMPLERUN, UNIVERSAL, MatrixGameConfig
from workers.models.matrix_game.mapping import GTA_MAPPING, TEMPLERUN_MAPPING, UNIVERSAL_MAPPING, ActionMapping

CLIP_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"


@dataclass(frozen=True)
class MatrixGameVariant:
    model: MatrixGameConfig
    mapping: ActionMapping
    dit_file: str  # relative to the checkpoint directory
    clip: CLIPVisionConfig = VIT_H_14

    def __post_init__(self) -> None:
        if len(self.mapping.keyboard) != self.model.keyboard_dim:
            raise ValueError(
                f"{self.dit_file}: the mapping names {len(self.mapping.keyboard)} keyboard channels; "
                f"the model takes {self.model.keyboard_dim}"
            )
        if self.mapping.mouse != (self.model.mouse_dim is not None):
            raise ValueError(f"{self.dit_file}: the mapping and the model disagree on the mouse")
        if self.clip.dim != self.model.image_dim or self.clip.num_tokens != self.model.image_tokens:
            raise ValueError(
                f"{self.dit_file}: CLIP gives {self.clip.num_tokens} tokens × {self.clip.dim}; the DiT takes "
                f"{self.model.image_tokens} × {self.model.image_dim}"
            )


UNIVERSAL_VARIANT = MatrixGameVariant(UNIVERSAL, UNIVERSAL_MAPPING, "base_distilled_model/base_distill.safetensors")
GTA_VARIANT = MatrixGameVariant(GTA_DRIVE, GTA_MAPPING, "gta_distilled_model/gta_keyboard2dim.safetensors")
TEMPLERUN_VARIANT = MatrixGameVariant(
    TEMPLERUN, TEMPLERUN_MAPPING, "templerun_distilled_model/templerun_7dim_onlykey.safetensors"
)

# The test fixture: the universal variant's structure (action modules in the first blocks, both
# action caches, a CLIP tower run to its second-to-last block) at widths a CPU runs in seconds.
_TINY_CLIP = CLIPVisionConfig(
    image_size=56, patch_size=14, dim=64, num_heads=4, num_layers=3, output_layer=2, embed_dim=32
)
TINY_VARIANT = MatrixGameVariant(
    MatrixGameConfig(
        keyboard_dim=4,
        mouse_dim=2,
        local_attn_size_frames=6,
        dim=128,
        ffn_dim=256,
        num_layers=4,
        num_heads=4,
        freq_dim=64,
        image_dim=_TINY_CLIP.dim,
        image_tokens=_TINY_CLIP.num_tokens,
        action_blocks=2,
        action_heads=4,
        action_head_dim=16,
        keyboard_embed_dim=32,
    ),
    UNIVERSAL_MAPPING,
    "tiny_model/tiny.safetensors",
    clip=_TINY_CLIP,
)
