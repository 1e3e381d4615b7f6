"""Weight-only fp8: a linear layer's weight stored as float8 e4m3 with a float32 scale per output
channel, computed in the activations' dtype (bf16 on a GPU, float32 on the CPU).

    w8[o, :] = round_e4m3(w[o, :] / s[o]),  s[o] = max|w[o, :]| / 448   (448: e4m3's largest finite)
    y = x @ (w8 · s)ᵀ + b

Each forward widens one layer's weight to the compute dtype and runs an ordinary matmul, so it
runs wherever float8 tensors exist (every device torch 2.1+ supports, the CPU included, which is
how the tests exercise it); the saving is memory, not speed (a transient of one layer's weight in
bf16: 141 MiB for the 14B's FFN). torchao's float8 weight-only configs do the same arithmetic with
fused kernels, but only on CUDA devices of compute capability 8.9 and later, and its quantized
tensors do not pass through the snapshot and weights-digest code as plain tensors; this module keeps
the weight as two plain tensors (`weight_fp8`, `scale`) that every part of the runtime already handles.

Which layers: every `nn.Linear` inside the DiT's transformer blocks (attention projections, FFN,
camera and action layers): they hold all but a few percent of its weights. The embeddings, the time
MLP and the output head stay in the compute dtype, as fp8 recipes for diffusion transformers keep them.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# Blocks live under these attribute names in the DiTs here (WanDiT `blocks`, Matrix-Game's `blocks`).
BLOCK_CONTAINERS = ("blocks",)


class Fp8Linear(nn.Module):
    """A frozen linear layer with float8 e4m3 weights and per-output-channel float32 scales."""

    def __init__(
        self, weight_fp8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, compute_dtype: torch.dtype
    ) -> None:
        super().__init__()
        assert weight_fp8.dtype == FP8 and scale.shape == (weight_fp8.shape[0],)
        self.in_features, self.out_features = weight_fp8.shape[1], weight_fp8.shape[0]
        self.compute_dtype = compute_dtype  # the dtype the layer had: inputs are cast to it, as nn.Linear's callers do
        self.weight_fp8 = nn.Parameter(weight_fp8, requires_grad=False)
        self.scale = nn.Parameter(scale, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @staticmethod
    def quantize(linear: nn.Linear) -> Fp8Linear:
        w = linear.weight.detach()
        amax = w.abs().amax(dim=1).float().clamp_min(torch.finfo(torch.float32).tiny)
        scale = amax / FP8_MAX
        weight_fp8 = (w.float() / scale[:, None]).to(FP8)
        bias = None if linear.bias is None else linear.bias.detach()
        return Fp8Linear(weight_fp8, scale, bias, w.dtype)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.weight_fp8.to(dtype) * self.scale.to(dtype)[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.compute_dtype)
        return F.linear(x, self.dequantized(self.compute_dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 per-channel"


def quantize_blocks(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear inside the model's transformer blocks with an Fp8Linear, in place.

    Works on meta tensors too (the memory plan quantizes the DiT it traces)."""
    containers = [
        getattr(model, name) for name in BLOCK_CONTAINERS if isinstance(getattr(model, name, None), nn.Module)
    ]
    if not containers:
        raise ValueError(f"{type(model).__name__} has no transformer blocks to quantize")
    for container in containers:
        for parent in list(container.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, Fp8Linear.quantize(child))
    return model


def fp8_available() -> bool:
    return hasattr(torch, "float8_e4m3fn")
