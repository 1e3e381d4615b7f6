"""The quality cost of each memory saving, measured: its frames against the exact run of the same trace.

    python -m benchmarks.savings [--chunks 4] [--dit-chunks 2] [--out runs/savings.json]

Two parts, one table each (docs/models-and-weights.md, "Savings"):

1. `gridworld` with its trained weights (the embedded world, on this CPU): each saving on its own
   and all together, the same start image, seed and controls as the exact run; per chunk the PSNR
   of its frames against the exact run's and the largest absolute difference of a pixel (0-255),
   reported as the worst chunk and the mean.
2. The released shapes with seeded random weights (their checkpoints are not here): the DiT's
   output per chunk (clean latents) with fp8 block weights against the same DiT with its own
   weights, for LingBot-World 1.3B and Matrix-Game 2.0 at full width, heads and tokens per frame
   (832×480, 640×352), cut to one block of each kind (as the memory plan traces them,
   `ModelFamily.one_layer`) so that a CPU runs a chunk in seconds; relative RMS error and max abs
   difference of the latents. fp8 weights are stored per output channel, so the error per layer
   does not depend on depth; over 30 layers it compounds, which is why part 1 (the whole model,
   trained) is the figure that says what a person sees.

Exact savings (bands, the context encoder on the host) are expected at float rounding (on this CPU:
bit for bit); bf16/fp16 VAE and fp8 weights are the ones with a cost.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.image_metrics import psnr_db
from benchmarks.replay import DEFAULT_IMAGE
from workers.controls import ChunkControl
from workers.determinism import intra_op_threads
from workers.families.registry import family_for
from workers.models.fp8 import quantize_blocks
from workers.models.presets import get_preset
from workers.models.savings import NO_SAVINGS, Quantization, Savings, VAEDtype
from workers.serial_engine import SerialEngine

# Each saving alone, then all at once: the rows of this benchmark and of device_check's `savings` step.
CASES: dict[str, Savings] = {
    "vae_bands_4": Savings(vae_bands=4),
    "context_on_cpu": Savings(text_encoder_on_cpu=True),
    "vae_float16": Savings(vae_dtype=VAEDtype.FLOAT16),
    "vae_bfloat16": Savings(vae_dtype=VAEDtype.BFLOAT16),
    "fp8": Savings(quantization=Quantization.FP8),
    "all": Savings(Quantization.FP8, True, VAEDtype.BFLOAT16, 4),
}
# A walk that turns, strafes and stands: every chunk's controls differ from the last.
KEYS = (("w",), ("w", "l"), ("a",), ("w",), (), ("d", "j"), ("s",), ("w", "i"))
THREADS = 2


def controls(chunks: int) -> list[ChunkControl]:
    return [ChunkControl(keys=frozenset(KEYS[i % len(KEYS)])) for i in range(chunks)]


def gridworld_frames(savings: Savings, chunks: int) -> list[np.ndarray]:
    engine = SerialEngine.load("gridworld", cpu_threads=THREADS, savings=savings)
    session = engine.create_session(DEFAULT_IMAGE, "", seed=0)
    return [session.step(c).frames for c in controls(chunks)]


def compare_frames(made: list[np.ndarray], exact: list[np.ndarray]) -> dict[str, Any]:
    psnr = [float(psnr_db(a, b).mean()) for a, b in zip(made, exact, strict=True)]
    diff = [int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()) for a, b in zip(made, exact, strict=True)]
    return {
        "psnr_db_per_chunk": psnr,
        "psnr_db_min": min(psnr),
        "psnr_db_mean": float(np.mean(psnr)),
        "max_abs_per_chunk": diff,
        "max_abs": max(diff),
        "bit_exact": all(d == 0 for d in diff),
    }


def dit_latents(preset_name: str, fp8: bool, chunks: int) -> list[torch.Tensor]:
    """Clean latents per chunk of the preset's DiT at full shape, one block of each kind, seeded weights."""
    preset = get_preset(preset_name)
    family = family_for(preset)
    cut = family.one_layer(preset)
    dit = family.load_dit(cut, torch.device("cpu"), None, weights_seed=0)
    if fp8:
        quantize_blocks(dit)
    gen = torch.Generator().manual_seed(0)
    context = torch.randn(family.context_shape(cut), generator=gen)
    cond = torch.randn(1, 20, cut.chunk_latent_frames, cut.latent_height, cut.latent_width, generator=gen)
    session = family.open_denoise(dit, cut, context, 0, cut.chunk_latent_frames)
    track = family.control_track(cut)
    out = []
    for control in controls(chunks):
        out.append(session.run_chunk(cond, track.next_inputs(control, cut.chunk_latent_frames)).clone())
    return out


def compare_latents(made: list[torch.Tensor], exact: list[torch.Tensor]) -> dict[str, Any]:
    rel = [float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()) for a, b in zip(made, exact, strict=True)]
    diff = [float((a - b).abs().max()) for a, b in zip(made, exact, strict=True)]
    return {"rel_rms_per_chunk": rel, "rel_rms_max": max(rel), "max_abs_per_chunk": diff, "max_abs": max(diff)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.savings", description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=4, help="chunks of the gridworld walk (default 4)")
    p.add_argument("--dit-chunks", type=int, default=2, help="chunks of each full-shape DiT (default 2)")
    p.add_argument("--skip-full-shape", action="store_true", help="gridworld only")
    p.add_argument("--out", type=Path, default=Path("runs/savings.json"))
    args = p.parse_args(argv)
    report: dict[str, Any] = {"gridworld": {}, "full_shape": {}, "chunks": args.chunks, "threads": THREADS}

    t0 = time.perf_counter()
    exact = gridworld_frames(NO_SAVINGS, args.chunks)
    print(f"gridworld, {args.chunks} chunks, against the exact run (PSNR dB: worst chunk / mean; max |Δ| of 255)")
    for savings in CASES.values():
        row = compare_frames(gridworld_frames(savings, args.chunks), exact)
        name = savings.describe()
        report["gridworld"][name] = row
        verdict = "bit-exact" if row["bit_exact"] else f"{row['psnr_db_min']:.1f} / {row['psnr_db_mean']:.1f} dB"
        print(f"  {name:<80} {verdict:>16}   max |Δ| {row['max_abs']:>3}")

    if not args.skip_full_shape:
        print(f"DiT at full shape, one block of each kind, seeded weights, {args.dit_chunks} chunks: fp8 vs exact")
        with intra_op_threads(THREADS):
            for name in ("lingbot-world-v2-1.3b", "matrix-game-2-universal"):
                exact_dit = dit_latents(name, False, args.dit_chunks)
                row = compare_latents(dit_latents(name, True, args.dit_chunks), exact_dit)
                report["full_shape"][name] = row
                print(
                    f"  {name:<26} latents: relative RMS error {row['rel_rms_max']:.2e}, max |Δ| {row['max_abs']:.3f}"
                )
    report["wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"report: {args.out} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
