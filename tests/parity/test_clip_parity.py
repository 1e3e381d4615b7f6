"""CLIP image encoder parity, float32, identical weights: our start-image preprocessing and visual
tower (workers/models/clip.py) against transformers' `CLIPVisionModel`, against FastVideo 0.2.1's
Matrix-Game 2.0 image-encoding stage with its own `CLIPVisionModel` (start image to tokens), and the
preprocessing against a transcription of the interpolation the release calls.

The tower is narrow and shallow (dim 64, 4 heads, 4 blocks) with the released input geometry (224 px
in patches of 14: 257 tokens) and structure: class token, pre-norm, bias-free patch convolution,
exact GELU, output of the second-to-last block. The weights are transformers' random initialisation
with the norms, biases and embeddings spread so that each of them matters (a q/k/v bias in the wrong
third would show).

Weights reach our side as the released file holds them: transformers' names are mapped to the
release's `visual.*` layout (`_released_from_transformers`: the q, k and v projections concatenate
into `to_qkv` in that order, the class and position embeddings gain leading axes), a text tower, a
logit scale and a pooled projection are added beside them, and `visual_state` keeps what the tower
holds (dropping the fourth block, the final norm, the projection and the text side) for a strict
load. FastVideo takes transformers' names through its own `load_weights`, which fuses q/k/v itself.

Which output: transformers' `hidden_states` has num_layers + 1 entries, [0] the embeddings after
the pre-norm and [n] the output of block n; the release takes the output of block 31 of 32
(`use_31_block`), so ours is `hidden_states[output_layer]` (for ViT-H/14 `hidden_states[31]`, i.e.
`hidden_states[-2]`), before the final norm, which only the pooled output sees. FastVideo builds
only the first 31 blocks (`num_hidden_layers_override`) and no final norm (`require_post_norm=False`
in its Matrix-Game 2.0 pipeline's `WAN2_1ControlCLIPVisionConfig`), so its `last_hidden_state` is
that same tensor.

What FastVideo is run with, and nothing else changed:
- Its `LocalAttention` picks a kernel by platform and FastVideo's CPU platform names none, so the
  layer is replaced where the module looks it up by a float32 SDPA over the same [B, L, heads,
  head_dim] tensors with the scale it is given (None: SDPA's default 1/sqrt(head_dim), as
  `LocalAttention` fills in). Its tensor-parallel queries answer one rank (its single-GPU path), so
  no torch.distributed group is started.
- `MatrixGame2ImageEncodingStage.forward` is compiled from the shipped file (the pipeline modules
  need torchvision) and run with a stand-in for the stage (its encoder, and its CLIP_MEAN / CLIP_STD
  read from the same file), for the batch (the start image, on the stage's tensor path: [1, 3, H, W]
  in [-1, 1]) and for the arguments (no CPU offload); on CPU.

Preprocessing: the release resizes the [-1, 1] frame straight to 224 × 224 (no crop) with
`F.interpolate(mode='bicubic', align_corners=False)`, no antialiasing, maps it to [0, 1] and
normalises; FastVideo's stage does the same with the same call, so that comparison checks the
operations, their order and the constants, not the interpolation. The interpolation is checked
against a NumPy transcription of what PyTorch documents for the call (Keys' cubic convolution with
a = -0.75, pixel centres at half-integers, edge pixels repeated), followed by transformers' own CLIP
normalisation (`CLIPImageProcessorPil` with resizing, cropping and rescaling off: its processors
resize with PIL or torchvision, antialiased). The frame is 352 × 640 noise, the size Matrix-Game 2.0
feeds it.

Negative controls: our tower run one block deeper (all 4), against the same reference; the resize
with antialiasing on.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.parity.compare import assert_agrees, measure
from tests.parity.references import SITE, Float32LocalAttention, fastvideo_method, fastvideo_module, reference_module
from workers.images import to_model_range
from workers.models.clip import VIT_H_14, CLIPVisionConfig, CLIPVisionTower, preprocess, visual_state

pytestmark = pytest.mark.parity

# The released input geometry (224 px in patches of 14: 257 tokens), a narrow and shallow tower.
SMALL = CLIPVisionConfig(dim=64, num_heads=4, mlp_ratio=4, num_layers=4, output_layer=3, embed_dim=48)


def _hf_config(config: CLIPVisionConfig, attention: str) -> Any:
    transformers = reference_module("transformers")
    return transformers.CLIPVisionConfig(
        hidden_size=config.dim,
        intermediate_size=config.mlp_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        image_size=config.image_size,
        patch_size=config.patch_size,
        hidden_act="gelu",  # exact GELU, as the release's ViT-H/14 (`activation='gelu'`)
        layer_norm_eps=config.norm_eps,
        attn_implementation=attention,
    )


def _transformers_tower(config: CLIPVisionConfig, attention: str, seed: int) -> nn.Module:
    transformers = reference_module("transformers")
    torch.manual_seed(seed)
    model = transformers.CLIPVisionModel(_hf_config(config, attention)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name or "layrnorm" in name:
                if name.endswith("weight"):
                    param.uniform_(0.5, 1.5)
                else:
                    param.normal_(0.0, 0.2)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif "class_embedding" in name or "position_embedding" in name:
                param.normal_(0.0, 0.5)
    return model


# transformers' names (in memory; its files add `vision_model.` in front) -> the release's, after
# `visual.`; q/k/v and the two embeddings are handled in `_released_from_transformers`.
_RENAMES = [
    (r"embeddings\.patch_embedding\.weight", "patch_embedding.weight"),
    (r"pre_layrnorm\.(weight|bias)", r"pre_norm.\1"),
    (r"post_layernorm\.(weight|bias)", r"post_norm.\1"),
    (r"encoder\.layers\.(\d+)\.layer_norm1\.(weight|bias)", r"transformer.\1.norm1.\2"),
    (r"encoder\.layers\.(\d+)\.layer_norm2\.(weight|bias)", r"transformer.\1.norm2.\2"),
    (r"encoder\.layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)", r"transformer.\1.attn.proj.\2"),
    (r"encoder\.layers\.(\d+)\.mlp\.fc1\.(weight|bias)", r"transformer.\1.mlp.0.\2"),
    (r"encoder\.layers\.(\d+)\.mlp\.fc2\.(weight|bias)", r"transformer.\1.mlp.2.\2"),
]
_QKV = re.compile(r"encoder\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.(weight|bias)")


def _released_from_transformers(hf: dict[str, torch.Tensor], config: CLIPVisionConfig) -> dict[str, torch.Tensor]:
    """transformers' `CLIPVisionModel` state -> a state dict laid out as the released two-tower file."""
    visual: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for stored, tensor in hf.items():
        name = stored.removeprefix("vision_model.")
        if name == "embeddings.class_embedding":
            visual["cls_embedding"] = tensor.view(1, 1, -1)  # [dim] -> [1, 1, dim]
        elif name == "embeddings.position_embedding.weight":
            visual["pos_embedding"] = tensor.unsqueeze(0)  # [tokens, dim] -> [1, tokens, dim]
        elif (match := _QKV.fullmatch(name)) is not None:
            block, which, param = match.groups()
            qkv.setdefault((block, param), {})[which] = tensor
        else:
            for pattern, native in _RENAMES:
                if (renamed := re.fullmatch(pattern, name)) is not None:
                    visual[renamed.expand(native)] = tensor
                    break
            else:
                raise AssertionError(f"no rule for transformers' {stored!r}")
    for (block, param), parts in qkv.items():
        visual[f"transformer.{block}.attn.to_qkv.{param}"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    # The rest of the released file, which the tower must leave: the pooled projection, a text tower
    # and the logit scale.
    released = {f"visual.{k}": v for k, v in visual.items()}
    released["visual.head"] = torch.randn(config.dim, config.embed_dim)
    released["textual.token_embedding.weight"] = torch.randn(11, 8)
    released["textual.head.0.weight"] = torch.randn(8, 8)
    released["log_scale"] = torch.tensor(4.6052)
    return released


def _ours(released: dict[str, torch.Tensor], config: CLIPVisionConfig) -> CLIPVisionTower:
    with torch.device("meta"):
        tower = CLIPVisionTower(config)
    tower.load_state_dict(visual_state(released, config), strict=True, assign=True)
    return tower.eval()


def _pixels(config: CLIPVisionConfig) -> torch.Tensor:
    """Two non-square start images in [-1, 1] through our preprocessing: [2, 3, size, size]."""
    gen = torch.Generator().manual_seed(5)
    images = torch.rand(2, 3, 176, 320, generator=gen) * 2 - 1
    return preprocess(images, config)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_tower_agrees_with_transformers_hidden_state_of_block_31(attention: str) -> None:
    reference = _transformers_tower(SMALL, attention, seed=1)
    ours = _ours(_released_from_transformers(reference.state_dict(), SMALL), SMALL)
    pixels = _pixels(SMALL)
    with torch.no_grad():
        hidden = reference(pixel_values=pixels, output_hidden_states=True).hidden_states
        tokens = ours(pixels)
    assert len(hidden) == SMALL.num_layers + 1
    assert tokens.shape == (2, SMALL.num_tokens, SMALL.dim) and tokens.dtype == torch.float32
    assert_agrees(
        f"clip tower vs transformers CLIPVisionModel hidden_states[{SMALL.output_layer}] ({attention})",
        tokens,
        hidden[SMALL.output_layer],
    )


def test_tower_one_block_deeper_differs() -> None:
    """Negative control: the output of the last block (all of them run) instead of the one before."""
    reference = _transformers_tower(SMALL, "eager", seed=1)
    released = _released_from_transformers(reference.state_dict(), SMALL)
    deeper = replace(SMALL, output_layer=SMALL.num_layers)
    pixels = _pixels(SMALL)
    with torch.no_grad():
        hidden = reference(pixel_values=pixels, output_hidden_states=True).hidden_states
        tokens = _ours(released, deeper)(pixels)
    result = measure(
        "clip tower, last block instead of block 31 (negative control)", tokens, hidden[SMALL.output_layer]
    )
    print(result)
    assert not result.holds, "taking the last block must not pass for the second-to-last"


@pytest.fixture
def fastvideo_clip(monkeypatch: pytest.MonkeyPatch) -> Any:
    module = fastvideo_module("models.encoders.clip")
    linear = fastvideo_module("layers.linear")
    monkeypatch.setattr(module, "LocalAttention", Float32LocalAttention)
    for owner in (module, linear):
        monkeypatch.setattr(owner, "get_tp_world_size", lambda: 1)
    monkeypatch.setattr(linear, "get_tp_rank", lambda: 0)
    return module


def _fastvideo_tower(module: Any, hf: dict[str, torch.Tensor]) -> nn.Module:
    """FastVideo's CLIPVisionModel in its Matrix-Game 2.0 pipeline's config, with the small tower's
    depth less one, loaded through its own `load_weights` from transformers' names as stored on disk
    (it skips the later block and the final norm itself)."""
    configs = fastvideo_module("configs.models.encoders.clip")
    arch = configs.CLIPVisionArchConfig(
        hidden_size=SMALL.dim,
        intermediate_size=SMALL.mlp_dim,
        num_hidden_layers=SMALL.num_layers,
        num_attention_heads=SMALL.num_heads,
        image_size=SMALL.image_size,
        patch_size=SMALL.patch_size,
        hidden_act="gelu",
        layer_norm_eps=SMALL.norm_eps,
    )
    config = configs.WAN2_1ControlCLIPVisionConfig(arch_config=arch, num_hidden_layers_override=SMALL.output_layer)
    tower: nn.Module = module.CLIPVisionModel(config).eval()
    assert len(tower.vision_model.encoder.layers) == SMALL.output_layer
    assert tower.vision_model.post_layernorm is None
    loaded = tower.load_weights((f"vision_model.{k}", v) for k, v in hf.items())
    assert loaded == set(dict(tower.named_parameters())), "every FastVideo parameter set from the file"
    return tower


class _Recording(nn.Module):
    """The stage's image encoder: FastVideo's tower, keeping the pixels the stage hands it."""

    def __init__(self, tower: nn.Module) -> None:
        super().__init__()
        self.tower = tower
        self.pixels: list[torch.Tensor] = []

    def forward(self, pixel_values: torch.Tensor) -> Any:
        self.pixels.append(pixel_values)
        return self.tower(pixel_values)


_STAGE_FILE = "pipelines/stages/image_encoding.py"
_STAGE = "MatrixGame2ImageEncodingStage"


def _stage_constants() -> dict[str, Any]:
    """The stage class's own attributes (CLIP_MEAN, CLIP_STD), read from its shipped source."""
    tree = ast.parse((SITE / "fastvideo" / _STAGE_FILE).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == _STAGE:
            return {
                target.id: ast.literal_eval(item.value)
                for item in node.body
                if isinstance(item, ast.Assign)
                for target in item.targets
                if isinstance(target, ast.Name)
            }
    raise LookupError(f"{_STAGE} not found in {_STAGE_FILE}")


def test_encoder_agrees_with_fastvideo_matrix_game_2_image_encoding_stage(fastvideo_clip: Any) -> None:
    """The whole path, start image to tokens: FastVideo's Matrix-Game 2.0 image-encoding stage (the
    release's preprocessing on a [-1, 1] tensor, then its tower) against `preprocess` and our tower."""
    forward = fastvideo_method(
        _STAGE_FILE,
        _STAGE,
        "forward",
        {
            "torch": torch,
            "get_local_torch_device": lambda: torch.device("cpu"),
            "set_forward_context": fastvideo_module("forward_context").set_forward_context,
            "ForwardBatch": object,  # annotations only
            "FastVideoArgs": object,
        },
    )
    hf = _transformers_tower(SMALL, "eager", seed=2).state_dict()
    encoder = _Recording(_fastvideo_tower(fastvideo_clip, hf))
    stage = SimpleNamespace(image_encoder=encoder, **_stage_constants())
    image = _start_image()
    # The stage's tensor path: a [B, C, H, W] start image in [-1, 1], as the pipeline's batch holds it.
    batch = SimpleNamespace(pil_image=image[None], image_embeds=[])
    ours = _ours(_released_from_transformers(hf, SMALL), SMALL)
    with torch.no_grad():
        forward(stage, batch, SimpleNamespace(image_encoder_cpu_offload=False))
        pixels = preprocess(image, SMALL)
        tokens = ours(pixels)
    (expected,) = batch.image_embeds
    (stage_pixels,) = encoder.pixels
    assert_agrees("clip preprocessing 352x640 vs FastVideo MatrixGame2ImageEncodingStage", pixels, stage_pixels)
    assert_agrees("clip encoder vs FastVideo MatrixGame2ImageEncodingStage + CLIPVisionModel", tokens, expected)


# ---- preprocessing -----------------------------------------------------------------------------


def _keys_cubic(t: np.ndarray, a: float = -0.75) -> np.ndarray:
    """Keys' cubic-convolution weights of the four taps at offsets -1, 0, 1, 2 from floor(src),
    for fractional positions t in [0, 1): [..., 4]."""

    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1)


def _resize_axis(x: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Bicubic resize of one axis, align_corners=False: output pixel i samples the input at
    (i + 0.5) · n / size − 0.5; taps past an edge repeat the edge pixel; no antialiasing.

    For float32 (and bfloat16) input PyTorch computes that coordinate in float32: the scale n / size
    rounded to float32, then scale · (i + 0.5) − 0.5 rounded once (its CPU kernel fuses the multiply
    and add). So does this; weights and sums are float64. The rounding is part of what the release's
    call computes: across a 640-pixel row a float32 step is 6e-5 px, and unrounded coordinates move
    the result by 7e-5 of its scale, past the bound (rounding twice, unfused: 5e-6).
    """
    n = x.shape[axis]
    scale = np.float64(np.float32(n) / np.float32(size))
    src = (scale * (np.arange(size) + 0.5) - 0.5).astype(np.float32).astype(np.float64)
    base = np.floor(src).astype(np.int64)
    weights = _keys_cubic(src - base)  # [size, 4]
    taps = np.clip(base[:, None] + np.arange(-1, 3), 0, n - 1)  # [size, 4]
    moved = np.moveaxis(x, axis, -1)
    return np.moveaxis((moved[..., taps] * weights).sum(axis=-1), -1, axis)


def _start_image() -> torch.Tensor:
    """A 352 × 640 frame of uint8 noise in our convention: [3, H, W] in [-1, 1]."""
    rgb = np.random.default_rng(7).integers(0, 256, size=(352, 640, 3), dtype=np.uint8)
    return to_model_range(rgb)


def _reference_pixels(image: torch.Tensor, config: CLIPVisionConfig) -> torch.Tensor:
    transformers = reference_module("transformers")
    x = image.double().numpy()
    x = _resize_axis(_resize_axis(x, config.image_size, axis=1), config.image_size, axis=2)
    x = x * 0.5 + 0.5  # the release's [-1, 1] -> [0, 1] before `T.Normalize`
    processor = transformers.CLIPImageProcessorPil(
        do_resize=False, do_center_crop=False, do_rescale=False, do_convert_rgb=False
    )
    out = processor(images=[x], input_data_format="channels_first", return_tensors="pt")
    pixels: torch.Tensor = out["pixel_values"]
    return pixels


def test_preprocessing_agrees_with_documented_bicubic_and_transformers_normalisation() -> None:
    image = _start_image()
    ours = preprocess(image, VIT_H_14)
    assert ours.shape == (1, 3, 224, 224) and ours.dtype == torch.float32
    reference = _reference_pixels(image, VIT_H_14)
    assert_agrees("clip preprocessing 352x640 vs bicubic transcription + transformers CLIP normalise", ours, reference)


def test_preprocessing_with_antialiasing_differs() -> None:
    """Negative control: the same resize antialiased (as PIL and torchvision resize by default)."""
    image = _start_image()
    size = (VIT_H_14.image_size,) * 2
    x = F.interpolate(image[None], size=size, mode="bicubic", align_corners=False, antialias=True)
    mean = torch.tensor(VIT_H_14.mean).view(1, 3, 1, 1)
    std = torch.tensor(VIT_H_14.std).view(1, 3, 1, 1)
    antialiased = (x * 0.5 + 0.5 - mean) / std
    result = measure(
        "clip preprocessing antialiased (negative control)", antialiased, _reference_pixels(image, VIT_H_14)
    )
    print(result)
    assert not result.holds, "an antialiased resize must not pass for the release's"
