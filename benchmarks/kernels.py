"""Attention backends and `torch.compile` compared on one machine: DiT speed and frame agreement.

    python -m benchmarks.kernels [--model gridworld] [--device cpu] [--attention auto,math,flash]
                                 [--compile] [--chunks 6] [--json runs/kernels.json]

Every variant (each attention backend eager, and with `--compile` the first backend compiled)
loads the same weights into a serial engine and walks the same control sequence from the same
seed; the variants take their chunks in turn, so a busy machine slows them alike and the speed
ratios stay meaningful. Reported per variant: the first chunk's DiT seconds (which include
compiling), the steady chunks' DiT seconds, the ratio of the reference's steady median to the
variant's (above 1: faster), and how far its frames are from the reference's (the first variant)
against `workers.determinism.FRAME_TOLERANCE`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.stats import environment, summarize
from workers.controls import ChunkControl
from workers.determinism import frame_difference
from workers.models.attention_backend import AttentionBackend
from workers.models.kernels import KernelConfig
from workers.models.presets import DEFAULT_PRESET, PRESETS, get_preset
from workers.serial_engine import SerialEngine, SerialSession

ASSETS = Path(__file__).parent / "assets"
# A walk that moves and turns, so the camera path and the KV cache's rolling both take part.
CONTROLS = (["w"], ["w", "l"], ["a"], ["w"], ["j"], ["s"], ["w", "d"], ["i", "w"])


@dataclass(frozen=True)
class Variant:
    kernels: KernelConfig

    @property
    def name(self) -> str:
        return f"{self.kernels.attention.value}{' compiled' if self.kernels.compile else ''}"


def variants(backends: list[AttentionBackend], compile_first: bool) -> list[Variant]:
    out = [Variant(KernelConfig(attention=b)) for b in backends]
    if compile_first:
        out.append(Variant(KernelConfig(attention=backends[0], compile=True)))
    return out


def run(model: str, device: torch.device, chosen: list[Variant], chunks: int, quiet: bool = False) -> dict[str, Any]:
    preset = get_preset(model)
    image = ASSETS / "default_start.png"
    sessions: list[SerialSession] = []
    for v in chosen:
        engine = SerialEngine.load(preset, device=device, kernels=v.kernels)
        sessions.append(engine.create_session(image, "", seed=0))
    dit_s: list[list[float]] = [[] for _ in chosen]
    frames: list[list[np.ndarray]] = [[] for _ in chosen]
    for k in range(chunks):
        control = ChunkControl.from_keys(CONTROLS[k % len(CONTROLS)])
        for i, session in enumerate(sessions):  # in turn: noise on the machine hits every variant
            result = session.step(control)
            dit_s[i].append(result.timings.denoise_s)
            frames[i].append(result.frames)
            if not quiet:
                print(f"chunk {k} {chosen[i].name}: DiT {result.timings.denoise_s:.3f} s", file=sys.stderr, flush=True)
    reference = np.concatenate(frames[0])
    ref_steady = float(np.median(dit_s[0][1:]))
    rows = []
    for v, times, fr in zip(chosen, dit_s, frames, strict=True):
        diff = frame_difference(np.concatenate(fr), reference)
        steady = summarize(times[1:])
        rows.append(
            {
                "variant": v.name,
                "kernels": v.kernels.record(device),
                "first_chunk_dit_s": times[0],
                "steady_dit_s": steady,
                "speed_vs_reference": ref_steady / steady["p50"] if steady["p50"] else None,
                "frames_vs_reference": {"max_step": diff.max_step, "fraction": diff.fraction, "within": diff.within()},
            }
        )
    return {
        "model": preset.name,
        "device": str(device),
        "chunks": chunks,
        "reference": chosen[0].name,
        "variants": rows,
        "environment": environment(device),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--attention", default="auto,math,flash", help="backends (comma-separated); first = reference")
    p.add_argument("--compile", action="store_true", help="add the first backend compiled")
    p.add_argument("--chunks", type=int, default=6)
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.chunks < 2:
        p.error("--chunks must be at least 2 (the first chunk is reported apart)")
    try:
        backends = [AttentionBackend(b.strip()) for b in args.attention.split(",") if b.strip()]
    except ValueError as exc:
        p.error(str(exc))
    device = torch.device(args.device)
    try:
        for b in backends:
            KernelConfig(attention=b).check(device)
    except ValueError as exc:
        p.error(str(exc))
    report = run(args.model, device, variants(backends, args.compile), args.chunks, args.quiet)
    for row in report["variants"]:
        f = row["frames_vs_reference"]
        print(
            f"{row['variant']:>16}: first chunk DiT {row['first_chunk_dit_s']:.3f} s, steady p50 "
            f"{row['steady_dit_s']['p50']:.3f} s, speed x{row['speed_vs_reference']:.2f}, frames vs "
            f"{report['reference']}: max step {f['max_step']}, {f['fraction']:.3%} differ "
            f"({'within' if f['within'] else 'OUTSIDE'} tolerance)"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
