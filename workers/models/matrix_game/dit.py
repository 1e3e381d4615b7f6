"""Matrix-Game 2.0's causal DiT, run chunk by chunk with its three rolling caches.

Parameter names are the released checkpoint's own (`CausalWanModel` in
Matrix-Game-2/wan/modules/causal_model.py): `patch_embedding`, `time_embedding`,
`time_projection`, `img_emb.proj.{0,1,3,4}`, `blocks.N.{self_attn,cross_attn,norm3,ffn,modulation}`,
`blocks.N.action_model.*` in the action blocks, `head.head`, `head.modulation`. The released files
hold them under the training wrapper's `model.` prefix (`strip_release_prefix`); after that a
strict `load_state_dict` needs no renaming.

The trunk is LingBot's Wan trunk (`workers/models/dit.py`, whose building blocks this reuses) less
the camera and text, plus: the first frame's CLIP tokens through `img_emb` as the only
cross-attention context, and the action module between cross-attention and the FFN. Layout,
precision and cache semantics are those of `workers/models/dit.py`: blocks see [B, F, S, dim], the
residual stream and modulation are float32, linears run in the weight dtype.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn

from workers.models.dit import (
    CrossAttention,
    Head,
    LayerNorm,
    SelfAttention,
    float32_mlp,
    sinusoidal_embedding,
    weight_dtype_linear,
)
from workers.models.kv_cache import LayerKVCache
from workers.models.matrix_game.action_module import ActionModule, ActionRope
from workers.models.matrix_game.actions import ChunkActions
from workers.models.matrix_game.cache import MatrixGameCache
from workers.models.matrix_game.config import MatrixGameConfig
from workers.models.rope import RopeTables

RELEASE_PREFIX = "model."  # the released files were saved from the training wrapper (`WanDiffusionWrapper.model`)


def strip_release_prefix(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A released state dict (`model.blocks.0…`) -> this module's names (`blocks.0…`)."""
    if not all(key.startswith(RELEASE_PREFIX) for key in state_dict):
        raise ValueError(f"expected every key under {RELEASE_PREFIX!r}, as in the released files")
    return {key.removeprefix(RELEASE_PREFIX): value for key, value in state_dict.items()}


class ImageEmbedding(nn.Module):
    """The first frame's CLIP tokens [B, 257, 1280] -> cross-attention context [B, 257, dim]."""

    def __init__(self, cfg: MatrixGameConfig) -> None:
        super().__init__()
        self.proj = nn.Sequential(  # torch's default LayerNorm eps and exact GELU, as released
            LayerNorm(cfg.image_dim, eps=1e-5),
            nn.Linear(cfg.image_dim, cfg.image_dim),
            nn.GELU(),
            nn.Linear(cfg.image_dim, cfg.dim),
            LayerNorm(cfg.dim, eps=1e-5),
        )

    def forward(self, clip_tokens: torch.Tensor) -> torch.Tensor:
        x = clip_tokens
        for layer in self.proj:
            x = weight_dtype_linear(layer, x) if isinstance(layer, nn.Linear) else layer(x)
        return x


class MatrixGameBlock(nn.Module):
    def __init__(self, cfg: MatrixGameConfig, with_actions: bool) -> None:
        super().__init__()
        dim = cfg.dim
        self.action_model = ActionModule(cfg) if with_actions else None
        self.norm1 = LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(dim, cfg.num_heads, cfg.eps)
        self.norm3 = LayerNorm(dim, cfg.eps, elementwise_affine=True)
        self.cross_attn = CrossAttention(dim, cfg.num_heads, cfg.eps)
        self.norm2 = LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self,
        x: torch.Tensor,  # [B, F, S, dim] float32
        e: torch.Tensor,  # [B, F, 6, dim] float32
        rope: tuple[torch.Tensor, torch.Tensor],  # self-attention tables for the chunk's F·S tokens
        image_kv: tuple[torch.Tensor, torch.Tensor],
        actions: ChunkActions,
        action_rope: tuple[torch.Tensor, torch.Tensor],
        cache: LayerKVCache | None,
        mouse_cache: LayerKVCache | None,
        keyboard_cache: LayerKVCache | None,
        commit: bool,
    ) -> torch.Tensor:
        shape = x.shape
        mod = self.modulation.unsqueeze(0).float() + e  # [B, F, 6, dim]
        h = self.norm1(x) * (1 + mod[:, :, 1:2]) + mod[:, :, 0:1]
        q, k, v = self.self_attn.project(h)
        y = self.self_attn.attend(q, k, v, rope, cache, commit, None)
        x = x + weight_dtype_linear(self.self_attn.o, y).float() * mod[:, :, 2:3]
        x = x + self.cross_attn(self.norm3(x).flatten(1, 2), image_kv).view(shape).float()
        if self.action_model is not None:
            x = self.action_model(x, actions, action_rope, mouse_cache, keyboard_cache, commit)
        h = self.norm2(x) * (1 + mod[:, :, 4:5]) + mod[:, :, 3:4]
        ffn_in, act, ffn_out = self.ffn  # Linear, GELU, Linear (checkpoint keys ffn.0 / ffn.2)
        y = weight_dtype_linear(ffn_out, act(weight_dtype_linear(ffn_in, h)))
        return x + y.float() * mod[:, :, 5:6]


class MatrixGameDiT(nn.Module):
    def __init__(self, cfg: MatrixGameConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        self.blocks = nn.ModuleList([MatrixGameBlock(cfg, i < cfg.action_blocks) for i in range(cfg.num_layers)])
        self.head = Head(cfg.trunk)
        self.img_emb = ImageEmbedding(cfg)

    @property
    def block_list(self) -> list[MatrixGameBlock]:
        return cast(list[MatrixGameBlock], list(self.blocks))

    def image_kv(self, clip_tokens: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """CLIP tokens [B, 257, 1280] of the first frame -> per-block cross-attention K/V, computed once
        per session (the context never changes)."""
        context = self.img_emb(clip_tokens)  # [B, 257, dim] in the weight dtype
        return [block.cross_attn.text_kv(context) for block in self.block_list]

    def forward(
        self,
        noisy: torch.Tensor,  # [B, 16, F, h, w]
        cond: torch.Tensor,  # [B, 20, F, h, w]: mask 4 + image-condition latent 16
        t: torch.Tensor,  # [B] or [B, F] diffusion timesteps (0..1000)
        image_kv: list[tuple[torch.Tensor, torch.Tensor]],
        actions: ChunkActions,  # for these F latent frames (ChunkActions.gather)
        start_frame: int,
        cache: MatrixGameCache | None = None,
        commit: bool = False,
        rope: RopeTables | None = None,
    ) -> torch.Tensor:
        """Predict the flow velocity for a chunk of latent frames.

        With `cache`, attends to the session's history in all three caches (and commits this
        chunk when `commit`); without it, the chunk attends to itself only. `rope`: the session's
        resident self-attention tables for this grid; without it they are built for this call.
        """
        cfg = self.cfg
        b, _, f, h, w = noisy.shape
        _, ph, pw = cfg.patch_size
        gh, gw = h // ph, w // pw
        if cache is not None and cache.tokens_per_frame != gh * gw:
            raise ValueError(f"cache holds {cache.tokens_per_frame} tokens per frame; this grid has {gh * gw}")
        weight = self.patch_embedding.weight
        x = self.patch_embedding(torch.cat([noisy, cond], dim=1).to(weight.dtype))  # [B, dim, F, gh, gw]
        x = x.flatten(3).permute(0, 2, 3, 1).float()  # [B, F, S, dim]

        if t.dim() == 1:
            t = t[:, None].expand(b, f)
        # Timestep conditioning stays float32 even with bf16 weights: it scales the residual stream.
        e = float32_mlp(self.time_embedding, sinusoidal_embedding(cfg.freq_dim, t.flatten()))
        e0 = float32_mlp(self.time_projection, e).view(b, f, 6, cfg.dim)
        e = e.float().view(b, f, cfg.dim)

        if rope is None:
            rope = RopeTables(cfg.head_dim, gh, gw, x.device)
        cos_sin = rope.cos_sin(start_frame, f)
        action_rope = ActionRope(cfg, x.device).cos_sin(start_frame, f)
        for i, block in enumerate(self.block_list):
            x = block(x, e0, cos_sin, image_kv[i], actions, action_rope, *_block_caches(cache, i), commit)
        out = self.head(x, e)  # [B, F, S, 4·16]
        c = cfg.out_dim
        out = out.view(b, f, gh, gw, ph, pw, c).permute(0, 6, 1, 2, 4, 3, 5)
        return out.reshape(b, c, f, h, w)


def _block_caches(
    cache: MatrixGameCache | None, i: int
) -> tuple[LayerKVCache | None, LayerKVCache | None, LayerKVCache | None]:
    """Block i's self-attention, mouse and keyboard caches (the action ones in action blocks only)."""
    if cache is None:
        return None, None, None
    acting = i < len(cache.keyboard.layers)
    mouse = cache.mouse.layers[i] if acting and cache.mouse is not None else None
    return cache.self_attn.layers[i], mouse, cache.keyboard.layers[i] if acting else None
