"""The stage timeline of a run: whether encode, DiT and decode overlap, and where a stall came from.

    python -m benchmarks.timeline RUN.json [RUN_B.json] --out runs/timeline.png   (or .svg)
    python -m benchmarks.timeline http://127.0.0.1:8000/v1/sessions/ID/timeline --token T --out live.png

From one report, or two side by side on one time scale for an A/B (e.g. the same trace with
`--schedule pipelined` and `--schedule serial`). A report is a `benchmarks.replay` RUN.json, a
`benchmarks.webrtc_replay` viewer's `timeline`, or a live session's `GET /v1/sessions/{id}/timeline`
(a file or the URL): their chunks have one shape.

Lanes, top to bottom: one per stage, or per stage and rank where a stage runs on several (`dit r1`),
one bar per chunk (its compute span); `frames out`, a tick where each chunk's frames left the
generator, a ▼ where a chunk applied a new control, and arrows from a control's arrival to the first
frame it reached on the wire (live runs); `pacer buffer`, the frames queued ahead of playback at each
tick, with every repeated frame (a tick with nothing new to show) marked in red (live runs). The
title carries the run's steady FPS and DiT idle fraction where the report has them.

matplotlib is an optional extra (`pip install -e '.[plot]'`): the server never needs it, and
`timeline_bars` / `lanes` (what the picture shows, as data) work without it.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAGES = ("encode", "dit", "decode")
COLOURS = {"encode": "#4c78a8", "dit": "#f58518", "decode": "#54a24b"}
FRAMES_LANE = "frames out"
PACER_LANE = "pacer buffer"


@dataclass(frozen=True)
class Bar:
    stage: str
    chunk: int
    start_s: float
    end_s: float
    rank: int | None = None  # set where the stage runs on several ranks

    @property
    def lane(self) -> str:
        return self.stage if self.rank is None else f"{self.stage} r{self.rank}"


def timeline_bars(report: dict[str, Any]) -> list[Bar]:
    """One bar per chunk and stage (per rank, for stages on several ranks)."""
    bars = []
    for chunk in report["chunks"]:
        ranks = chunk.get("rank_spans_s", {})
        for stage, span in chunk.get("stage_spans_s", {}).items():
            if stage in ranks:
                bars += [Bar(stage, chunk["index"], s[0], s[1], r) for r, s in enumerate(ranks[stage])]
            else:
                bars.append(Bar(stage, chunk["index"], span[0], span[1]))
    return bars


def lanes(report: dict[str, Any]) -> list[str]:
    """The picture's lanes for this report, top to bottom."""
    present = {b.lane for b in timeline_bars(report)}
    ordered = sorted(present, key=lambda lane: (STAGES.index(lane.split()[0]), lane))
    ordered.append(FRAMES_LANE)
    if report.get("pacer"):
        ordered.append(PACER_LANE)
    return ordered


def repeat_times_s(report: dict[str, Any]) -> list[float]:
    """When the pacer repeated a frame (live runs; empty otherwise)."""
    pacer = report.get("pacer") or {}
    return [t for t, rep in zip(pacer.get("t_s", []), pacer.get("repeated", []), strict=True) if rep]


def overlap_s(bars: list[Bar], stage_a: str, stage_b: str) -> float:
    """Seconds during which `stage_a` computes one chunk while `stage_b` computes another: the
    pipelining the picture makes visible (0 for a serial schedule). Rank 0's bars where a stage has
    several."""
    a_bars = [b for b in bars if b.stage == stage_a and not b.rank]
    b_bars = [b for b in bars if b.stage == stage_b and not b.rank]
    total = 0.0
    for a in a_bars:
        for b in (b for b in b_bars if b.chunk != a.chunk):
            total += max(0.0, min(a.end_s, b.end_s) - max(a.start_s, b.start_s))
    return total


def _title(report: dict[str, Any], name: str) -> str:
    fps = report.get("steady_compute_fps")
    idle = report.get("dit_idle_fraction")
    model = report.get("model")
    parts = [report.get("engine") or name]
    if isinstance(model, dict):
        parts.append(model["preset"])
    if fps:
        parts.append(f"{fps:.1f} FPS steady")
    if idle is not None:
        parts.append(f"DiT idle {idle:.0%}")
    if report.get("pacer"):
        parts.append(f"{len(repeat_times_s(report))} repeated frames")
    return ", ".join(parts)


def _span(report: dict[str, Any]) -> tuple[float, float]:
    times = [t for b in timeline_bars(report) for t in (b.start_s, b.end_s)]
    times += [c["frames_ready_s"] for c in report["chunks"] if c.get("frames_ready_s") is not None]
    times += (report.get("pacer") or {}).get("t_s", [])
    return min(times), max(times)


def _draw_frames_lane(ax: Any, report: dict[str, Any], y: float) -> None:
    previous: tuple[str, ...] | None = None
    for chunk in report["chunks"]:
        ready = chunk.get("frames_ready_s")
        if ready is None:
            continue
        ax.plot([ready] * 2, [y - 0.35, y + 0.35], color="black", linewidth=1)
        keys = tuple(chunk["keys"])
        if previous is not None and keys != previous:  # a new control reached these frames
            ax.plot(ready, y - 0.45, marker="v", color="crimson", markersize=6)
        previous = keys
    for control in report.get("controls", []):  # arrival → the first frame it reached, on the wire
        ax.annotate(
            "",
            xy=(control["shown_s"], y + 0.3),
            xytext=(control["arrived_s"], y + 0.3),
            arrowprops={"arrowstyle": "->", "color": "crimson", "linewidth": 0.8},
        )


def _draw_pacer_lane(ax: Any, report: dict[str, Any], y: float) -> None:
    pacer = report["pacer"]
    levels = pacer["buffered_frames"]
    top = max(max(levels, default=0), 1)
    # Higher is fuller: the band's bottom edge (y + 0.4 on the inverted axis) is an empty buffer.
    ax.step(pacer["t_s"], [y + 0.4 - 0.8 * level / top for level in levels], where="post", color="#6f4e7c")
    ax.text(_span(report)[0], y - 0.42, f"max {top} frames", fontsize=6, va="bottom", color="#6f4e7c")
    for t in repeat_times_s(report):
        ax.plot([t] * 2, [y + 0.1, y + 0.45], color="red", linewidth=1)


def draw(reports: list[dict[str, Any]], out: Path, names: list[str] | None = None) -> None:
    """Write the picture (PNG or SVG, by `out`'s suffix): one panel per report, one time scale."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    names = names or [f"run {i + 1}" for i in range(len(reports))]
    start = min(_span(r)[0] for r in reports)
    end = max(_span(r)[1] for r in reports)
    heights = [len(lanes(r)) for r in reports]
    fig, axes = plt.subplots(
        len(reports), 1, figsize=(12, 0.8 + 0.5 * sum(heights)), squeeze=False, height_ratios=heights
    )
    for ax, report, name in zip(axes[:, 0], reports, names, strict=True):
        rows = lanes(report)
        for bar in timeline_bars(report):
            y = rows.index(bar.lane)
            ax.broken_barh([(bar.start_s, bar.end_s - bar.start_s)], (y - 0.35, 0.7), color=COLOURS[bar.stage])
            ax.text(
                (bar.start_s + bar.end_s) / 2, y, str(bar.chunk), ha="center", va="center", fontsize=7, color="white"
            )
        _draw_frames_lane(ax, report, rows.index(FRAMES_LANE))
        if PACER_LANE in rows:
            _draw_pacer_lane(ax, report, rows.index(PACER_LANE))
        ax.set_yticks(range(len(rows)), rows)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_xlim(start - 0.01 * (end - start), end + 0.02 * (end - start))
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(_title(report, name), fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(
        "seconds from the session's start (▼ a new control reached these frames; red: a repeated frame)"
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def picture_path(text: str) -> Path:
    """argparse type of every timeline picture option: a .png or .svg path, refused before any run."""
    path = Path(text)
    if path.suffix not in (".png", ".svg"):
        raise argparse.ArgumentTypeError(f"the timeline picture must end in .png or .svg, got {path.name!r}")
    return path


def write_picture(reports: list[dict[str, Any]], out: Path, names: list[str] | None = None) -> str | None:
    """`draw`, for the benchmarks' `--timeline`: None when written, else why not (for the user)."""
    if not all(timeline_bars(r) for r in reports):
        return "the run has no stage spans to draw"
    try:
        draw(reports, out, names)
    except ImportError:
        return "the timeline needs matplotlib: pip install -e '.[plot]'"
    return None


def read_report(source: str, token: str | None) -> dict[str, Any]:
    """A report from a file, or from a server's timeline URL."""
    if source.startswith(("http://", "https://")):
        request = urllib.request.Request(source, headers={"Authorization": f"Bearer {token}"} if token else {})
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())
    return json.loads(Path(source).read_text())


def _reports_of(source: str, data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, report) pairs: a webrtc_replay report holds one per run (its first viewer's)."""
    if "runs" in data and "chunks" not in data:
        return [(f"{run['dispatch']}", run["viewers"][0]["timeline"]) for run in data["runs"]]
    return [(Path(source).stem if "://" not in source else "live session", data)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.timeline", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="one report (file or timeline URL), or two for an A/B")
    p.add_argument("--out", type=picture_path, required=True, help="the picture: .png or .svg")
    p.add_argument("--token", default=None, help="for a URL: the session's token or the server's API token")
    args = p.parse_args(argv)
    named = [pair for source in args.runs for pair in _reports_of(source, read_report(source, args.token))]
    if len(named) > 2:
        p.error(f"one report, or two for an A/B (got {len(named)})")
    missing = [name for name, r in named if not timeline_bars(r)]
    if missing:
        p.error(f"no stage spans in {', '.join(missing)}: produce it with this version of the benchmarks")
    names, reports = [n for n, _ in named], [r for _, r in named]
    try:
        draw(reports, args.out, names)
    except ImportError:
        print("error: the timeline needs matplotlib: pip install -e '.[plot]'", file=sys.stderr)
        return 2
    for name, report in named:
        bars = timeline_bars(report)
        line = f"{name}: {len(report['chunks'])} chunks, DiT/decode overlap {overlap_s(bars, 'dit', 'decode'):.2f} s"
        if report.get("pacer"):
            line += f", {len(repeat_times_s(report))} repeated frames"
        print(line)
    print(f"timeline: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
