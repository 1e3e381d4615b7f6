"""Headless replay: drive a session from a control trace, write RUN.json (and optionally an MP4).

    python -m benchmarks.replay --model tiny --trace TRACE.json --chunks 8 --seed 0 \
        --placement cpu --schedule pipelined --out runs/replay.json --video runs/replay.mp4
    python -m benchmarks.replay --recording REC.json --out runs/regenerated.json [--video out.mp4]

With `--recording` (a session's GET /v1/sessions/ID/recording) the session is regenerated as it
ran: its model, seed, prompt, start image, placement, thread count and each chunk's control come
from the recording, and every chunk's digest is compared with the recorded one (benchmarks/recorded.py).

By default the session runs on the multi-process pipeline (`--placement`, `--schedule`);
`--in-process` runs the serial reference engine in this process instead. The trace is replayed on
the media clock: chunk k starts at (frames before it) / fps seconds and takes the control state in
force at that time, so every engine sees the same controls and must produce the same frames at the
same intra-op thread count (`--threads`, default the placement's `cpu_threads_per_worker`; see
`workers/determinism.py`).

Figures: steady compute FPS (generated frames per wall second over the chunks after the first,
i.e. frames per chunk / mean steady chunk period, where chunks leave the generator), chunk compute
(summed stage busy seconds per chunk) and chunk period p50/p90/p99/max, real-time factor (p95
period / chunk media duration), first-frame seconds, per-stage busy/idle seconds, DiT idle
fraction in steady state, peak RSS, and the SHA-256 of all frames with the thread count it holds for.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import queue
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from benchmarks.recorded import Recorded, RecordingError
from benchmarks.stats import environment, peak_rss_bytes, summarize
from benchmarks.timeline import picture_path, write_picture
from benchmarks.trace import Trace, TraceReplayer
from server.media.mp4_writer import Mp4Writer
from server.media.recording import frames_digest
from workers.chunk_geometry import chunk_first_frame, chunk_num_frames
from workers.controls import ChunkControl
from workers.images import fit_image, read_image
from workers.models.attention_backend import AttentionBackend
from workers.models.checkpoint_files import CheckpointMissing
from workers.models.kernels import KernelConfig
from workers.models.presets import DEFAULT_PRESET, PRESETS, ModelPreset
from workers.models.resolve import resolve_weights
from workers.models.savings import Savings, add_savings_arguments, savings_from_arguments
from workers.runtime.memory_plan import machine_capacity, plan_memory
from workers.runtime.peak_memory import measure_peak_memory
from workers.runtime.placement import PLACEMENTS, Placement, PlacementError, get_placement
from workers.runtime.savings_plan import check_savings
from workers.runtime.synthetic import SYNTHETIC, resolve_model
from workers.serial_engine import SerialEngine

ASSETS = Path(__file__).parent / "assets"
DEFAULT_TRACE = ASSETS / "default_trace.json"
DEFAULT_IMAGE = ASSETS / "default_start.png"
STAGES = ("encode", "dit", "decode")


def parse_args(argv: list[str] | None = None, prog: str = "python -m benchmarks.replay") -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    models = [*sorted(PRESETS), SYNTHETIC]
    p.add_argument("preset", nargs="?", metavar="MODEL", choices=models, help=f"as --model (default {DEFAULT_PRESET})")
    p.add_argument("--model", default=None, choices=models, help="model preset")
    p.add_argument("--stage-ms", default=None, help="synthetic model: encode,dit,decode hold times in ms")
    p.add_argument("--synthetic-geometry", default=None, help="synthetic model: preset whose tensor shapes flow")
    p.add_argument(
        "--checkpoint-dir",
        "--checkpoint",
        dest="checkpoint",
        type=Path,
        default=None,
        help="the release's directory as published (default: bundled weights, or the Hugging Face cache)",
    )
    p.add_argument(
        "--assets-dir", type=Path, default=None, help="VAE, umT5 and tokenizer for a DiT-only --checkpoint-dir"
    )
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="control trace (TeleFuser shape)")
    p.add_argument("--chunks", type=int, default=8, help="number of chunks to generate")
    p.add_argument(
        "--chunk-latent-frames",
        "--chunk-frames",
        dest="chunk_frames",
        type=int,
        default=None,
        help="latent frames per chunk (default: the preset's)",
    )
    p.add_argument("--seed", type=int, default=0, help="session seed (noise)")
    p.add_argument("--weights-seed", type=int, default=0, help="seed of random weights when no checkpoint")
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="seeded random weights at the preset's full size, for timing and memory without its checkpoint",
    )
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="start image")
    p.add_argument("--prompt", default="", help="text prompt")
    p.add_argument("--placement", default=None, help=f"one of {sorted(PLACEMENTS)} or a placement .json (default cpu)")
    p.add_argument(
        "--recording",
        type=Path,
        default=None,
        help="regenerate a session from its recording (GET /v1/sessions/ID/recording) and check every chunk's digest",
    )
    p.add_argument("--schedule", default="pipelined", choices=("pipelined", "serial"), help="A/B schedule")
    p.add_argument("--in-process", action="store_true", help="run the serial reference engine in this process")
    p.add_argument("--device", default="cpu", help="torch device for --in-process")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads per CPU process, either engine (default: the placement's cpu_threads_per_worker)",
    )
    p.add_argument(
        "--attention",
        default=AttentionBackend.AUTO.value,
        choices=[b.value for b in AttentionBackend],
        help="attention kernel for the DiT (default auto)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the DiT blocks (first chunk compiles)")
    p.add_argument("--deterministic", action="store_true", help="deterministic algorithms (regression runs)")
    add_savings_arguments(p)
    p.add_argument("--out", type=Path, required=True, help="where to write RUN.json")
    p.add_argument("--video", type=Path, default=None, help="where to write the MP4 (optional)")
    p.add_argument("--frames", type=Path, default=None, help="where to write every frame, uint8 [N, H, W, 3] .npy")
    p.add_argument("--timeline", type=picture_path, default=None, help="also draw the stage timeline (.png/.svg)")
    p.add_argument("--quiet", action="store_true", help="no per-chunk progress lines")
    args = p.parse_args(argv)
    if args.preset is not None and args.model not in (None, args.preset):
        p.error(f"the model is named twice: {args.preset} and --model {args.model}")
    args.model = args.preset or args.model or DEFAULT_PRESET
    args._recorded = None
    if args.recording is not None:
        try:
            _from_recording(args)
        except (RecordingError, CheckpointMissing) as exc:
            p.error(str(exc))
    if args.chunks < 1:
        p.error("--chunks must be at least 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be at least 1")
    try:
        args._preset, args._synthetic = resolve_model(args.model, args.stage_ms, args.synthetic_geometry)
    except ValueError as exc:
        p.error(str(exc))
    if args._synthetic is None:
        try:
            check_savings(savings_for(args), args._preset, placement_for(args), kernels_for(args))
        except (ValueError, PlacementError) as exc:
            p.error(str(exc))
    if args._synthetic is not None and args.in_process:
        p.error("the synthetic model runs on the worker processes; drop --in-process")
    if args._synthetic is None and args.recording is None and not args.random_weights:
        try:
            args.checkpoint = resolve_weights(args._preset, args.checkpoint, args.assets_dir, download=True)
        except CheckpointMissing as exc:
            p.error(str(exc))
    return args


def _from_recording(args: argparse.Namespace) -> None:
    """The recording decides what the session was: model, seed, prompt, image, chunks, placement and
    threads (--placement and --threads still override, to try another); its weights must be these."""
    recorded = Recorded.load(args.recording)
    data = recorded.data
    args.model, args.seed, args.prompt = data["model"], data["seed"], data["prompt"]
    args.image, args.chunks, args.chunk_frames = recorded.image, len(recorded.chunks), data["chunk_latent_frames"]
    if not data["weights"].startswith("random:"):
        args.checkpoint = resolve_weights(PRESETS[args.model], args.checkpoint, args.assets_dir, download=True)
    recorded.check_weights(args.checkpoint, args.weights_seed)
    args._recorded = recorded


def savings_for(args: argparse.Namespace) -> Savings:
    """The flags' savings on top of the recording's (a recording regenerates under what made it)."""
    recorded = None if args._recorded is None else args._recorded.data.get("savings")
    return savings_from_arguments(args, Savings.from_record(recorded))


def kernels_for(args: argparse.Namespace) -> KernelConfig:
    return KernelConfig(AttentionBackend(args.attention), args.compile, args.deterministic)


def placement_for(args: argparse.Namespace) -> Placement:
    """The placement to run (its per-worker thread count overridden by --threads)."""
    if args.placement is None and args._recorded is not None:
        placement = args._recorded.placement()
    else:
        placement = get_placement(args.placement or "cpu")
    if args.threads is not None:
        placement = dataclasses.replace(placement, cpu_threads_per_worker=args.threads)
    return placement


class Recorder:
    """Hashes frames, writes the video and prints progress as chunks arrive (in order)."""

    def __init__(self, args: argparse.Namespace, preset: ModelPreset) -> None:
        self.args = args
        self.digest = hashlib.sha256()
        self.writer = Mp4Writer(args.video, preset.width_px, preset.height_px, preset.fps) if args.video else None
        self.chunks: list[dict[str, Any]] = []
        self.frames: list[np.ndarray] | None = [] if args.frames else None  # kept only when asked for

    def add(self, frames: np.ndarray, row: dict[str, Any]) -> None:
        assert row["index"] == len(self.chunks), f"chunk {row['index']} arrived out of order"
        self.digest.update(frames.tobytes())
        row["frames_sha256"] = frames_digest(frames)  # as a session's recording digests its chunks
        if self.frames is not None:
            self.frames.append(frames)
        if self.writer is not None:
            self.writer.write(frames)
        self.chunks.append(row)
        if not self.args.quiet:
            busy = ", ".join(f"{s} {row[f'{s}_s']:.2f}" for s in STAGES)
            print(
                f"chunk {row['index'] + 1}/{self.args.chunks}: {len(frames)} frames, compute {row['compute_s']:.2f} s "
                f"({busy}) keys={''.join(row['keys']) or '-'}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.frames:
            self.args.frames.parent.mkdir(parents=True, exist_ok=True)
            np.save(self.args.frames, np.concatenate(self.frames))


def _controls_for(
    args: argparse.Namespace, trace: Trace, preset: ModelPreset, chunk: int
) -> Callable[[int], tuple[ChunkControl, bool]]:
    """Chunk index -> its control and pose reset: as recorded, or the trace's state at the chunk's
    first frame on the media clock (the same for every engine)."""
    if args._recorded is not None:
        return cast(Callable[[int], tuple[ChunkControl, bool]], args._recorded.controls())
    replayer = TraceReplayer(trace)
    return lambda index: replayer.control_at(chunk_first_frame(index, chunk) / preset.fps)


def _prompt_changes(args: argparse.Namespace) -> dict[int, tuple[str, int]]:
    """A recording's prompt changes by chunk (a trace has none)."""
    return {} if args._recorded is None else args._recorded.prompt_changes()


def _run_in_process(args: argparse.Namespace, trace: Trace, rec: Recorder, preset: ModelPreset) -> dict[str, Any]:
    device = torch.device(args.device)
    t0 = time.perf_counter()
    engine = SerialEngine.load(
        preset,
        args.checkpoint,
        device,
        weights_seed=args.weights_seed,
        cpu_threads=placement_for(args).cpu_threads_per_worker,
        kernels=kernels_for(args),
        random_weights=args.random_weights,
        savings=savings_for(args),
    )
    load_s = time.perf_counter() - t0
    t_start = time.perf_counter()
    session = engine.create_session(args.image, args.prompt, args.seed, args.chunk_frames)
    controls = _controls_for(args, trace, preset, session.chunk_latent_frames)
    prompts = _prompt_changes(args)
    try:
        for k in range(args.chunks):
            control, reset = controls(k)
            if reset:
                session.control.reset_pose()
            if k in prompts:
                engine.set_prompt(session, *prompts[k])
            result = session.step(control)
            tm = result.timings
            ready_s = time.perf_counter() - t_start
            # One process, one stage after the other: each ends where the next begins.
            dit_end, encode_end = ready_s - tm.decode_s, ready_s - tm.decode_s - tm.denoise_s
            spans = {
                "encode": [encode_end - tm.encode_s, encode_end],
                "dit": [encode_end, dit_end],
                "decode": [dit_end, ready_s],
            }
            rec.add(
                result.frames,
                _row(
                    k,
                    len(result.frames),
                    control,
                    tm.encode_s,
                    tm.denoise_s,
                    tm.decode_s,
                    ready_s,
                    preset,
                    session.chunk_latent_frames,
                    spans,
                ),
            )
    finally:
        session.close()
    peak = dataclasses.asdict(measure_peak_memory(device))
    return {"engine": "in-process serial", "load_s": load_s, "stage_report": None, "peak_memory": {"in-process": peak}}


def _run_pipeline(args: argparse.Namespace, trace: Trace, rec: Recorder, preset: ModelPreset) -> dict[str, Any]:
    from workers.runtime.engine import PipelineEngine
    from workers.runtime.records import ChunkAssembler, ChunkOutput

    placement = placement_for(args)
    engine = PipelineEngine(
        preset,
        placement,
        args.schedule,
        max_sessions=1,
        checkpoint_dir=args.checkpoint,
        weights_seed=args.weights_seed,
        synthetic=args._synthetic,
        kernels=kernels_for(args),
        random_weights=args.random_weights,
        savings=savings_for(args),
    )
    t0 = time.perf_counter()
    engine.start()
    load_s = time.perf_counter() - t0
    if not args.quiet:
        print(f"workers ready in {load_s:.1f} s: {engine.worker_pids()}", file=sys.stderr, flush=True)
    chunk = args.chunk_frames or preset.chunk_latent_frames
    control_source = _controls_for(args, trace, preset, chunk)
    outputs: queue.Queue[ChunkOutput | tuple[str, str | None]] = queue.Queue()

    try:
        image = fit_image(read_image(args.image), preset.height_px, preset.width_px)
        t_start = time.perf_counter()
        session_id = engine.open_session(
            image,
            args.prompt,
            args.seed,
            control_source,
            outputs.put,
            lambda sid, err: outputs.put(("end", err)),
            chunk,
            max_chunks=args.chunks,
        )
        for k, (text, transition_chunks) in _prompt_changes(args).items():
            engine.set_prompt(session_id, text, transition_chunks, at_chunk=k)
        assembler = ChunkAssembler()
        while True:
            got = outputs.get(timeout=600)
            if isinstance(got, tuple):
                if got[1] is not None:
                    raise RuntimeError(f"session failed: {got[1]}")
                break
            item = assembler.add(got)  # frames arrive in parts; the report is per chunk
            if item is None:
                continue
            r = item.record
            s = {stage.value: timing for stage, timing in r.stages.items()}
            assert r.frames_ready_t is not None and r.control is not None
            rec.add(
                item.frames,
                _row(
                    item.index,
                    len(item.frames),
                    r.control,
                    s["encode"].busy_s,
                    s["dit"].busy_s,
                    s["decode"].busy_s,
                    r.frames_ready_t - t_start,
                    preset,
                    chunk,
                    r.stage_spans_s(t_start),
                    r.rank_spans_s(t_start),
                ),
            )
        stats = engine.stats()
        report = engine.stage_report()
    finally:
        engine.shutdown()
    return {
        "engine": f"pipeline ({placement.name}, {args.schedule})",
        "load_s": load_s,
        "stage_report": report,
        "engine_counters": stats.get("counters"),
        "slots_in_use_after": {k: v["slots_in_use"] for k, v in stats.get("stages", {}).items()},
        "peak_memory": {k: v["peak_memory"] for k, v in stats.get("stages", {}).items()},
        "memory_plan": None
        if args._synthetic
        else _planned_bytes(preset, placement, kernels_for(args), savings_for(args)),
    }


def _row(
    index: int,
    num_frames: int,
    control: ChunkControl,
    encode_s: float,
    dit_s: float,
    decode_s: float,
    ready_s: float,
    preset: ModelPreset,
    chunk: int,
    spans_s: dict[str, list[float]],
    rank_spans_s: dict[str, list[list[float]]] | None = None,
) -> dict[str, Any]:
    row = {
        "index": index,
        "media_start_s": chunk_first_frame(index, chunk) / preset.fps,
        "num_frames": num_frames,
        "keys": sorted(control.keys),
        "applied_seq": control.seq,
        "compute_s": encode_s + dit_s + decode_s,
        "encode_s": encode_s,
        "dit_s": dit_s,
        "decode_s": decode_s,
        "frames_ready_s": ready_s,
        # Each stage's compute for this chunk, [start, end] in seconds from the session's start (the
        # stage timeline draws them: benchmarks/timeline.py).
        "stage_spans_s": spans_s,
    }
    if rank_spans_s:  # stages on more than one rank: one lane per rank
        row["rank_spans_s"] = rank_spans_s
    return row


def _planned_bytes(
    preset: ModelPreset, placement: Placement, kernels: KernelConfig, savings: Savings
) -> dict[str, int]:
    """What the memory plan expects each worker to hold for this run's one session, to compare with
    its measured peak (host resident set on CPU, allocated bytes on CUDA)."""
    plan = plan_memory(preset, placement, 1, machine_capacity(), kernels, savings=savings)
    return {w.name: w.total_bytes for d in plan.devices for w in d.workers}


def _dit_device(args: argparse.Namespace) -> torch.device:
    return torch.device(args.device) if args.in_process else placement_for(args).stage_devices("dit")[0]


def _dit_idle_fraction(stage_report: dict[str, Any] | None, chunks: list[dict[str, Any]]) -> float | None:
    """DiT idle time / wall time between its first and last chunk outputs (steady state)."""
    if not stage_report or len(chunks) < 3:
        return None
    intervals = stage_report["dit"]["idle_intervals"]
    # The steady window: after the first chunk's frames are out, until the last chunk's are.
    start, end = chunks[0]["frames_ready_s"], chunks[-1]["frames_ready_s"]
    idle = sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)
    return idle / (end - start) if end > start else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    trace = Trace.load(args.trace)
    preset = args._preset  # resolved (and validated) by parse_args
    weights = preset.weights_note if args.checkpoint is None else f"checkpoint {args.checkpoint}"
    if args.random_weights:
        weights = f"random weights (seed {args.weights_seed}): timing and memory only, the frames are noise"
    if not args.quiet:
        print(
            f"model {preset.name} ({weights}), {preset.width_px}x{preset.height_px} @ {preset.fps} fps",
            file=sys.stderr,
            flush=True,
        )
    rec = Recorder(args, preset)
    try:
        meta = (_run_in_process if args.in_process else _run_pipeline)(args, trace, rec, preset)
    finally:
        rec.close()
    chunks = rec.chunks
    steady = chunks[1:]
    steady_frames = sum(c["num_frames"] for c in steady)
    num_frames = sum(c["num_frames"] for c in chunks)
    periods = [b["frames_ready_s"] - a["frames_ready_s"] for a, b in itertools.pairwise(chunks)]
    chunk_media_s = chunk_num_frames(1, args.chunk_frames or preset.chunk_latent_frames) / preset.fps
    steady_wall = chunks[-1]["frames_ready_s"] - chunks[0]["frames_ready_s"] if len(chunks) > 1 else 0.0
    stage_report = meta.pop("stage_report")
    report: dict[str, Any] = {
        "model": {
            "preset": preset.name,
            "weights": weights,
            "width_px": preset.width_px,
            "height_px": preset.height_px,
            "fps": preset.fps,
        },
        **meta,
        "num_chunks": len(chunks),
        "num_frames": num_frames,
        "media_duration_s": num_frames / preset.fps,
        "first_frame_s": chunks[0]["frames_ready_s"],
        # Frames per wall second where chunks leave the generator; summed stage busy time is not a
        # rate for a pipeline, so it is reported per stage in stage_seconds instead.
        "steady_compute_fps": steady_frames / steady_wall if steady_wall > 0 else None,
        "chunk_compute_s": summarize([c["compute_s"] for c in steady]),
        "first_chunk_compute_s": chunks[0]["compute_s"],
        "chunk_period_s": summarize(periods),
        "real_time_factor": float(np.percentile(periods, 95)) / chunk_media_s if periods else None,
        "stage_seconds": {
            s: {
                "busy_s": sum(c[f"{s}_s"] for c in chunks),
                "idle_s": None if stage_report is None else stage_report[s]["idle_s"],
            }
            for s in STAGES
        },
        "dit_idle_fraction": _dit_idle_fraction(stage_report, chunks),
        "peak_rss_bytes": peak_rss_bytes(),
        "frames_sha256": rec.digest.hexdigest(),
        "intra_op_threads": placement_for(args).cpu_threads_per_worker,  # the hash holds for this count
        "kernels": kernels_for(args).record(_dit_device(args)),
        "savings": savings_for(args).record(),
        "chunks": chunks,
        "environment": environment(torch.device(args.device if args.in_process else "cpu")),
        "request": {k: _request_value(v) for k, v in vars(args).items() if not k.startswith("_")},
    }
    if args._recorded is not None:
        report["recording"] = args._recorded.verdict([c["frames_sha256"] for c in chunks], placement_for(args))
    return report


def _request_value(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.ndarray):
        return f"image {value.shape[1]}x{value.shape[0]} from the recording"
    return value


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks.replay") -> int:
    args = parse_args(argv, prog)
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    line = f"frames: {report['num_frames']} ({report['media_duration_s']:.2f} s of video)"
    if report["steady_compute_fps"]:
        line += (
            f", steady compute {report['steady_compute_fps']:.2f} FPS, "
            f"real-time factor {report['real_time_factor']:.2f}"
        )
    print(line)
    print(f"report: {args.out}")
    verdict = report.get("recording")
    if verdict is not None:
        print(f"recording: {verdict['summary']}")
    if args.video:
        print(f"video:  {args.video}")
    if args.timeline is not None:
        why = write_picture([report], args.timeline, [args.schedule])
        print(f"timeline: {args.timeline}" if why is None else f"no timeline: {why}")
        if why is not None:
            return 2
    return 1 if verdict is not None and not verdict["ok"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
