"""Every GPU path in one run, for a machine with CUDA: under 8 minutes on one H200-class GPU.

    python -m benchmarks.device_check [--out runs/device]        # on a CUDA machine
    python -m benchmarks.device_check --rehearse [--out DIR]      # the same steps on this CPU

Steps (each a subprocess with a time limit; its log lands in OUT/<step>.log):
1. `gpu_tests`: the `gpu`-marked tests (CUDA IPC channel, the 1-GPU pipeline, the hot-path check
   on the real device).
2. `channel`: the tensor channel on one device (latency and throughput against the pickling queue
   and a device copy); `channel_cross_device` from cuda:0 to cuda:1 when there are two GPUs.
3. `dit_2rank`, `decode_2rank`: the tiny model with a 2-rank DiT (Ulysses over NCCL) and with a
   2-rank sharded decode, each against the 1-rank frames under `FRAME_TOLERANCE`. They need two
   GPUs (NCCL refuses two ranks on one GPU); on one, they are skipped and say so. The rehearsal
   runs `dit_2rank` only: `decode_2rank` is the same code with the other stage's ranks.
4. `kernels`: the attention backends and `--compile` on the gridworld model, speed and frames.
5. `replay`: gridworld on `1gpu`, 24 chunks: steady FPS, real-time factor, DiT idle fraction,
   and each worker's peak device memory against the memory plan's figure for it.
6. `matrix_game`: `matrix-game-2-universal` with seeded random weights at full size on `1gpu`,
   8 chunks: the steady chunk period against the 0.48 s a chunk lasts, and memory against the plan.
7. `dit_batching`: the DiT's chunk at batch 1, 2 and 4 (`benchmarks/dit_batching.py`) for
   `lingbot-world-v2-1.3b` and `matrix-game-2-universal` at full size: time per session-chunk
   against batch 1, which says whether batching sessions into one forward would pay.
8. `matrix_game_live`: `matrix-game-2-universal` (random weights, `1gpu`) served end to end by the
   real server to an aiortc client (`benchmarks/webrtc_replay.py`): time to first frame, the chunk
   period against its 0.48 s chunk, and the unique frames the client got.

Everything lands in OUT/summary.json: per step its status (ok, failed, skipped with the reason),
seconds and figures. It is written again after every step, so a run stopped by a time limit keeps
what it measured. `--rehearse` runs the steps a CPU can (CPU placements, gloo instead of NCCL,
the tiny model, short sizes) and skips the CUDA-only ones, so the script is exercised before the
first GPU ever runs it; the exit status is 0 when no step failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.image_metrics import psnr_db
from benchmarks.savings import CASES
from workers.chunk_geometry import chunk_num_frames
from workers.determinism import frame_difference
from workers.models.presets import MATRIX_GAME_TINY, MATRIX_GAME_UNIVERSAL
from workers.models.savings import NO_SAVINGS

GPU_SCRIPT_BUDGET_S = 8 * 60


@dataclass(frozen=True)
class Target:
    """Where the steps run: the real GPUs, or this CPU standing in for them."""

    rehearse: bool
    gpus: int

    @property
    def device(self) -> str:
        return "cpu" if self.rehearse else "cuda"

    def placement(self, dit_ranks: int = 1, decode_ranks: int = 1) -> dict[str, Any]:
        if self.rehearse:
            return {"encode": ["cpu"], "dit": ["cpu"] * dit_ranks, "decode": ["cpu"] * decode_ranks}
        return {
            "encode": ["cuda:0"],
            "dit": [f"cuda:{i}" for i in range(dit_ranks)],
            "decode": [f"cuda:{i}" for i in range(decode_ranks)],
        }


@dataclass
class Step:
    status: str = "ok"  # ok | failed | skipped
    seconds: float = 0.0
    reason: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)


class Skip(Exception):
    pass


class Failed(Exception):
    pass


class Check:
    def __init__(self, out: Path, target: Target, only: frozenset[str] = frozenset()) -> None:
        self.out = out
        self.target = target
        self.only = only  # empty: every step
        self.steps: dict[str, Step] = {}
        self.started = time.perf_counter()

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if self.only and name not in self.only:
            return
        print(f"== {name}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        step = Step()
        try:
            step.figures = fn()
        except Skip as exc:
            step.status, step.reason = "skipped", str(exc)
        except (Failed, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as exc:
            step.status, step.reason = "failed", f"{type(exc).__name__}: {exc}"
        step.seconds = round(time.perf_counter() - t0, 1)
        self.steps[name] = step
        note = f" ({step.reason})" if step.reason else ""
        print(f"   {step.status} in {step.seconds} s{note}", file=sys.stderr, flush=True)
        self.write_summary()

    def sh(self, name: str, args: list[str], timeout_s: float) -> None:
        """Run `python -m …` with its output in OUT/<name>.log; a non-zero exit fails the step."""
        log = self.out / f"{name}.log"
        with log.open("w") as f:
            rc = subprocess.run(
                [sys.executable, *args], stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s
            ).returncode
        if rc != 0:
            tail = log.read_text().strip().splitlines()[-3:]
            raise Failed(f"exit status {rc}: {' | '.join(tail)}")

    def replay(
        self,
        name: str,
        model: str,
        chunks: int,
        dit_ranks: int = 1,
        decode_ranks: int = 1,
        extra: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """A replay on a placement of the given rank counts; returns RUN.json (frames in OUT/<name>.npy)."""
        placement = self.out / f"{name}.placement.json"
        placement.write_text(json.dumps({"name": name, **self.target.placement(dit_ranks, decode_ranks)}))
        run_json = self.out / f"{name}.json"
        args = ["-m", "benchmarks.replay", "--model", model, "--chunks", str(chunks), "--quiet"]
        args += ["--placement", str(placement), "--out", str(run_json), "--frames", str(self.out / f"{name}.npy")]
        self.sh(name, [*args, *extra], timeout_s=240)
        report: dict[str, Any] = json.loads(run_json.read_text())
        return report

    def write_summary(self) -> dict[str, Any]:
        summary = self.summary()
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def summary(self) -> dict[str, Any]:
        return {
            "rehearsal": self.target.rehearse,
            "gpus": self.target.gpus,
            "gpu_names": [torch.cuda.get_device_name(i) for i in range(self.target.gpus)],
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "total_s": round(time.perf_counter() - self.started, 1),
            "steps": {name: vars(step) for name, step in self.steps.items()},
        }


# ---- the steps ----


def gpu_tests(check: Check) -> dict[str, Any]:
    if check.target.rehearse:
        raise Skip("needs CUDA: the gpu-marked tests skip themselves on a CPU")
    # The container manifests' and the parity suite's modules import test-only packages a GPU image
    # need not have; neither holds a gpu-marked test.
    ignore = ["--ignore=tests/docker", "--ignore=tests/parity"]
    check.sh("gpu_tests", ["-m", "pytest", "-q", "-m", "gpu", *ignore, "tests"], timeout_s=180)
    last = (check.out / "gpu_tests.log").read_text().strip().splitlines()[-1]
    return {"result": last}


def channel(check: Check, consumer_device: str | None = None) -> dict[str, Any]:
    name = "channel" if consumer_device is None else "channel_cross_device"
    args = ["-m", "benchmarks.channel", "--device", check.target.device, "--json"]
    if consumer_device is not None:
        if check.target.gpus < 2:
            raise Skip("needs two CUDA devices")
        args += ["--consumer-device", consumer_device]
    if check.target.rehearse:
        args += ["--sizes-mib", "1", "--iters", "5", "--warmup", "1"]
    log = check.out / f"{name}.log"
    with log.open("w") as err:
        done = subprocess.run([sys.executable, *args], stdout=subprocess.PIPE, stderr=err, timeout=120, text=True)
    if done.returncode != 0:
        raise Failed(f"exit status {done.returncode} (see {log})")
    (check.out / f"{name}.json").write_text(done.stdout)
    report = json.loads(done.stdout)["results"]
    size = max(report["channel"], key=float)
    return {
        "size_mib": float(size),
        "p50_ms": {m: report[m][size]["p50_ms"] for m in ("channel", "channel_view", "pickle_queue")},
        "stream_gib_per_s": {m: report[m][size]["stream_gib_per_s"] for m in ("channel", "channel_view")},
    }


def two_ranks(check: Check, stage: str, reference: np.ndarray | None) -> dict[str, Any]:
    if not check.target.rehearse and check.target.gpus < 2:
        raise Skip("needs two GPUs: NCCL refuses two ranks of one group on one GPU")
    if check.target.rehearse and stage != "dit":
        # The same code with the other stage's ranks; the CPU engine tests cover 2-rank decode itself.
        raise Skip("rehearsed by dit_2rank")
    if reference is None:
        raise Failed("the 1-rank reference replay failed")
    dit_ranks, decode_ranks = (2, 1) if stage == "dit" else (1, 2)
    name = f"{stage}_2rank"
    check.replay(name, "tiny", REFERENCE_CHUNKS, dit_ranks, decode_ranks)
    diff = frame_difference(np.load(check.out / f"{name}.npy"), reference)
    if not diff.within():
        raise Failed(f"frames differ from the 1-rank run beyond the tolerance: {diff}")
    return {"max_step": diff.max_step, "fraction_differing": diff.fraction}


def kernels(check: Check) -> dict[str, Any]:
    args = ["-m", "benchmarks.kernels", "--device", check.target.device, "--json", str(check.out / "kernels.json")]
    if check.target.rehearse:
        args += ["--model", "tiny", "--attention", "auto,math,flash", "--chunks", "2", "--quiet"]
    else:
        from workers.models.attention import fa3_installed

        backends = "auto,flash,cudnn,efficient,math" + (",fa3" if fa3_installed() else "")
        args += ["--model", "gridworld", "--attention", backends, "--compile", "--chunks", "8", "--quiet"]
    check.sh("kernels", args, timeout_s=240)
    report = json.loads((check.out / "kernels.json").read_text())
    rows = {r["variant"]: r for r in report["variants"]}
    outside = [name for name, r in rows.items() if not r["frames_vs_reference"]["within"]]
    if outside:
        raise Failed(f"frames outside the tolerance: {', '.join(outside)}")
    return {
        name: {
            "steady_dit_s_p50": r["steady_dit_s"]["p50"],
            "speed_vs_reference": r["speed_vs_reference"],
            "first_chunk_dit_s": r["first_chunk_dit_s"],
            "max_step": r["frames_vs_reference"]["max_step"],
        }
        for name, r in rows.items()
    }


def replay_figures(report: dict[str, Any]) -> dict[str, Any]:
    """FPS figures and, per worker, the measured peak memory and the plan's error against it."""
    memory = {}
    for worker, planned in (report.get("memory_plan") or {}).items():
        peak = report["peak_memory"][worker]
        measured = peak["device_allocated_bytes"] or peak["host_rss_bytes"]
        memory[worker] = {
            "planned_bytes": planned,
            "measured_bytes": measured,
            "plan_error": (planned - measured) / measured,  # the plan over (+) or under (-) the measure
        }
    keys = ("steady_compute_fps", "real_time_factor", "dit_idle_fraction", "first_frame_s")
    return {k: report.get(k) for k in keys} | {
        "chunk_period_s_p50": report["chunk_period_s"]["p50"],
        "kernels": report["kernels"],
        "memory": memory,
    }


def matrix_game(check: Check) -> dict[str, Any]:
    """Matrix-Game 2.0 at full size on one GPU (random weights: the timing and memory are the model's,
    the frames are noise); rehearsed with its tiny fixture."""
    if check.target.rehearse:
        preset, report = MATRIX_GAME_TINY, check.replay("matrix_game", MATRIX_GAME_TINY.name, 3)
    else:
        preset = MATRIX_GAME_UNIVERSAL
        report = check.replay("matrix_game", preset.name, 8, extra=("--random-weights",))
    figures = replay_figures(report)
    chunk_s = chunk_num_frames(1, preset.chunk_latent_frames) / preset.fps
    return figures | {"chunk_s": chunk_s, "period_over_chunk": figures["chunk_period_s_p50"] / chunk_s}


def dit_batching(check: Check) -> dict[str, Any]:
    out = check.out / "dit_batching.json"
    args = ["-m", "benchmarks.dit_batching", "--device", check.target.device, "--json", str(out)]
    if check.target.rehearse:
        args += ["--model", f"tiny,{MATRIX_GAME_TINY.name}", "--batches", "1,2", "--chunks", "2"]
    check.sh("dit_batching", args, timeout_s=240)
    report = json.loads(out.read_text())
    return {
        m["model"]: {
            f"batch{r['batch']}": {
                "per_session_chunk_s": r["per_session_chunk_s"],
                "speedup_vs_batch1": r["speedup_vs_batch1"],
                "peak_device_bytes": r["peak_device_bytes"],
            }
            for r in m["rows"]
        }
        for m in report["models"]
    }


SAVINGS_CHUNKS = 4


def savings(check: Check) -> dict[str, Any]:
    """Matrix-Game universal (random weights) under each saving: every worker's peak device memory
    against the plan, the chunk period, and PSNR of its frames against the exact run's."""
    preset = MATRIX_GAME_TINY if check.target.rehearse else MATRIX_GAME_UNIVERSAL
    extra = () if check.target.rehearse else ("--random-weights",)
    chunks = 2 if check.target.rehearse else SAVINGS_CHUNKS
    rows: dict[str, Any] = {}
    exact: np.ndarray | None = None
    runs = {"exact": NO_SAVINGS, **CASES}
    for name, saving in runs.items():
        flags = " ".join(saving.names()).split()
        report = check.replay(f"savings_{name}", preset.name, chunks, extra=(*extra, *flags))
        frames = np.load(check.out / f"savings_{name}.npy")
        exact = frames if exact is None else exact
        figures = replay_figures(report)
        rows[name] = {
            "chunk_period_s_p50": figures["chunk_period_s_p50"],
            "memory": figures["memory"],
            "worst_plan_error": max((abs(m["plan_error"]) for m in figures["memory"].values()), default=None),
            "psnr_db_mean": float(psnr_db(frames, exact).mean()),
            "max_abs": int(np.abs(frames.astype(np.int16) - exact.astype(np.int16)).max()),
        }
    return rows


def matrix_game_live(check: Check, flags: str = "", name: str = "matrix_game_live") -> dict[str, Any]:
    """Matrix-Game through the real server and an aiortc client: what a person would get from it."""
    if check.target.rehearse and flags:
        raise Skip("rehearsed by matrix_game_live (the flags are the replay's, rehearsed by savings)")
    if check.target.rehearse:
        preset, serve, duration_s = MATRIX_GAME_TINY, f"--model {MATRIX_GAME_TINY.name} --placement cpu {flags}", 8
    else:
        preset, duration_s = MATRIX_GAME_UNIVERSAL, 20
        serve = f"--model {preset.name} --placement 1gpu --random-weights --max-sessions 1 {flags}"
    out = check.out / f"{name}.json"
    args = ["-m", "benchmarks.webrtc_replay", "--serve", serve, "--duration-s", str(duration_s), "--out", str(out)]
    check.sh(name, args, timeout_s=300)
    viewer = json.loads(out.read_text())["runs"][0]["viewers"][0]
    metrics = viewer["server_session"]["metrics"]
    chunk_s = chunk_num_frames(1, preset.chunk_latent_frames) / preset.fps
    period = metrics["chunk_period_p50_s"]
    return {
        "first_frame_s": metrics["first_frame_s"],
        "chunk_period_p50_s": period,
        "chunk_s": chunk_s,
        "period_over_chunk": None if period is None else period / chunk_s,
        "client_unique_fps": viewer["client_unique_fps"],
        "fps": viewer["fps"],
        "repeated_frames_after_first_chunk": viewer["repeated_frames_after_first_chunk"],
        "glass_to_glass_p50_s": viewer["glass_to_glass_s"]["p50"],
    }


REFERENCE_CHUNKS = 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/device"))
    p.add_argument("--rehearse", action="store_true", help="run what a CPU can, skip the CUDA-only steps")
    p.add_argument("--steps", default="", help="comma-separated steps to run (default: all), e.g. to rerun failed ones")
    args = p.parse_args(argv)
    gpus = torch.cuda.device_count()
    if not args.rehearse and gpus == 0:
        p.error("no CUDA device here; --rehearse runs the steps a CPU can")
    args.out.mkdir(parents=True, exist_ok=True)
    only = frozenset(s for s in args.steps.split(",") if s)
    check = Check(args.out, Target(args.rehearse, 0 if args.rehearse else gpus), only)

    check.run("gpu_tests", lambda: gpu_tests(check))
    check.run("channel", lambda: channel(check))
    check.run("channel_cross_device", lambda: channel(check, "cuda:1"))
    reference: list[np.ndarray] = []
    reports: list[dict[str, Any]] = []

    def one_rank() -> dict[str, Any]:
        reports.append(check.replay("tiny_1rank", "tiny", REFERENCE_CHUNKS))
        reference.append(np.load(args.out / "tiny_1rank.npy"))
        return {"frames": len(reference[0])}

    check.run("tiny_1rank", one_rank)
    check.run("dit_2rank", lambda: two_ranks(check, "dit", reference[0] if reference else None))
    check.run("decode_2rank", lambda: two_ranks(check, "decode", reference[0] if reference else None))
    check.run("kernels", lambda: kernels(check))
    if args.rehearse:  # the tiny 1-rank run already holds every figure this step reads
        check.run("replay", lambda: replay_figures(reports[0]) if reports else {})
    else:
        check.run("replay", lambda: replay_figures(check.replay("replay", "gridworld", 24)))
    check.run("matrix_game", lambda: matrix_game(check))
    check.run("dit_batching", lambda: dit_batching(check))
    check.run("matrix_game_live", lambda: matrix_game_live(check))
    # The release's own decode precision: what its float16 VAE does to the live chunk period.
    check.run("matrix_game_live_fp16", lambda: matrix_game_live(check, "--vae-dtype float16", "matrix_game_live_fp16"))
    check.run("savings", lambda: savings(check))

    summary = check.write_summary()
    for name, step in check.steps.items():
        print(f"{name:>22}: {step.status:<7} {step.seconds:>6.1f} s  {step.reason or ''}")
    over = "" if summary["total_s"] <= GPU_SCRIPT_BUDGET_S or args.rehearse else " (over the 8-minute budget)"
    print(f"summary: {args.out / 'summary.json'}, {summary['total_s']} s{over}")
    return 1 if any(s.status == "failed" for s in check.steps.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
