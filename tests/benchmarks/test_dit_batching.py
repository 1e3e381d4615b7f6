"""benchmarks.dit_batching's bit check: sessions batched into one DiT forward against each alone."""

from __future__ import annotations

import pytest
import torch

from benchmarks.dit_batching import check_bits
from workers.models.presets import get_preset


@pytest.mark.long
def test_a_batched_session_computes_its_own_chunk_to_float_rounding() -> None:
    bits = check_bits(get_preset("gridworld-responsive"), torch.device("cpu"), batch=2)
    assert bits["batch"] == 2
    # The same math per session (nothing leaks between the batch's rows); whether the rounding is
    # the same too depends on the machine's matrix kernels, which is what the check reports.
    assert bits["max_abs_diff"] < 1e-4
    assert bits["bit_equal"] == (bits["max_abs_diff"] == 0.0)
