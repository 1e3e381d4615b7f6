"""Weight-only fp8: per-channel scales, the DiT's block linears swapped, close to the exact DiT on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from workers.controls import ChunkControl
from workers.families.registry import family_for
from workers.models.fp8 import FP8, Fp8Linear, quantize_blocks
from workers.models.loading import build_on_meta
from workers.models.presets import get_preset

CPU = torch.device("cpu")


def test_a_quantized_linear_keeps_each_output_channel_within_e4m3s_rounding() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    with torch.no_grad():
        linear.weight[3] *= 100.0  # one loud channel must not cost the others their precision
    q = Fp8Linear.quantize(linear)
    assert q.weight_fp8.dtype == FP8 and q.scale.shape == (32,) and q.compute_dtype == torch.float32
    w = q.dequantized(torch.float32)
    rel = ((w - linear.weight).abs().amax(dim=1) / linear.weight.abs().amax(dim=1)).max()
    assert rel <= 2.0**-3  # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 of a value, 1/8 at the top
    x = torch.randn(5, 64)
    y, ref = q(x), linear(x)
    assert ((y - ref).norm() / ref.norm()) < 0.05
    assert q.weight_fp8.element_size() == 1


@pytest.mark.heavy
def test_every_block_linear_and_nothing_else_is_quantized_on_meta_too() -> None:
    preset = get_preset("lingbot-world-v2-1.3b")  # on meta: shapes only, no memory
    family = family_for(preset)
    dit = build_on_meta(family.build_dit(preset)).to(torch.bfloat16)
    linears_in_blocks = sum(type(m) is nn.Linear for m in dit.blocks.modules())
    outside = sum(type(m) is nn.Linear for m in dit.modules()) - linears_in_blocks
    before = sum(p.numel() * p.element_size() for p in dit.parameters())
    quantize_blocks(dit)
    assert sum(isinstance(m, Fp8Linear) for m in dit.modules()) == linears_in_blocks > 0
    assert sum(type(m) is nn.Linear for m in dit.modules()) == outside  # embeddings and head stay
    after = sum(p.numel() * p.element_size() for p in dit.parameters())
    assert after < 0.55 * before  # bf16 -> fp8 on all but the embeddings, time MLP and head


@pytest.mark.parametrize("name", ["tiny", "matrix-game-2-tiny"])
def test_an_fp8_dit_runs_a_chunk_close_to_the_exact_one(name: str) -> None:
    preset = get_preset(name)
    family = family_for(preset)
    torch.manual_seed(0)
    context = torch.randn(family.context_shape(preset))
    cond = torch.randn(1, 20, preset.chunk_latent_frames, preset.latent_height, preset.latent_width)

    def chunk(fp8: bool) -> torch.Tensor:
        dit = family.load_dit(preset, CPU, None, weights_seed=0)
        if fp8:
            quantize_blocks(dit)
        session = family.open_denoise(dit, preset, context, 0, preset.chunk_latent_frames)
        inputs = family.control_track(preset).next_inputs(
            ChunkControl(keys=frozenset({"w"})), preset.chunk_latent_frames
        )
        return session.run_chunk(cond, inputs)

    exact, fp8 = chunk(False), chunk(True)
    rel = float((fp8 - exact).norm() / exact.norm())
    assert 0 < rel < 0.05, rel
