"""umT5 encoder (the text encoder of Wan2.x / LingBot-World), inference only.

Module names mirror the released `models_t5_umt5-xxl-enc-bf16.pth`, so its state dict loads with
`strict=True`. To avoid materialising ~23 GB of float32 first, build under `torch.device("meta")`
and load with `load_state_dict(torch.load(path, mmap=True), assign=True)`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.models.presets import T5Config
from workers.models.tokenizer import TextTokenizer

MAX_DISTANCE = 128
_EPS = 1e-6


def fp16_clamp(x: Tensor) -> Tensor:
    """Pull float16 infinities back into range; the residual stream of T5 overflows float16."""
    if x.dtype == torch.float16 and torch.isinf(x).any():
        limit = torch.finfo(x.dtype).max - 1000
        x = x.clamp(min=-limit, max=limit)
    return x


def relative_position_bucket(rel_pos: Tensor, num_buckets: int, max_distance: int = MAX_DISTANCE) -> Tensor:
    """Bidirectional T5 bucketing of `key_pos - query_pos`.

    Half the buckets are for positive offsets; within a half, small offsets get exact buckets and larger
    ones share logarithmically wider buckets up to `max_distance`, beyond which they saturate. The float
    expression keeps the reference's operation order so bucket boundaries match it exactly.
    """
    half = num_buckets // 2
    buckets = (rel_pos > 0).long() * half
    rel = rel_pos.abs()
    max_exact = half // 2
    # Clamped only to keep log() finite; offsets below max_exact take the exact branch anyway.
    large = (
        max_exact
        + (
            torch.log(rel.clamp(min=max_exact).float() / max_exact)
            / math.log(max_distance / max_exact)
            * (half - max_exact)
        ).long()
    )
    large = large.clamp(max=half - 1)
    return buckets + torch.where(rel < max_exact, rel, large)


class T5LayerNorm(nn.Module):
    """RMS norm without mean subtraction or bias, computed in float32."""

    def __init__(self, dim: int, eps: float = _EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.type_as(self.weight)
        return self.weight * x


class T5RelativeEmbedding(nn.Module):
    """Learned per-head bias for each relative-position bucket (one table per umT5 layer)."""

    def __init__(self, num_buckets: int, num_heads: int) -> None:
        super().__init__()
        self.num_buckets = num_buckets
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, buckets: Tensor) -> Tensor:
        """[Lq, Lk] bucket ids -> [1, heads, Lq, Lk] additive attention bias."""
        table: Tensor = self.embedding(buckets)  # [Lq, Lk, heads]
        return table.permute(2, 0, 1).unsqueeze(0)


class T5Attention(nn.Module):
    def __init__(self, dim: int, dim_attn: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim_attn // num_heads
        self.q = nn.Linear(dim, dim_attn, bias=False)
        self.k = nn.Linear(dim, dim_attn, bias=False)
        self.v = nn.Linear(dim, dim_attn, bias=False)
        self.o = nn.Linear(dim_attn, dim, bias=False)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        """x [B, L, dim]; bias [B or 1, heads, L, L] with padding keys already at the dtype minimum."""
        b, length, _ = x.shape
        q, k, v = (
            proj(x).view(b, length, self.num_heads, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v)
        )
        # T5 folds the 1/sqrt(d) scale into its initialisation, so the trained weights expect none here.
        scores = q @ k.transpose(-1, -2) + bias
        attn = F.softmax(scores.float(), dim=-1).type_as(scores)
        out = (attn @ v).transpose(1, 2).reshape(b, length, self.num_heads * self.head_dim)
        projected: Tensor = self.o(out)
        return projected


class T5FeedForward(nn.Module):
    """Gated-GELU FFN: fc2(fc1(x) * gelu_tanh(gate(x)))."""

    def __init__(self, dim: int, dim_ffn: int) -> None:
        super().__init__()
        # A Sequential so the checkpoint key is `gate.0.weight`.
        self.gate = nn.Sequential(nn.Linear(dim, dim_ffn, bias=False), nn.GELU(approximate="tanh"))
        self.fc1 = nn.Linear(dim, dim_ffn, bias=False)
        self.fc2 = nn.Linear(dim_ffn, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc2(self.fc1(x) * self.gate(x))
        return out


class T5Block(nn.Module):
    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.norm1 = T5LayerNorm(config.dim)
        self.attn = T5Attention(config.dim, config.dim_attn, config.num_heads)
        self.norm2 = T5LayerNorm(config.dim)
        self.ffn = T5FeedForward(config.dim, config.dim_ffn)
        self.pos_embedding = T5RelativeEmbedding(config.num_buckets, config.num_heads)

    def forward(self, x: Tensor, buckets: Tensor, key_padding: Tensor | None) -> Tensor:
        bias = self.pos_embedding(buckets).to(x.dtype)
        if key_padding is not None:
            bias = bias.masked_fill(key_padding, torch.finfo(x.dtype).min)
        x = fp16_clamp(x + self.attn(self.norm1(x), bias))
        return fp16_clamp(x + self.ffn(self.norm2(x)))


class UMT5Encoder(nn.Module):
    """umT5 encoder stack: token embedding, `num_layers` pre-norm blocks, final RMS norm."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(T5Block(config) for _ in range(config.num_layers))
        self.norm = T5LayerNorm(config.dim)

    def forward(self, ids: Tensor, mask: Tensor | None = None) -> Tensor:
        """ids [B, L] long, mask [B, L] (nonzero = real token) -> [B, L, dim].

        Outputs at padded positions are computed but meaningless; real positions do not depend on padding.
        """
        x = self.token_embedding(ids)
        length = ids.shape[1]
        pos = torch.arange(length, device=ids.device)
        buckets = relative_position_bucket(pos[None, :] - pos[:, None], self.config.num_buckets)
        # Shared by every layer: [B, 1, 1, L], True where the key is padding.
        key_padding = None if mask is None else (mask == 0)[:, None, None, :]
        for block in self.blocks:
            x = block(x, buckets, key_padding)
        out: Tensor = self.norm(x)
        return out


class TextEncoder:
    """Prompt -> umT5 embeddings, one [n_tokens, dim] tensor per prompt (EOS included, padding dropped)."""

    def __init__(self, encoder: UMT5Encoder, tokenizer: TextTokenizer) -> None:
        if tokenizer.text_len != encoder.config.text_len:
            raise ValueError(f"tokenizer text_len {tokenizer.text_len} != encoder text_len {encoder.config.text_len}")
        self.encoder = encoder.eval().requires_grad_(False)
        self.tokenizer = tokenizer

    @property
    def device(self) -> torch.device:
        return self.encoder.token_embedding.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder.token_embedding.weight.dtype

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> list[Tensor]:
        if not prompts:
            return []
        ids, mask = self.tokenizer(prompts)
        vocab = self.encoder.config.vocab_size
        # Checked on the CPU copy: an out-of-range id would otherwise be an opaque device-side assert.
        top = int(ids.max())
        if top >= vocab:
            raise ValueError(f"tokenizer produced id {top} outside the encoder vocabulary ({vocab})")
        lengths = mask.sum(dim=1).tolist()
        out = self.encoder(ids.to(self.device), mask.to(self.device))
        return [row[:n] for row, n in zip(out, lengths, strict=True)]
