"""Pipeline overhead: the real scheduler, workers and channels with fixed-time stages.

    python -m benchmarks.pipeline --stage-ms 40,80,50 --chunks 40 [--schedule both] [--json]

Each stage holds its worker for a fixed time per chunk (encode, DiT, decode, in ms) and moves
real tensors of the preset's shapes through the real channels. Compared with the ideal bounds —
pipelined 1/max(stage), serial 1/sum(stage) — the measured steady throughput shows what the
runtime itself costs: `pipeline_efficiency` = measured / bottleneck bound (target ≥ 0.95
pipelined), and for serial the measured / serial bound.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from typing import Any

import numpy as np

from benchmarks.stats import summarize
from workers.controls import ChunkControl
from workers.models.presets import PRESETS
from workers.runtime.engine import PipelineEngine
from workers.runtime.placement import PLACEMENTS, get_placement
from workers.runtime.synthetic import SyntheticModel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pipeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--stage-ms", default="40,80,50", help="encode,dit,decode hold times in ms")
    p.add_argument("--chunks", type=int, default=40, help="chunks per run")
    p.add_argument("--schedule", default="both", choices=("pipelined", "serial", "both"))
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS), help="preset whose tensor shapes flow")
    p.add_argument("--placement", default="cpu", help=f"one of {sorted(PLACEMENTS)} or a .json file")
    p.add_argument("--warmup-chunks", type=int, default=2, help="chunks left out of the steady window")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    args = p.parse_args(argv)
    try:
        ms = [float(x) for x in args.stage_ms.split(",")]
    except ValueError:
        p.error("--stage-ms takes three numbers: encode,dit,decode")
    if len(ms) != 3 or min(ms) <= 0:
        p.error("--stage-ms takes three positive numbers: encode,dit,decode")
    if args.chunks < args.warmup_chunks + 3:
        p.error("--chunks must leave at least 3 chunks after the warm-up")
    args.synthetic = SyntheticModel(ms[0] / 1000, ms[1] / 1000, ms[2] / 1000, geometry=args.model)
    return args


def run_schedule(args: argparse.Namespace, schedule: str) -> dict[str, Any]:
    preset = args.synthetic.preset()
    placement = get_placement(args.placement)
    image = np.zeros((preset.height_px, preset.width_px, 3), np.uint8)
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    with PipelineEngine(preset, placement, schedule, synthetic=args.synthetic) as engine:
        engine.open_session(
            image,
            "",
            0,
            lambda k: (ChunkControl(seq=k), False),
            lambda out: events.put(("chunk", time.perf_counter())) if out.last else None,
            lambda sid, err: events.put(("end", err)),
            max_chunks=args.chunks,
        )
        ready: list[float] = []
        while True:
            kind, value = events.get(timeout=600)
            if kind == "end":
                if value is not None:
                    raise RuntimeError(value)
                break
            ready.append(value)
            if len(ready) % 10 == 0 or len(ready) == args.chunks:
                print(f"{schedule}: {len(ready)}/{args.chunks} chunks", file=sys.stderr, flush=True)
        report = engine.stage_report()
    steady = ready[args.warmup_chunks :]
    periods = np.diff(steady)
    throughput = (len(steady) - 1) / (steady[-1] - steady[0])
    stage_s = [args.synthetic.encode_s, args.synthetic.dit_s, args.synthetic.decode_s]
    bottleneck, serial = 1 / max(stage_s), 1 / sum(stage_s)
    bound = bottleneck if schedule == "pipelined" else serial
    return {
        "schedule": schedule,
        "chunks_per_s": throughput,
        "bottleneck_bound_chunks_per_s": bottleneck,
        "serial_bound_chunks_per_s": serial,
        "pipeline_efficiency": throughput / bottleneck,
        "efficiency_vs_own_bound": throughput / bound,
        "chunk_period_s": summarize(periods.tolist()),
        "stage_busy_s": {s: r["busy_s"] for s, r in report.items()},
        "stage_idle_s": {s: r["idle_s"] for s, r in report.items()},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    schedules = ("pipelined", "serial") if args.schedule == "both" else (args.schedule,)
    results = [run_schedule(args, s) for s in schedules]
    out = {
        "stage_ms": args.stage_ms,
        "chunks": args.chunks,
        "model_shapes": args.model,
        "placement": args.placement,
        "results": results,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for r in results:
            target = " (target ≥ 0.95)" if r["schedule"] == "pipelined" else ""
            print(
                f"{r['schedule']:>9}: {r['chunks_per_s']:.2f} chunks/s; bottleneck bound "
                f"{r['bottleneck_bound_chunks_per_s']:.2f}, serial bound {r['serial_bound_chunks_per_s']:.2f}; "
                f"pipeline_efficiency {r['pipeline_efficiency']:.3f}{target}, "
                f"vs its own bound {r['efficiency_vs_own_bound']:.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
