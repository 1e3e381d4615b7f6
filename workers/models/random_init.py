"""Seeded random weights for test fixtures and presets that have no trained checkpoint.

Unlike training init (which zeroes the DiT's output head so a fresh model predicts nothing), every
matrix gets scaled Gaussian weights, so random-weight outputs respond to their inputs: controls,
prompts and seeds visibly change the frames, which the determinism and causality tests rely on.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def init_random_weights(module: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() >= 2:
                # Modulation tables ([1, n, dim]) scale like a vector of width dim; matrices by fan-in.
                fan_in = p.shape[-1] if "modulation" in name else p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            else:
                p.fill_(1.0)  # norm gains
