"""Kernel choices for a stage: the attention backend, `torch.compile` of the DiT blocks, and a
deterministic mode for regression runs. One frozen setting, applied once per worker process.

Compile: each DiT block is compiled as its two stateless halves (modulation, norm and q/k/v
projections before attention; output projection, camera modulation, cross-attention and FFN
after it), with shapes fixed by the preset's chunk geometry. The stateful middle (rotary
embedding, the session's KV cache, the Ulysses exchange and the attention kernel) stays eager, so
neither the cache's growing length nor a session change causes a recompile: the graphs compiled
on the first chunk serve every later chunk and every later session of the process. The first
chunk pays the compile time (tens of seconds on a CPU), which is why the server warms up before
it reports ready.

Deterministic: `torch.use_deterministic_algorithms(True)` with cuBLAS's fixed workspace and cuDNN
autotuning off, so two runs of the same trace on the same machine give the same bits. It costs
speed, and it does not make different GPUs, kernels or thread counts agree: compare those within
`workers.determinism.FRAME_TOLERANCE`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from workers.models.attention import attention_fn, check_backend, resolve
from workers.models.attention_backend import AttentionBackend
from workers.models.dit import WanDiT


@dataclass(frozen=True)
class KernelConfig:
    attention: AttentionBackend = AttentionBackend.AUTO
    compile: bool = False
    deterministic: bool = False

    def check(self, device: torch.device) -> None:
        """Raise ValueError, saying what to change, when this setting cannot run on `device`."""
        check_backend(self.attention, device)

    def record(self, device: torch.device) -> dict[str, Any]:
        """The setting as RUN.json records it, with the kernel `auto` resolves to on `device`."""
        return {
            "attention": self.attention.value,
            "attention_resolved": resolve(self.attention, device).value,
            "compile": self.compile,
            "deterministic": self.deterministic,
        }


def enable_deterministic() -> None:
    # cuBLAS reads its workspace setting when its handle is created: before the first matmul.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def apply_to_process(config: KernelConfig, device: torch.device) -> None:
    """Process-wide parts of the setting; call before any model runs."""
    config.check(device)
    if config.deterministic:
        enable_deterministic()


def apply_attention(model: nn.Module, config: KernelConfig, device: torch.device) -> nn.Module:
    """Point every attention in `model` (self, cross and, in Matrix-Game's action modules, action
    attention: each holds its kernel as an `attention` attribute) at the chosen kernel."""
    attend = attention_fn(resolve(config.attention, device))
    for module in model.modules():
        if "attention" in vars(module):
            vars(module)["attention"] = attend  # a plain instance attribute (typed per class), not a submodule
    return model


def apply_to_dit(dit: WanDiT, config: KernelConfig, device: torch.device) -> WanDiT:
    """The attention kernel and, with `compile`, the LingBot-World DiT's block halves compiled."""
    apply_attention(dit, config, device)
    if config.compile:
        for block in dit.block_list:
            # dynamic=False: chunk shapes are fixed per preset, and static shapes fuse best.
            block.before_attention = torch.compile(block.modulated_qkv, dynamic=False)  # type: ignore[method-assign]
            block.after_attention = torch.compile(block.residual_rest, dynamic=False)  # type: ignore[method-assign]
    return dit


DEFAULT_KERNELS = KernelConfig()
