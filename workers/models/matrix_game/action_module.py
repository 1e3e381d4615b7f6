"""The action module: a mouse path and a keyboard path added to the residual stream of the first
blocks, after cross-attention and before the FFN (Matrix-Game-2/wan/modules/action_module.py).

Mouse: each token of a latent frame concatenates its hidden state with the frame's 12 mouse
readings, goes through an MLP, and self-attends over latent frames *at its own spatial position*
(one sequence per token, so the cache holds B·S sequences). Keyboard: the 12 key states are
embedded per video frame and projected to one key/value per latent frame; every token queries the
keyboard keys of the visible frames. Both have their own rolling cache over latent frames (same
window and staging rules as self-attention, `workers/models/kv_cache.py`) and their own RoPE over
the latent frame index.

The action q/k RMSNorms do not apply their weight: the release's norm class in this file
(`WanRMSNorm`, unlike the trunk's of the same name) returns x·rsqrt(mean x² + eps) and never
multiplies by `weight`, so the released weights were trained without it, and the parameter only
exists in the checkpoint (at its initial ones, presumably: no gradient ever reached it). FastVideo's
port multiplies by it; the two agree while the weight is all ones.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from workers.models.attention import AttendFn, attention_fn
from workers.models.attention_backend import AttentionBackend
from workers.models.dit import LayerNorm, RMSNorm, weight_dtype_linear
from workers.models.kv_cache import LayerKVCache
from workers.models.matrix_game.actions import ChunkActions
from workers.models.matrix_game.config import MatrixGameConfig
from workers.models.rope import apply_rope, inverse_frequencies, rotation_angles


class UnweightedRMSNorm(RMSNorm):
    """RMSNorm whose `weight` is kept for the checkpoint's key set but not applied (module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x)


class ActionRope:
    """cos/sin tables [F, 1, head_dim/2] rotating the first `action_rope_time_dim` channels of each
    action head by the absolute latent frame index (θ = 256).

    The release builds a 3-axis table over a (frames, 1, 1) grid with channel split [8, 28, 28];
    its two spatial axes only ever see position 0, so those channels are left as they are."""

    def __init__(self, cfg: MatrixGameConfig, device: torch.device) -> None:
        self.time_pairs = cfg.action_rope_time_dim // 2
        self.still_pairs = cfg.action_head_dim // 2 - self.time_pairs
        self.inv_freq = inverse_frequencies(self.time_pairs, device, cfg.action_rope_theta)

    def cos_sin(self, start_frame: int, num_frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        angles = rotation_angles(start_frame, num_frames, self.inv_freq)  # [F, time_pairs] float64
        angles = F.pad(angles, (0, self.still_pairs))[:, None, :]  # [F, 1, head_dim/2]
        return angles.cos().float(), angles.sin().float()


class ActionModule(nn.Module):
    def __init__(self, cfg: MatrixGameConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hidden, heads, head_dim = cfg.action_hidden_dim, cfg.action_heads, cfg.action_head_dim
        window = cfg.action_window_frames
        self.keyboard_embed = nn.Sequential(
            nn.Linear(cfg.keyboard_dim, cfg.keyboard_embed_dim),
            nn.SiLU(),
            nn.Linear(cfg.keyboard_embed_dim, cfg.keyboard_embed_dim),
        )
        if cfg.mouse_dim is not None:
            self.mouse_mlp = nn.Sequential(
                nn.Linear(cfg.mouse_dim * window + cfg.dim, hidden),
                nn.GELU(approximate="tanh"),
                nn.Linear(hidden, hidden),
                LayerNorm(hidden, eps=1e-5),  # torch's default eps, as released
            )
            self.t_qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.img_attn_q_norm = UnweightedRMSNorm(head_dim, eps=1e-6)
            self.img_attn_k_norm = UnweightedRMSNorm(head_dim, eps=1e-6)
            self.proj_mouse = nn.Linear(hidden, cfg.dim, bias=False)
        self.key_attn_q_norm = UnweightedRMSNorm(head_dim, eps=1e-6)
        self.key_attn_k_norm = UnweightedRMSNorm(head_dim, eps=1e-6)
        self.mouse_attn_q = nn.Linear(cfg.dim, hidden, bias=False)  # the keyboard path's query, despite the name
        self.keyboard_attn_kv = nn.Linear(cfg.keyboard_embed_dim * window, 2 * hidden, bias=False)
        self.proj_keyboard = nn.Linear(hidden, cfg.dim, bias=False)
        self.heads, self.head_dim = heads, head_dim
        self.attention: AttendFn = attention_fn(AttentionBackend.AUTO)

    def forward(
        self,
        x: torch.Tensor,  # [B, F, S, dim] float32, after cross-attention
        actions: ChunkActions,
        rope: tuple[torch.Tensor, torch.Tensor],  # ActionRope tables for the chunk's F frames
        mouse_cache: LayerKVCache | None,
        keyboard_cache: LayerKVCache | None,
        commit: bool,
    ) -> torch.Tensor:
        """Mouse residual, then keyboard residual (the keyboard queries see the mouse's output)."""
        if actions.mouse is not None:
            x = x + self.mouse(x, actions.mouse, rope, mouse_cache, commit)
        return x + self.keyboard(x, actions.keyboard, rope, keyboard_cache, commit)

    def mouse(
        self,
        x: torch.Tensor,
        windows: torch.Tensor,  # [B, F, 12, mouse_dim]
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: LayerKVCache | None,  # B·S sequences of latent frames
        commit: bool,
    ) -> torch.Tensor:
        b, f, s, _ = x.shape
        # Video frame major, then channel, as the release flattens a window; the same for every token.
        readings = windows.flatten(2)[:, :, None].expand(b, f, s, -1)
        h = torch.cat([x, readings.to(x.dtype)], dim=-1)  # [B, F, S, dim + 12·mouse_dim]
        fc1, act, fc2, norm = self.mouse_mlp
        h = norm(weight_dtype_linear(fc2, act(weight_dtype_linear(fc1, h))))  # [B, F, S, hidden]
        qkv = weight_dtype_linear(self.t_qkv, h).view(b, f, s, 3, self.heads, self.head_dim)
        # One sequence over latent frames per spatial token: [B·S, F, heads, head_dim].
        q, k, v = (t.transpose(1, 2).reshape(b * s, f, self.heads, self.head_dim) for t in qkv.unbind(3))
        q = apply_rope(self.img_attn_q_norm(q), *rope)
        k = apply_rope(self.img_attn_k_norm(k), *rope)
        if cache is not None:
            k, v = cache.attend_window(k, v, commit)  # [B·S, window, heads, head_dim]
        out = self.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None)  # [B·S, H, F, hd]
        out = out.transpose(1, 2).reshape(b, s, f, -1).transpose(1, 2)  # [B, F, S, hidden]
        return weight_dtype_linear(self.proj_mouse, out).float()

    def keyboard(
        self,
        x: torch.Tensor,
        windows: torch.Tensor,  # [B, F, 12, keyboard_dim]
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: LayerKVCache | None,  # B sequences of latent frames
        commit: bool,
    ) -> torch.Tensor:
        b, f, s, _ = x.shape
        fc1, act, fc2 = self.keyboard_embed
        embedded = weight_dtype_linear(fc2, act(weight_dtype_linear(fc1, windows)))  # [B, F, 12, embed]
        kv = weight_dtype_linear(self.keyboard_attn_kv, embedded.flatten(2)).view(b, f, 2, self.heads, self.head_dim)
        k = apply_rope(self.key_attn_k_norm(kv[:, :, 0]), *rope)  # [B, F, heads, head_dim]
        v = kv[:, :, 1]
        q = self.key_attn_q_norm(weight_dtype_linear(self.mouse_attn_q, x).view(b, f, s * self.heads, self.head_dim))
        q = apply_rope(q, *rope).view(b, f * s, self.heads, self.head_dim)  # each token at its frame's angle
        if cache is not None:
            k, v = cache.attend_window(k, v, commit)  # [B, window, heads, head_dim]
        # Every token of the chunk sees every visible frame's keyboard key (no mask within the chunk).
        out = self.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None)  # [B, H, F·S, hd]
        out = out.transpose(1, 2).reshape(b, f, s, -1)  # [B, F, S, hidden]
        return weight_dtype_linear(self.proj_keyboard, out).float()
