from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from workers.models.clip import (
    VIT_H_14,
    CLIPVisionConfig,
    CLIPVisionTower,
    preprocess,
    tower_name,
    unused_visual_keys,
    visual_state,
)

TINY = CLIPVisionConfig(image_size=28, patch_size=7, dim=32, num_heads=4, num_layers=3, output_layer=2, embed_dim=24)


def _block_shapes(c: CLIPVisionConfig, n: int) -> dict[str, tuple[int, ...]]:
    p = f"transformer.{n}."
    return {
        p + "norm1.weight": (c.dim,),
        p + "norm1.bias": (c.dim,),
        p + "attn.to_qkv.weight": (3 * c.dim, c.dim),
        p + "attn.to_qkv.bias": (3 * c.dim,),
        p + "attn.proj.weight": (c.dim, c.dim),
        p + "attn.proj.bias": (c.dim,),
        p + "norm2.weight": (c.dim,),
        p + "norm2.bias": (c.dim,),
        p + "mlp.0.weight": (c.mlp_ratio * c.dim, c.dim),
        p + "mlp.0.bias": (c.mlp_ratio * c.dim,),
        p + "mlp.2.weight": (c.dim, c.mlp_ratio * c.dim),
        p + "mlp.2.bias": (c.dim,),
    }


def _released_visual_shapes(c: CLIPVisionConfig) -> dict[str, tuple[int, ...]]:
    """Every `visual.*` weight of the released file (names after the prefix), per the release's
    `VisionTransformer(pool_type='token', pre_norm=True)`."""
    tokens = (c.image_size // c.patch_size) ** 2 + 1
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (c.dim, 3, c.patch_size, c.patch_size),  # no bias: a pre-norm follows
        "cls_embedding": (1, 1, c.dim),
        "pos_embedding": (1, tokens, c.dim),
        "pre_norm.weight": (c.dim,),
        "pre_norm.bias": (c.dim,),
    }
    for n in range(c.num_layers):
        shapes |= _block_shapes(c, n)
    shapes |= {"post_norm.weight": (c.dim,), "post_norm.bias": (c.dim,), "head": (c.dim, c.embed_dim)}
    return shapes


def _seeded(config: CLIPVisionConfig = TINY, seed: int = 0) -> CLIPVisionTower:
    torch.manual_seed(seed)
    tower = CLIPVisionTower(config).eval()
    with torch.no_grad():  # norms and biases away from their initial values, so they matter
        for name, param in tower.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.2)
    return tower


# --- the released layout -----------------------------------------------------------------------


def test_vit_h_14_state_dict_is_the_released_visual_layout_less_the_unused_weights() -> None:
    config = CLIPVisionConfig()
    assert config == VIT_H_14
    assert (config.image_size, config.patch_size, config.dim, config.num_heads) == (224, 14, 1280, 16)
    assert (config.num_layers, config.output_layer, config.num_tokens, config.mlp_dim) == (32, 31, 257, 5120)
    with torch.device("meta"):
        tower = CLIPVisionTower(config)
    state = {k: tuple(v.shape) for k, v in tower.state_dict().items()}
    released = _released_visual_shapes(config)
    unused = set(_block_shapes(config, 31)) | {"post_norm.weight", "post_norm.bias", "head"}
    assert unused_visual_keys(config) == unused
    assert state == {k: v for k, v in released.items() if k not in unused}
    assert not list(tower.buffers())

    released_total = sum(math.prod(s) for s in released.values())
    held = sum(p.numel() for p in tower.parameters())
    print(f"CLIP ViT-H/14 visual tower: {released_total:,} parameters released, {held:,} held (31 of 32 blocks)")
    assert released_total == 632_076_800
    assert held == 611_086_080


def test_vit_h_14_output_shape_on_meta() -> None:
    with torch.device("meta"):
        tower = CLIPVisionTower()
        tokens = tower(torch.empty(2, 3, 224, 224))
    assert tokens.shape == (2, 257, 1280)
    assert tokens.dtype == torch.float32


def test_visual_state_takes_the_visual_part_and_loads_strictly() -> None:
    full = _seeded(replace(TINY, output_layer=TINY.num_layers), seed=1)
    released = {f"visual.{k}": v for k, v in full.state_dict().items()}
    released |= {
        "visual.post_norm.weight": torch.ones(TINY.dim),
        "visual.post_norm.bias": torch.zeros(TINY.dim),
        "visual.head": torch.randn(TINY.dim, TINY.embed_dim),
        "textual.token_embedding.weight": torch.randn(10, 8),
        "log_scale": torch.tensor(4.6),
    }
    assert set(released) == {f"visual.{k}" for k in _released_visual_shapes(TINY)} | {
        "textual.token_embedding.weight",
        "log_scale",
    }
    with torch.device("meta"):
        tower = CLIPVisionTower(TINY)
    tower.load_state_dict(visual_state(released, TINY), strict=True, assign=True)
    pixels = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        deeper = full(pixels)
        # The held blocks are the released file's first ones: the deeper tower, stopped one block early.
        full.transformer = full.transformer[: TINY.output_layer]
        torch.testing.assert_close(tower(pixels), full(pixels), rtol=0, atol=0)
    assert not torch.allclose(tower(pixels), deeper, atol=1e-3)


def test_tower_name_refuses_other_layouts() -> None:
    assert tower_name("visual.transformer.0.attn.to_qkv.weight") == "transformer.0.attn.to_qkv.weight"
    assert tower_name("visual.transformer.31.mlp.0.weight") is None
    assert tower_name("visual.head") is None
    assert tower_name("textual.encoder.layers.0.weight") is None
    assert tower_name("log_scale") is None
    with pytest.raises(ValueError, match="released CLIP file"):
        tower_name("vision_model.encoder.layers.0.self_attn.q_proj.weight")  # transformers' layout


# --- forward -----------------------------------------------------------------------------------


def _reference_forward(tower: CLIPVisionTower, pixels: Tensor) -> Tensor:
    """The tower's equations in float64, one image, heads one by one."""
    c = tower.config
    sd = {k: v.double() for k, v in tower.state_dict().items()}

    def norm(x: Tensor, p: str) -> Tensor:
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + c.norm_eps) * sd[p + ".weight"] + sd[p + ".bias"]

    def gelu(x: Tensor) -> Tensor:
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))

    g, ps = c.grid, c.patch_size
    patches = pixels.double().reshape(3, g, ps, g, ps).permute(1, 3, 0, 2, 4).reshape(g * g, -1)  # row-major
    x = patches @ sd["patch_embedding.weight"].reshape(c.dim, -1).T
    x = torch.cat([sd["cls_embedding"][0], x]) + sd["pos_embedding"][0]
    x = norm(x, "pre_norm")
    for n in range(c.output_layer):
        p = f"transformer.{n}."
        qkv = norm(x, p + "norm1") @ sd[p + "attn.to_qkv.weight"].T + sd[p + "attn.to_qkv.bias"]
        q, k, v = qkv.split(c.dim, dim=-1)
        heads = []
        for h in range(c.num_heads):
            sl = slice(h * c.head_dim, (h + 1) * c.head_dim)
            scores = q[:, sl] @ k[:, sl].T / math.sqrt(c.head_dim)
            heads.append(torch.softmax(scores, -1) @ v[:, sl])
        x = x + torch.cat(heads, -1) @ sd[p + "attn.proj.weight"].T + sd[p + "attn.proj.bias"]
        h1 = gelu(norm(x, p + "norm2") @ sd[p + "mlp.0.weight"].T + sd[p + "mlp.0.bias"])
        x = x + h1 @ sd[p + "mlp.2.weight"].T + sd[p + "mlp.2.bias"]
    return x


def test_forward_matches_reference_equations() -> None:
    tower = _seeded(seed=2)
    pixels = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        tokens = tower(pixels)
    assert tokens.shape == (2, TINY.num_tokens, TINY.dim)
    assert tokens.dtype == torch.float32
    for b in range(2):
        torch.testing.assert_close(tokens[b], _reference_forward(tower, pixels[b]).float(), rtol=1e-5, atol=1e-5)


def test_bfloat16_weights_track_float32_and_return_float32() -> None:
    tower = _seeded(seed=3)
    pixels = torch.randn(1, 3, 28, 28)
    with torch.no_grad():
        ref = tower(pixels)
        out = tower.to(torch.bfloat16)(pixels)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=0.1, atol=0.1)


def test_forward_rejects_other_input_sizes() -> None:
    with pytest.raises(ValueError, match="expected pixels"):
        _seeded()(torch.randn(1, 3, 32, 32))


# --- preprocessing -----------------------------------------------------------------------------


def test_preprocess_squashes_any_frame_to_the_input_size() -> None:
    image = torch.rand(3, 352, 640) * 2 - 1
    pixels = preprocess(image)
    assert pixels.shape == (1, 3, 224, 224)
    assert pixels.dtype == torch.float32
    batch = preprocess(torch.stack([image, -image]))
    assert batch.shape == (2, 3, 224, 224)
    torch.testing.assert_close(batch[:1], pixels, rtol=0, atol=0)
    assert preprocess(image, TINY).shape == (1, 3, 28, 28)


def test_preprocess_maps_minus_one_to_one_onto_clip_normalised_range() -> None:
    mean = torch.tensor(VIT_H_14.mean).view(3, 1, 1)
    std = torch.tensor(VIT_H_14.std).view(3, 1, 1)
    black = preprocess(-torch.ones(3, 100, 180))[0]
    white = preprocess(torch.ones(3, 100, 180))[0]
    torch.testing.assert_close(black, (0 - mean) / std.expand_as(black), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(white, ((1 - mean) / std).expand_as(white), rtol=1e-6, atol=1e-6)
    # A smooth image stays within that range per channel.
    ramp = torch.linspace(-1, 1, 300).expand(3, 120, 300)
    smooth = preprocess(ramp)[0]
    assert (smooth >= black - 1e-5).all() and (smooth <= white + 1e-5).all()


def test_preprocess_keeps_bicubic_overshoot() -> None:
    """A hard edge rings past [-1, 1] under bicubic interpolation; the release clamps nothing."""
    edge = -torch.ones(3, 64, 50)
    edge[:, :, 25:] = 1.0
    pixels = preprocess(edge)[0]
    white = (1 - torch.tensor(VIT_H_14.mean)) / torch.tensor(VIT_H_14.std)
    assert (pixels.amax(dim=(1, 2)) > white + 0.01).all()


def test_preprocess_rejects_non_rgb() -> None:
    with pytest.raises(ValueError, match="expected an image"):
        preprocess(torch.zeros(4, 10, 10))
    with pytest.raises(ValueError, match="expected an image"):
        preprocess(torch.zeros(10, 10))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="patch_size"):
        CLIPVisionConfig(image_size=30, patch_size=7)
    with pytest.raises(ValueError, match="num_heads"):
        CLIPVisionConfig(dim=30, num_heads=4)
    with pytest.raises(ValueError, match="output_layer"):
        CLIPVisionConfig(output_layer=33)
