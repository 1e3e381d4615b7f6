"""Headless replay: drive a session from a control trace, write RUN.json (and optionally an MP4).

    python -m benchmarks.replay --model tiny --trace TRACE.json --chunks 8 --seed 0 \
        --out runs/replay.json --video runs/replay.mp4

The trace is replayed on the media clock: chunk k starts at (frames before it) / fps seconds and
takes the control state in force at that time. Figures (DESIGN §6): steady compute FPS (frames of
chunks after the first / their compute seconds), chunk compute p50/p90/p99/max, first-frame
seconds, per-stage seconds, peak RSS, and the SHA-256 of all frames for determinism checks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.stats import environment, peak_rss_bytes, summarize
from benchmarks.trace import Trace, TraceReplayer
from benchmarks.video import Mp4Writer
from workers.models.presets import PRESETS
from workers.serial_engine import SerialEngine

ASSETS = Path(__file__).parent / "assets"
DEFAULT_TRACE = ASSETS / "default_trace.json"
DEFAULT_IMAGE = ASSETS / "default_start.png"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS), help="model preset")
    p.add_argument("--checkpoint", type=Path, default=None, help="checkpoint directory (default: random weights)")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="control trace (TeleFuser shape)")
    p.add_argument("--chunks", type=int, default=8, help="number of chunks to generate")
    p.add_argument("--chunk-frames", type=int, default=None, help="latent frames per chunk (preset default)")
    p.add_argument("--seed", type=int, default=0, help="session seed (noise)")
    p.add_argument("--weights-seed", type=int, default=0, help="seed of random weights when no checkpoint")
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="start image")
    p.add_argument("--prompt", default="a quiet countryside path on a sunny day", help="text prompt")
    p.add_argument("--device", default="cpu", help="torch device for all stages")
    p.add_argument("--out", type=Path, required=True, help="where to write RUN.json")
    p.add_argument("--video", type=Path, default=None, help="where to write the MP4 (optional)")
    p.add_argument("--quiet", action="store_true", help="no per-chunk progress lines")
    args = p.parse_args(argv)
    if args.chunks < 1:
        p.error("--chunks must be at least 1")
    return args


def run(args: argparse.Namespace) -> dict[str, object]:
    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    trace = Trace.load(args.trace)
    device = torch.device(args.device)
    t_load = time.perf_counter()
    engine = SerialEngine.load(args.model, args.checkpoint, device, weights_seed=args.weights_seed)
    load_s = time.perf_counter() - t_load
    preset = engine.preset
    weights = preset.weights_note if args.checkpoint is None else f"checkpoint {args.checkpoint}"
    log(
        f"model {preset.name} ({weights}) on {device}, {preset.width_px}x{preset.height_px} @ {preset.fps} fps; "
        f"loaded in {load_s:.2f} s"
    )

    t_start = time.perf_counter()
    session = engine.create_session(args.image, args.prompt, args.seed, args.chunk_frames)
    replayer = TraceReplayer(trace)
    digest = hashlib.sha256()
    writer = Mp4Writer(args.video, preset.width_px, preset.height_px, preset.fps) if args.video else None
    chunks: list[dict[str, object]] = []
    first_frame_s = None
    try:
        for k in range(args.chunks):
            start_media_s = session.frames_done / preset.fps
            control, reset = replayer.control_at(start_media_s)
            if reset:
                session.camera.reset_pose()
            result = session.step(control)
            if first_frame_s is None:
                first_frame_s = time.perf_counter() - t_start
            digest.update(result.frames.tobytes())
            if writer is not None:
                writer.write(result.frames)
            tm = result.timings
            chunks.append(
                {
                    "index": k,
                    "media_start_s": start_media_s,
                    "num_frames": len(result.frames),
                    "keys": sorted(control.keys),
                    "applied_seq": control.seq,
                    "compute_s": tm.total_s,
                    "encode_s": tm.encode_s,
                    "denoise_s": tm.denoise_s,
                    "decode_s": tm.decode_s,
                }
            )
            log(
                f"chunk {k + 1}/{args.chunks}: {len(result.frames)} frames in {tm.total_s:.2f} s "
                f"(encode {tm.encode_s:.2f}, denoise {tm.denoise_s:.2f}, decode {tm.decode_s:.2f}) "
                f"keys={''.join(sorted(control.keys)) or '-'}"
            )
    finally:
        session.close()
        if writer is not None:
            writer.close()

    steady = chunks[1:]
    steady_frames = sum(int(c["num_frames"]) for c in steady)  # type: ignore[call-overload]
    steady_compute = sum(float(c["compute_s"]) for c in steady)  # type: ignore[arg-type]
    num_frames = sum(int(c["num_frames"]) for c in chunks)  # type: ignore[call-overload]
    report: dict[str, object] = {
        "model": {
            "preset": preset.name,
            "weights": weights,
            "width_px": preset.width_px,
            "height_px": preset.height_px,
            "fps": preset.fps,
        },
        "schedule": "serial-engine",
        "num_chunks": len(chunks),
        "num_frames": num_frames,
        "media_duration_s": num_frames / preset.fps,
        "load_s": load_s,
        "first_frame_s": first_frame_s,
        "steady_compute_fps": steady_frames / steady_compute if steady_compute > 0 else None,
        "chunk_compute_s": summarize([float(c["compute_s"]) for c in steady]),  # type: ignore[arg-type]
        "first_chunk_compute_s": chunks[0]["compute_s"],
        "stage_seconds": {s: sum(float(c[f"{s}_s"]) for c in chunks) for s in ("encode", "denoise", "decode")},  # type: ignore[arg-type]
        "peak_rss_bytes": peak_rss_bytes(),
        "frames_sha256": digest.hexdigest(),
        "chunks": chunks,
        "environment": environment(device),
        "request": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    if steady_compute > 0:
        report["real_time_ratio"] = (steady_frames / steady_compute) / preset.fps
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    fps = report["steady_compute_fps"]
    print(
        f"frames: {report['num_frames']} ({report['media_duration_s']:.2f} s of video), steady compute FPS: {fps:.2f}"
        if fps
        else f"frames: {report['num_frames']}"
    )
    print(f"report: {args.out}")
    if args.video:
        print(f"video:  {args.video}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
