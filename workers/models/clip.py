"""The CLIP image encoder Matrix-Game 2.0 conditions on: the visual tower of open-clip
`xlm-roberta-large-vit-huge-14` (ViT-H/14), run to the output of its 31st of 32 blocks, and the
preprocessing of the start image into it. Inference only.

Matrix-Game 2.0 takes this encoder unchanged from Wan2.1's image-to-video model (SkyworkAI/Matrix-Game
`Matrix-Game-2/wan/vae/wanx_vae_src/clip.py`, `CLIPModel.encode_video`; Wan-Video/Wan2.1
`wan/modules/clip.py`, `CLIPModel.visual`): the first frame's 257 tokens × 1280 (class token + 16 × 16
patches), taken before the last block, the final norm and the pooled projection (`use_31_block=True`),
are the DiT's only cross-attention context (workers/models/matrix_game/dit.py `image_kv`).

Weights: the released `models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth` is the state dict of
the whole two-tower CLIP model (`XLMRobertaCLIP`), which the release loads with a strict
`load_state_dict`. It holds
- `visual.*`: this tower, under the names used here, plus weights the taken output never reaches:
  `visual.transformer.31.*` (the 32nd block), `visual.post_norm.{weight,bias}` (the final norm) and
  `visual.head` ([1280, 1024], the pooled projection);
- `textual.*`: the XLM-RoBERTa text tower and its head, and `log_scale` (the logit scale): unused.
The tower builds only the blocks it runs, so the names it holds are exactly the released ones after
`visual.` and `visual_state` turns the released state dict into a strict-loadable one: it strips the
prefix, drops the text tower, the logit scale and the unused visual weights (`unused_visual_keys`),
and refuses any other key. A loader that streams tensors one by one maps each released name through
`tower_name` (None: not read). Build under `torch.device("meta")` and load with `assign=True` to avoid
materialising a random copy first.

The tower (the release's `VisionTransformer` with `pool_type='token'`, `pre_norm=True`,
`post_norm=False`, `activation='gelu'`):
- patch embedding: a 14 × 14 stride-14 convolution without bias (the release drops the bias whenever
  a pre-norm follows: `bias=not pre_norm`);
- a learned class token, prepended, then learned absolute position embeddings for all 257 tokens
  (no interpolation: the input is always 224 × 224);
- a LayerNorm over the embeddings before the first block (`pre_norm`);
- pre-norm residual blocks: x + attn(norm1(x)), then x + mlp(norm2(x)); attention with one fused
  q/k/v projection (biased, laid out [q; k; v], each head-major) and the default 1/sqrt(head_dim)
  scale; MLP Linear(1280, 5120), exact (erf) GELU, Linear(5120, 1280);
- LayerNorm eps 1e-5 everywhere, computed in float32 (the release's `LayerNorm` upcasts).

Precision: Matrix-Game 2.0 runs the tower with bfloat16 weights under bfloat16 autocast (its attention
casts q, k, v to half whatever they are) on a bfloat16 start frame; here the preprocessing is float32,
linears run in the weight dtype, norms in float32, and the output is float32.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from workers.models.attention import AttendFn, attention_fn
from workers.models.attention_backend import AttentionBackend
from workers.models.configs import VIT_H_14, CLIPVisionConfig
from workers.models.dit import LayerNorm, weight_dtype_linear

RELEASE_PREFIX = "visual."  # the tower's weights in the released two-tower file
TEXT_PREFIX = "textual."  # the XLM-RoBERTa text tower, unused
SCALE_KEY = "log_scale"  # the contrastive logit scale, unused


def preprocess(image: torch.Tensor, config: CLIPVisionConfig = VIT_H_14) -> torch.Tensor:
    """Start image(s) [3, H, W] or [B, 3, H, W] in [-1, 1] (workers/images.py `to_model_range`) ->
    the tower's input [B, 3, image_size, image_size], float32.

    As the release does it (`encode_video`, given the start frame as the VAE gets it: cropped and
    resized to the video's 352 × 640, in [-1, 1]): the whole frame is resized to a square, whatever
    its aspect (no crop), by bicubic interpolation with align_corners=False and no antialiasing
    (F.interpolate's defaults there), then mapped to [0, 1] and normalised with CLIP's mean and std.
    Bicubic overshoot past [-1, 1] is kept: the release clamps nothing.
    """
    x = image[None] if image.dim() == 3 else image
    if x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"expected an image [3, H, W] or [B, 3, H, W], got {tuple(image.shape)}")
    size = (config.image_size, config.image_size)
    x = F.interpolate(x.float(), size=size, mode="bicubic", align_corners=False, antialias=False)
    x = x * 0.5 + 0.5  # [-1, 1] -> [0, 1]
    mean = x.new_tensor(config.mean).view(1, 3, 1, 1)
    std = x.new_tensor(config.std).view(1, 3, 1, 1)
    return (x - mean) / std


class CLIPAttention(nn.Module):
    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.to_qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)
        self.attention: AttendFn = attention_fn(AttentionBackend.AUTO)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, dim = x.shape
        qkv = weight_dtype_linear(self.to_qkv, x).view(b, length, 3, self.num_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [B, heads, L, head_dim]
        out = self.attention(q, k, v, None).transpose(1, 2).reshape(b, length, dim)
        return weight_dtype_linear(self.proj, out)


class CLIPBlock(nn.Module):
    """Pre-norm residual block; `mlp` is a Sequential so the released keys are `mlp.0`, `mlp.2`."""

    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        self.norm1 = LayerNorm(config.dim, eps=config.norm_eps)
        self.attn = CLIPAttention(config)
        self.norm2 = LayerNorm(config.dim, eps=config.norm_eps)
        self.mlp = nn.Sequential(
            nn.Linear(config.dim, config.mlp_dim), nn.GELU(), nn.Linear(config.mlp_dim, config.dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        h = self.norm2(x)
        for layer in self.mlp:
            h = weight_dtype_linear(layer, h) if isinstance(layer, nn.Linear) else layer(h)
        return x + h


class CLIPVisionTower(nn.Module):
    """Normalised pixels [B, 3, 224, 224] -> the output of block `output_layer`, [B, 257, 1280] float32."""

    def __init__(self, config: CLIPVisionConfig = VIT_H_14) -> None:
        super().__init__()
        self.config = config
        self.patch_embedding = nn.Conv2d(3, config.dim, config.patch_size, stride=config.patch_size, bias=False)
        # The release's initialisation; a trained checkpoint replaces both.
        scale = config.dim**-0.5
        self.cls_embedding = nn.Parameter(scale * torch.randn(1, 1, config.dim))
        self.pos_embedding = nn.Parameter(scale * torch.randn(1, config.num_tokens, config.dim))
        self.pre_norm = LayerNorm(config.dim, eps=config.norm_eps)
        # Only the blocks whose output is used: the released file's later ones are dropped on loading.
        self.transformer = nn.Sequential(*(CLIPBlock(config) for _ in range(config.output_layer)))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        c = self.config
        expected = (3, c.image_size, c.image_size)
        if tuple(pixels.shape[1:]) != expected:
            raise ValueError(f"expected pixels [B, {', '.join(map(str, expected))}], got {tuple(pixels.shape)}")
        weight = self.patch_embedding.weight
        x = self.patch_embedding(pixels.to(weight.dtype))  # [B, dim, grid, grid]
        x = x.flatten(2).transpose(1, 2)  # [B, grid², dim], row-major patches
        x = torch.cat([self.cls_embedding.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)  # [B, 257, dim]
        x = self.pre_norm(x + self.pos_embedding.to(x.dtype))
        for block in self.transformer:
            x = block(x)
        return x.float()


@functools.cache
def _block_keys() -> tuple[str, ...]:
    with torch.device("meta"):
        return tuple(CLIPBlock(CLIPVisionConfig(dim=8, num_heads=1)).state_dict())


@functools.cache
def unused_visual_keys(config: CLIPVisionConfig = VIT_H_14) -> frozenset[str]:
    """The released visual weights (names after `visual.`) the taken output does not depend on:
    the blocks past `output_layer`, the final norm and the pooled projection."""
    later = {f"transformer.{n}.{key}" for n in range(config.output_layer, config.num_layers) for key in _block_keys()}
    return frozenset(later | {"post_norm.weight", "post_norm.bias", "head"})


def tower_name(released: str, config: CLIPVisionConfig = VIT_H_14) -> str | None:
    """The tower's name for a key of the released file; None for a weight the tower does not hold.
    A key that belongs to neither tower nor the logit scale is refused (not this file)."""
    if released.startswith(RELEASE_PREFIX):
        name = released.removeprefix(RELEASE_PREFIX)
        return None if name in unused_visual_keys(config) else name
    if released.startswith(TEXT_PREFIX) or released == SCALE_KEY:
        return None
    raise ValueError(
        f"{released!r} is not a key of the released CLIP file (every key is under {RELEASE_PREFIX!r} or "
        f"{TEXT_PREFIX!r}, or is {SCALE_KEY!r})"
    )


def visual_state(released: Mapping[str, torch.Tensor], config: CLIPVisionConfig = VIT_H_14) -> dict[str, torch.Tensor]:
    """The released state dict -> the tower's, for `load_state_dict(strict=True)`."""
    state = {}
    for key, tensor in released.items():
        name = tower_name(key, config)
        if name is not None:
            state[name] = tensor
    return state
