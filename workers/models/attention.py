"""Scaled dot-product attention with a chosen kernel.

`auto` leaves the choice to PyTorch's dispatcher (FlashAttention-2, cuDNN, memory-efficient or
math, by device, dtype and shape), except that on a Hopper GPU with FlashAttention 3 installed
(the `flash_attn_interface` package) unmasked attention runs there. The other names pin one
kernel: a run that must be compared across machines or versions pins `math` or `flash`, and an
input the pinned kernel cannot take fails loudly instead of silently running another one.

FlashAttention 3 is detected, never required: `fa3` fails at start when it is not installed.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from workers.models.attention_backend import CPU_BACKENDS, AttentionBackend

_SDPA: dict[AttentionBackend, SDPBackend] = {
    AttentionBackend.FLASH: SDPBackend.FLASH_ATTENTION,
    AttentionBackend.CUDNN: SDPBackend.CUDNN_ATTENTION,
    AttentionBackend.EFFICIENT: SDPBackend.EFFICIENT_ATTENTION,
    AttentionBackend.MATH: SDPBackend.MATH,
}


@functools.cache
def fa3_installed() -> bool:
    return importlib.util.find_spec("flash_attn_interface") is not None


def _fa3_usable(device: torch.device) -> bool:
    return device.type == "cuda" and fa3_installed() and torch.cuda.get_device_capability(device)[0] == 9


def check_backend(backend: AttentionBackend, device: torch.device) -> None:
    """Raise ValueError, saying what to change, when `backend` cannot run on `device`."""
    if backend is AttentionBackend.FA3 and not _fa3_usable(device):
        raise ValueError(
            "attention backend 'fa3' needs FlashAttention 3 (the flash_attn_interface package) and a Hopper "
            "GPU; install it or use 'auto'"
        )
    if device.type != "cuda" and backend not in CPU_BACKENDS:
        allowed = ", ".join(sorted(b.value for b in CPU_BACKENDS))
        raise ValueError(f"attention backend {backend.value!r} needs CUDA; on {device.type} use one of {allowed}")


def resolve(backend: AttentionBackend, device: torch.device) -> AttentionBackend:
    """The kernel `auto` stands for on `device` when FlashAttention 3 applies; otherwise `backend`."""
    if backend is AttentionBackend.AUTO and _fa3_usable(device):
        return AttentionBackend.FA3
    return backend


AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def attention_fn(backend: AttentionBackend) -> AttendFn:
    """attend(q, k, v, mask) with q, k, v [B, heads, L, head_dim] -> [B, heads, Lq, head_dim]."""
    if backend is AttentionBackend.AUTO:
        return _sdpa
    if backend is AttentionBackend.FA3:
        return _fa3
    return functools.partial(_pinned_sdpa, _SDPA[backend])


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _pinned_sdpa(
    kernel: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    with sdpa_kernel(kernel):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _fa3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is not None:  # FA3 takes no arbitrary mask; the masked path is the reference forward only
        return _sdpa(q, k, v, mask)
    import flash_attn_interface

    out = flash_attn_interface.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    out = out[0] if isinstance(out, tuple) else out  # some releases also return the log-sum-exp
    return out.transpose(1, 2)
