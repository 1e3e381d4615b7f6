"""The attention backend names a deployment may choose (see workers/models/attention.py for what
each runs). Kept free of torch so settings and command lines can validate them before loading it."""

from __future__ import annotations

from enum import StrEnum


class AttentionBackend(StrEnum):
    AUTO = "auto"
    FLASH = "flash"  # FlashAttention-2 inside PyTorch (CUDA; a CPU flash kernel on the host)
    CUDNN = "cudnn"
    EFFICIENT = "efficient"  # memory-efficient (xFormers-style) kernel
    MATH = "math"  # the reference: plain matmuls and softmax
    FA3 = "fa3"  # FlashAttention 3 (Hopper), when installed


CPU_BACKENDS = frozenset({AttentionBackend.AUTO, AttentionBackend.FLASH, AttentionBackend.MATH})
