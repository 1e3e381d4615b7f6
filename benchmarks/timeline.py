"""The stage timeline of a run: whether encode, DiT and decode overlap, and where a stall came from.

    python -m benchmarks.timeline RUN.json [RUN_B.json] --out runs/timeline.png   (or .svg)

From one RUN.json (`benchmarks.replay`), or two side by side on one time scale for an A/B (e.g. the
same trace with `--schedule pipelined` and `--schedule serial`). One lane per stage, one bar per
chunk and stage (its compute, from the chunk's `stage_spans_s`), a tick where each chunk's frames
left the generator, and a marker where a chunk applied a new control (the frames it reached). The
title carries the run's steady FPS and DiT idle fraction.

matplotlib is an optional extra (`pip install -e '.[plot]'`): the server never needs it, and
`timeline_bars` (what the picture shows, as data) works without it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAGES = ("encode", "dit", "decode")
COLOURS = {"encode": "#4c78a8", "dit": "#f58518", "decode": "#54a24b"}


@dataclass(frozen=True)
class Bar:
    lane: str  # a stage
    chunk: int
    start_s: float
    end_s: float


def timeline_bars(report: dict[str, Any]) -> list[Bar]:
    """One bar per chunk and stage, from a RUN.json report."""
    return [
        Bar(stage, chunk["index"], span[0], span[1])
        for chunk in report["chunks"]
        for stage, span in chunk.get("stage_spans_s", {}).items()
    ]


def overlap_s(bars: list[Bar], lane_a: str, lane_b: str) -> float:
    """Seconds during which `lane_a` computes one chunk while `lane_b` computes another: the
    pipelining the picture makes visible (0 for a serial schedule)."""
    total = 0.0
    for a in (b for b in bars if b.lane == lane_a):
        for b in (b for b in bars if b.lane == lane_b and b.chunk != a.chunk):
            total += max(0.0, min(a.end_s, b.end_s) - max(a.start_s, b.start_s))
    return total


def _title(report: dict[str, Any]) -> str:
    fps = report.get("steady_compute_fps")
    idle = report.get("dit_idle_fraction")
    parts = [report.get("engine", "run"), report["model"]["preset"]]
    if fps:
        parts.append(f"{fps:.1f} FPS steady")
    if idle is not None:
        parts.append(f"DiT idle {idle:.0%}")
    return ", ".join(parts)


def draw(reports: list[dict[str, Any]], out: Path) -> None:
    """Write the picture (PNG or SVG, by `out`'s suffix): one panel per report, one time scale."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    ends = [b.end_s for r in reports for b in timeline_bars(r)]
    end = max(*ends, *(c["frames_ready_s"] for r in reports for c in r["chunks"]))
    lanes = [*STAGES, "frames out"]
    fig, axes = plt.subplots(len(reports), 1, figsize=(12, 1.0 + 1.3 * len(reports) * len(lanes) / 2), squeeze=False)
    for ax, report in zip(axes[:, 0], reports, strict=True):
        for bar in timeline_bars(report):
            y = lanes.index(bar.lane)
            ax.broken_barh([(bar.start_s, bar.end_s - bar.start_s)], (y - 0.35, 0.7), color=COLOURS[bar.lane])
            ax.text(
                (bar.start_s + bar.end_s) / 2, y, str(bar.chunk), ha="center", va="center", fontsize=7, color="white"
            )
        y_out = lanes.index("frames out")
        previous: tuple[str, ...] | None = None
        for chunk in report["chunks"]:
            ax.plot([chunk["frames_ready_s"]] * 2, [y_out - 0.35, y_out + 0.35], color="black", linewidth=1)
            keys = tuple(chunk["keys"])
            if previous is not None and keys != previous:  # a new control reached these frames
                ax.plot(chunk["frames_ready_s"], y_out + 0.45, marker="v", color="crimson", markersize=6)
            previous = keys
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(-0.6, len(lanes) - 0.3)
        ax.set_xlim(0, end * 1.02)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(_title(report), fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("seconds from the session's start (▼: a new control reached these frames)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="one RUN.json, or two for an A/B")
    p.add_argument("--out", type=Path, required=True, help="the picture: .png or .svg")
    args = p.parse_args(argv)
    if len(args.runs) > 2:
        p.error("one run, or two for an A/B")
    if args.out.suffix not in (".png", ".svg"):
        p.error("--out must end in .png or .svg")
    reports = [json.loads(path.read_text()) for path in args.runs]
    missing = [str(path) for path, r in zip(args.runs, reports, strict=True) if not timeline_bars(r)]
    if missing:
        p.error(f"no stage spans in {', '.join(missing)}: produce it with this version of benchmarks.replay")
    try:
        draw(reports, args.out)
    except ImportError:
        print("error: the timeline needs matplotlib: pip install -e '.[plot]'", file=sys.stderr)
        return 2
    for path, report in zip(args.runs, reports, strict=True):
        bars = timeline_bars(report)
        print(f"{path}: {len(report['chunks'])} chunks, DiT/decode overlap {overlap_s(bars, 'dit', 'decode'):.2f} s")
    print(f"timeline: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
