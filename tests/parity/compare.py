"""The one bound the parity cases hold both sides to, and the line each case prints.

Both sides compute the same float32 operations, in other orders: a fused einsum against split
linears, RoPE through complex float64 against float32 cos/sin tables, another SDPA kernel, another
reduction order inside LayerNorm and RMSNorm. Each reassociation moves a result by a few units in
the last place (float32 eps = 1.19e-7); across tens of layers and a rolling cache these add up to
between 1e-7 and a few 1e-6 of the output's scale. `F32_REL_BOUND` = 2e-5 allows ten times the
largest seen, and is still two orders below the smallest real disagreement the cases show (the
sampler's σ rule: 1.75e-3 on one chunk's x0; a wrong sink count: 1.8e-2).

Relative error is max |ours − reference| / max |reference|: one scale per compared tensor, so a
near-zero element does not inflate it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

F32_EPS = float(torch.finfo(torch.float32).eps)
F32_REL_BOUND = 2e-5


@dataclass(frozen=True)
class Agreement:
    case: str
    max_abs: float
    rel: float
    bound: float

    @property
    def holds(self) -> bool:
        return self.rel <= self.bound

    def __str__(self) -> str:
        verdict = "ok" if self.holds else "DIFFERS"
        return f"parity {self.case}: max abs {self.max_abs:.3e}, rel {self.rel:.3e} (bound {self.bound:.1e}) {verdict}"


def measure(case: str, ours: torch.Tensor, reference: torch.Tensor, bound: float = F32_REL_BOUND) -> Agreement:
    """How far two tensors of one shape are apart, against `bound`."""
    if ours.shape != reference.shape:
        raise AssertionError(f"{case}: shapes differ, ours {tuple(ours.shape)} vs reference {tuple(reference.shape)}")
    diff = (ours.double() - reference.double()).abs().max().item()
    scale = reference.double().abs().max().item()
    return Agreement(case, diff, diff / scale if scale > 0 else diff, bound)


def assert_agrees(case: str, ours: torch.Tensor, reference: torch.Tensor, bound: float = F32_REL_BOUND) -> Agreement:
    """Compare, print the case's line (`pytest -s` shows it) and fail beyond the bound."""
    result = measure(case, ours, reference, bound)
    print(result)
    assert result.holds, str(result)
    return result
