"""The Wan diffusion transformer with LingBot-World camera control, run causally chunk by chunk.

Module and parameter names follow the official checkpoints exactly (`patch_embedding`,
`patch_embedding_wancamctrl`, `c2ws_hidden_states_layer{1,2}`, `blocks.N.cam_*`, `head.head`, …),
so `load_state_dict(strict=True)` takes a released state dict with no renaming.

Layout inside the blocks: hidden states are [B, F, S, dim] (F latent frames, S tokens per frame),
so per-frame timestep modulation [B, F, 1, dim] broadcasts over a frame's tokens without copies.
The residual stream and all modulation are float32; linear layers run in the weight dtype
(bf16 on GPU), mirroring the reference's autocast regions.

Sequence parallelism (Ulysses, `sp=`; see workers/parallel/ulysses.py): each rank of the group
holds S/N tokens of every frame through the blocks and only swaps to a head split inside
self-attention. `sp=None` (or a one-rank group) is the plain single-rank path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from workers.models.attention import AttendFn, attention_fn
from workers.models.attention_backend import AttentionBackend
from workers.models.configs import DiTConfig
from workers.models.fp8 import Fp8Linear
from workers.models.kv_cache import LayerKVCache, SessionKVCache
from workers.models.rope import RopeTables, apply_rope

if TYPE_CHECKING:
    from workers.parallel.ulysses import SequenceParallel


def sinusoidal_embedding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """[n] timesteps -> [n, dim] (cos half, then sin half), computed in float64."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t.device) / half)
    angles = t.to(torch.float64)[:, None] * freqs[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """x over its root mean square (in float32), in x's dtype, before the gain."""
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x) * self.weight


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 whatever the input and parameter dtypes (bf16 weights on GPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).type_as(x)


def weight_dtype_linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer on `x` cast to its compute dtype (an fp8 layer casts to the dtype it was quantized from)."""
    if isinstance(layer, Fp8Linear):
        return layer(x)
    assert isinstance(layer, nn.Linear)
    out: torch.Tensor = layer(x.to(layer.weight.dtype))
    return out


def float32_mlp(mlp: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """Run a Linear/activation stack in float32 with upcast weights (the time embedding's precision)."""
    for layer in mlp:
        if isinstance(layer, nn.Linear):
            x = F.linear(x.float(), layer.weight.float(), None if layer.bias is None else layer.bias.float())
        else:
            x = layer(x)
    return x


def _active(sp: SequenceParallel | None) -> SequenceParallel | None:
    """A one-rank group runs the single-rank path unchanged."""
    return sp if sp is not None and sp.is_parallel else None


class SelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)
        self.attention: AttendFn = attention_fn(AttentionBackend.AUTO)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, F, S, dim] -> q, k, v [B, F, S, heads, head_dim] in the weight dtype."""
        heads = (*x.shape[:3], self.num_heads, self.head_dim)
        # norm_q / norm_k normalise over the full dim (all heads), so they run before any head split.
        q = self.norm_q(weight_dtype_linear(self.q, x)).view(heads)
        k = self.norm_k(weight_dtype_linear(self.k, x)).view(heads)
        v = weight_dtype_linear(self.v, x).view(heads)
        return q, k, v

    def attend(
        self,
        q: torch.Tensor,  # [B, F, S, heads, head_dim]; with sp, S is this rank's share of each frame
        k: torch.Tensor,
        v: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],  # tables for all F·S tokens of the chunk
        cache: LayerKVCache | None,  # with sp: this rank's heads only
        commit: bool,
        attn_mask: torch.Tensor | None,
        sp: SequenceParallel | None = None,
    ) -> torch.Tensor:
        """Rotary embedding, the KV cache and attention -> [B, F, S, dim] before the output projection."""
        b, f, s = q.shape[:3]
        if sp is None:
            q, k, v = q.flatten(1, 2), k.flatten(1, 2), v.flatten(1, 2)  # [B, L, H, hd]
        else:
            q, k, v = sp.tokens_to_heads(q, k, v)  # [B, L, H/N, hd]: every token, this rank's heads
        q = apply_rope(q, *rope)
        k = apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.attend_window(k, v, commit)
        out = self.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask).transpose(1, 2)
        # With sp, back to this rank's tokens with all heads, [B, F, S/N, dim], for the output projection.
        return out.reshape(b, f, s, -1) if sp is None else sp.heads_to_tokens(out, f)


class CrossAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)
        self.attention: AttendFn = attention_fn(AttentionBackend.AUTO)

    def text_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-session K/V of the text, [B, heads, text_len, head_dim] each; computed once."""
        b = context.shape[0]
        k = self.norm_k(weight_dtype_linear(self.k, context)).view(b, -1, self.num_heads, self.head_dim)
        v = weight_dtype_linear(self.v, context).view(b, -1, self.num_heads, self.head_dim)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, length, _ = x.shape
        q = self.norm_q(weight_dtype_linear(self.q, x)).view(b, length, self.num_heads, self.head_dim)
        out = self.attention(q.transpose(1, 2), *kv, None)
        return weight_dtype_linear(self.o, out.transpose(1, 2).flatten(2))


class DiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        dim = cfg.dim
        self.norm1 = LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(dim, cfg.num_heads, cfg.eps)
        self.norm3 = LayerNorm(dim, cfg.eps, elementwise_affine=True) if cfg.cross_attn_norm else nn.Identity()
        self.cross_attn = CrossAttention(dim, cfg.num_heads, cfg.eps)
        self.norm2 = LayerNorm(dim, cfg.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)
        # LingBot camera injector: four dim×dim linears per block.
        self.cam_injector_layer1 = nn.Linear(dim, dim)
        self.cam_injector_layer2 = nn.Linear(dim, dim)
        self.cam_scale_layer = nn.Linear(dim, dim)
        self.cam_shift_layer = nn.Linear(dim, dim)

    def camera_modulation(self, cam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cam [B, F, S, dim] -> this block's (scale, shift) in float32.

        Computed inside each forward rather than kept for the chunk: keeping every block's pair
        costs 2 · num_layers float32 activations (about 10 GB per rank for the 14B model at
        480 × 832), recomputing costs four dim × dim linears per block. Small models keep them
        (`CAMERA_MODULATION_KEEP_BYTES`, `WanDiT.chunk_camera`)."""
        hidden = (
            weight_dtype_linear(self.cam_injector_layer2, F.silu(weight_dtype_linear(self.cam_injector_layer1, cam)))
            + cam
        )
        scale = weight_dtype_linear(self.cam_scale_layer, hidden).float()
        return scale, weight_dtype_linear(self.cam_shift_layer, hidden).float()

    def forward(
        self,
        x: torch.Tensor,  # [B, F, S, dim] float32
        e: torch.Tensor,  # [B, F, 6, dim] float32
        rope: tuple[torch.Tensor, torch.Tensor],
        text_kv: tuple[torch.Tensor, torch.Tensor],
        cam: torch.Tensor | CameraModulation | None,  # the chunk's camera embedding, or this block's modulation
        cache: LayerKVCache | None,
        commit: bool,
        attn_mask: torch.Tensor | None,
        sp: SequenceParallel | None = None,
    ) -> torch.Tensor:
        # Two stateless halves around the stateful middle (KV cache, sequence-parallel exchange),
        # so `--compile` can compile the halves with fixed shapes while the middle stays eager.
        q, k, v, mod = self.before_attention(x, e)
        y = self.self_attn.attend(q, k, v, rope, cache, commit, attn_mask, sp)
        return self.after_attention(x, y, mod, cam, text_kv)

    def modulated_qkv(
        self, x: torch.Tensor, e: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Timestep modulation, norm and q/k/v projections; also returns the modulation [B, F, 6, dim]."""
        mod = self.modulation.unsqueeze(0).float() + e  # [B, F, 6, dim]
        h = self.norm1(x) * (1 + mod[:, :, 1:2]) + mod[:, :, 0:1]
        q, k, v = self.self_attn.project(h)
        return q, k, v, mod

    def residual_rest(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        mod: torch.Tensor,
        cam: torch.Tensor | CameraModulation | None,
        text_kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Self-attention output into the residual, camera modulation, cross-attention and FFN."""
        shape = x.shape
        x = x + weight_dtype_linear(self.self_attn.o, y).float() * mod[:, :, 2:3]
        if cam is not None:
            scale, shift = cam if isinstance(cam, tuple) else self.camera_modulation(cam)
            x = (1.0 + scale) * x + shift
        y = self.cross_attn(self.norm3(x).flatten(1, 2), text_kv).view(shape)
        x = x + y.float()
        h = self.norm2(x) * (1 + mod[:, :, 4:5]) + mod[:, :, 3:4]
        ffn_in, act, ffn_out = self.ffn  # Linear, GELU, Linear (checkpoint keys ffn.0 / ffn.2)
        y = weight_dtype_linear(ffn_out, act(weight_dtype_linear(ffn_in, h)))
        return x + y.float() * mod[:, :, 5:6]

    # Replaced by compiled versions under `--compile` (see workers/models/kernels.py).
    before_attention = modulated_qkv
    after_attention = residual_rest


class Head(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        out_features = math.prod(cfg.patch_size) * cfg.out_dim
        self.norm = LayerNorm(cfg.dim, cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(cfg.dim, out_features)
        self.modulation = nn.Parameter(torch.randn(1, 2, cfg.dim) / cfg.dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.modulation.unsqueeze(0).float() + e.unsqueeze(2)).chunk(2, dim=2)
        return weight_dtype_linear(self.head, self.norm(x) * (1 + scale) + shift).float()


# A chunk's per-block camera modulations are kept for its forwards when they take at most this many
# bytes (small models: 0.4 MiB for gridworld's one-latent chunk, where recomputing them in each of
# the chunk's forwards was a tenth of its DiT time); larger ones are recomputed per forward.
CAMERA_MODULATION_KEEP_BYTES = 64 << 20

CameraModulation = tuple[torch.Tensor, torch.Tensor]  # (scale, shift), float32 [B, F, S, dim] each


@dataclass(frozen=True)
class ChunkCamera:
    """A chunk's camera embedding [B, F, S, dim], computed once and shared by its forwards; each
    block derives its own modulation from it (`DiTBlock.camera_modulation`), or, for a small model
    at inference, reads the one `WanDiT.chunk_camera` computed for it (`per_block`)."""

    hidden: torch.Tensor
    per_block: tuple[CameraModulation, ...] = ()

    def for_block(self, i: int) -> torch.Tensor | CameraModulation:
        return self.per_block[i] if self.per_block else self.hidden


class WanDiT(nn.Module):
    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dim = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.patch_embedding_wancamctrl = nn.Linear(cfg.camera_in_features, dim)
        self.c2ws_hidden_states_layer1 = nn.Linear(dim, dim)
        self.c2ws_hidden_states_layer2 = nn.Linear(dim, dim)
        self.text_embedding = nn.Sequential(
            nn.Linear(cfg.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        self.blocks = nn.ModuleList([DiTBlock(cfg) for _ in range(cfg.num_layers)])
        self.head = Head(cfg)

    @property
    def block_list(self) -> list[DiTBlock]:
        """The blocks, typed (a ModuleList yields plain Modules to a type checker)."""
        return cast(list[DiTBlock], list(self.blocks))

    # ---- per-session and per-chunk conditioning (computed once, reused) ----

    def text_kv(self, context: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Text embeddings (each [n_i, text_dim]) -> per-block cross-attention K/V for the session."""
        cfg = self.cfg
        padded = torch.stack([F.pad(u, (0, 0, 0, cfg.text_len - u.shape[0])) for u in context])
        text_in = self.text_embedding[0]
        assert isinstance(text_in, nn.Linear)
        ctx = self.text_embedding(padded.to(text_in.weight.dtype))
        return [block.cross_attn.text_kv(ctx) for block in self.block_list]

    def chunk_camera(self, plucker_cells: torch.Tensor, sp: SequenceParallel | None = None) -> ChunkCamera:
        """plucker_cells [B, 384, F, h, w] (Plücker rays grouped per latent cell) -> per-block modulation.

        With `sp`, only this rank's tokens of each frame: pass the result to `forward` with the same `sp`.
        """
        sp = _active(sp)
        b, c, f, h, w = plucker_cells.shape
        _, ph, pw = self.cfg.patch_size
        # (c, row offset, col offset) order inside each 1×2×2 patch, as the checkpoint expects.
        tokens = (
            plucker_cells.view(b, c, f, h // ph, ph, w // pw, pw)
            .permute(0, 2, 3, 5, 1, 4, 6)
            .reshape(b, f, (h // ph) * (w // pw), c * ph * pw)
        )
        if sp is not None:
            # Everything below is per token, so shard the patchified rays before the embedding.
            sp.validate(tokens.shape[2], self.cfg.num_heads)
            tokens = sp.shard_tokens(tokens)  # [B, F, S/N, 1536]
        cam = weight_dtype_linear(self.patch_embedding_wancamctrl, tokens)
        cam = cam + weight_dtype_linear(
            self.c2ws_hidden_states_layer2, F.silu(weight_dtype_linear(self.c2ws_hidden_states_layer1, cam))
        )
        # Kept: the same values each forward would compute from the same `cam` (bit for bit).
        kept_bytes = 2 * len(self.blocks) * cam.numel() * 4
        if torch.is_grad_enabled() or kept_bytes > CAMERA_MODULATION_KEEP_BYTES:
            return ChunkCamera(cam)
        return ChunkCamera(cam, tuple(block.camera_modulation(cam) for block in self.block_list))

    # ---- forward ----

    def forward(
        self,
        noisy: torch.Tensor,  # [B, 16, F, h, w]
        cond: torch.Tensor,  # [B, 20, F, h, w]: mask 4 + image-condition latent 16
        t: torch.Tensor,  # [B] or [B, F] diffusion timesteps (0..1000)
        text_kv: list[tuple[torch.Tensor, torch.Tensor]],
        camera: ChunkCamera | None,
        start_frame: int,
        kv_cache: SessionKVCache | None = None,
        commit: bool = False,
        attn_mask: torch.Tensor | None = None,
        sp: SequenceParallel | None = None,
        rope: RopeTables | None = None,
    ) -> torch.Tensor:
        """Predict the flow velocity for a chunk of latent frames.

        With `kv_cache`, attends to the session's history (and commits this chunk's K/V when
        `commit`). Without it, `attn_mask` (see `kv_cache.window_mask`) makes one forward over a
        whole sequence behave like the streaming path; used as the reference in tests.

        With `sp` (Ulysses over N ranks), every rank passes the same full inputs and gets the same
        full velocity back; `camera` must come from `chunk_camera(..., sp)` and `kv_cache` must hold
        num_heads / N heads.

        `rope`: the session's resident tables for this token grid; without it they are built for
        this call (on the input's device).
        """
        sp = _active(sp)
        b, _, f, h, w = noisy.shape
        _, ph, pw = self.cfg.patch_size
        gh, gw = h // ph, w // pw
        weight = self.patch_embedding.weight
        x = self.patch_embedding(torch.cat([noisy, cond], dim=1).to(weight.dtype))  # [B, dim, F, gh, gw]
        x = x.flatten(3).permute(0, 2, 3, 1).float()  # [B, F, S, dim]
        if sp is not None:
            sp.validate(gh * gw, self.cfg.num_heads)
            x = sp.shard_tokens(x)  # [B, F, S/N, dim]

        if t.dim() == 1:
            t = t[:, None].expand(b, f)
        # Timestep conditioning stays float32 even with bf16 weights: it scales the residual stream.
        e = float32_mlp(self.time_embedding, sinusoidal_embedding(self.cfg.freq_dim, t.flatten()))
        e0 = float32_mlp(self.time_projection, e).view(b, f, 6, self.cfg.dim)
        e = e.float().view(b, f, self.cfg.dim)

        if rope is None:
            rope = RopeTables(self.cfg.head_dim, gh, gw, x.device)
        cos_sin = rope.cos_sin(start_frame, f)
        mask = None if attn_mask is None else attn_mask.to(x.device)
        for i, block in enumerate(self.block_list):
            x = block(
                x,
                e0,
                cos_sin,
                text_kv[i],
                None if camera is None else camera.for_block(i),
                None if kv_cache is None else kv_cache.layers[i],
                commit,
                mask,
                sp,
            )
        out = self.head(x, e)  # [B, F, S, 4·16] (S/N with sp)
        if sp is not None:
            # The sampler runs on every rank with identical generators, so every rank needs all of it.
            out = sp.gather_tokens(out)  # [B, F, S, 4·16]
        c = self.cfg.out_dim
        out = out.view(b, f, gh, gw, ph, pw, c).permute(0, 6, 1, 2, 4, 3, 5)
        return out.reshape(b, c, f, h, w)
