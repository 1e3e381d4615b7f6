"""Spectators: what watching a session costs its driver and the server, and how soon a spectator sees video.

    # the default model (gridworld, 128×128 at 16 FPS) on the cpu placement: a driver alone for 60 s,
    # then a driver with 8 spectators for 60 s
    python -m benchmarks.spectators --out runs/spectators.json
    # a quick look
    python -m benchmarks.spectators --duration-s 15 --spectators 2 --out runs/spectators-short.json
    # another server configuration (arguments of `python -m server`)
    python -m benchmarks.spectators --serve "--model synthetic --stage-ms 50,400,300" --out runs/spectators-syn.json

One server is started (`--serve`, default `--placement cpu` with the default model) and two phases run
against it, one after the other:

- A, the driver alone: a session replays the control trace (default: the seeded random walk of
  `benchmarks.webrtc_replay`, replayed by its `replay`) for `--duration-s`;
- B, with spectators: a new session replays the same trace with the same seed for the same time.
  Once its video flows (its second chunk received), `--spectators` spectators join one every
  `--join-interval-s` with the session's `watch_url` and `watch_token`, and watch until the
  replay ends.

Per phase, over a steady window (from `--warmup-s` after the replay started, and not before every
spectator sees video, to the replay's end), divided by the window's wall time:

- the server's CPU: utime + stime of the `python -m server` process alone, its event loop, pacer,
  shared encoder and every viewer's RTP sender (psutil, i.e. /proc/<pid>/stat); beside it, for
  context, its stage workers', this process's, the spectator processes' and the whole machine's,
  whose remainder is everyone else's load;
- the server's own figures: the session's `metrics` (frames sent/repeated/dropped, spectators), the
  engine's stage busy seconds and `event_loop_lag_p99_s` (`/v1/engine`, over its last ten minutes),
  and from `/metrics` the window's event-loop lag p99 (a histogram bound) and the spectators'
  skipped frames (counted as they leave).

Per viewer, over everything it received (`benchmarks/delivery.py`): unique FPS and its fraction of
the target, repeats, stalls; the driver's glass-to-glass p50/p95 (spectators send no controls). A
spectator's frames are put on the session's clock (`video_start`) and identified by the session's
`chunk` messages it received (the server sends the last few again as a spectator connects, for the
frames already queued when it joined). A repeat the session's pacer makes reaches every
viewer, so beside its own figures each spectator counts the frames the driver received, between the
spectator's first and last, that it did not (`frames_missed_that_the_driver_received`): what it lost
in delivery rather than what the session did not generate in time. And each spectator's join →
first frame: from just before its watch POST to its first received frame (`start_s` adds its offer's
ICE gathering).

The figures and their targets: every viewer of phase B at ≥ 0.98 of the target unique FPS; the
driver's glass-to-glass p50 in B at most 10 % above A's; the server's CPU per wall second in B at
most 1.3× A's; the spectators' join → first frame p50 at most 1.5 s.

Where the spectators run. Each aiortc receiver does its SRTP, jitter buffer, H.264 decode and the
per-frame identification in Python: eight of them took about a tenth of a core of this 2-core
machine at gridworld's 128×128. In this process they would share one event loop with the driver,
and since every viewer gets each frame at the same moment, the driver's receive time of each frame,
and so its glass-to-glass, would wait behind up to eight other decodes: the driver would measure its
own client. They run instead in `--spectator-processes` child processes (default 2, `python -m
benchmarks.spectators --child`; 0: in this process), which send back what each spectator received,
and the driver alone stays here. They still share the machine's cores with the server, as viewers
on other hosts would not; their CPU is reported beside the server's (`spectator_processes_cores`),
and the server's figure is its own process's CPU time, which does not count the time it waits for
a core. `others_cores` is the machine's busy time that none of these processes accounts for: other
programs, and kernel time not charged to a process. When it is large the frame rates and latencies
measure the machine's load more than the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.delivery import analyze, ids_by_pts
from benchmarks.local_server import local_server
from benchmarks.reliability.harness import lag_p99_bound_s
from benchmarks.trace import Trace
from benchmarks.webrtc_replay import engine_status, engine_window, replay, wait_steady
from workers.chunk_geometry import VAE_TIME_STRIDE
from worldrtc import Session
from worldrtc.client import ClientRun
from worldrtc.frames import ReceivedFrame

UNIQUE_FPS_FRACTION = 0.98  # every viewer, of the target FPS
G2G_P50_INCREASE = 0.10  # the driver's glass-to-glass p50 with spectators, over alone
CPU_RATIO = 1.3  # the server's CPU per wall second, with spectators over alone
JOIN_P50_S = 1.5  # a spectator's join → first frame

JOIN_TIMEOUT_S = 150.0  # the client's own first-frame timeout (120 s) and some
CHILD_TIMEOUT_S = 120.0  # a spectator process to start, or to hand back its spectators
CHILD_LINE_LIMIT = 1 << 28  # a spectator process's result is one JSON line (frames and chunk messages)
REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spectators", description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # a spectator process (stdin/stdout)
    p.add_argument("--serve", default="--placement cpu", help="arguments of `python -m server` (default %(default)r)")
    p.add_argument("--duration-s", type=float, default=60.0, help="each phase's replay")
    p.add_argument("--spectators", type=int, default=8, help="spectators in phase B")
    p.add_argument("--spectator-processes", type=int, default=2, help="child processes they run in (0: this one)")
    p.add_argument("--join-interval-s", type=float, default=0.5, help="between two spectators' joins")
    p.add_argument("--warmup-s", type=float, default=None, help="replay time before the window (default: ⅙, ≤ 10 s)")
    p.add_argument("--trace", type=Path, default=None, help="control trace (default: a seeded random walk)")
    p.add_argument("--trace-seed", type=int, default=0, help="seed of the random-walk trace")
    p.add_argument("--scene", default=None, help="built-in scene (default: the server's default scene)")
    p.add_argument("--prompt", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="the JSON report (required)")
    args = p.parse_args(argv)
    if args.out is None and not args.child:
        p.error("the following arguments are required: --out")
    if args.warmup_s is None:
        args.warmup_s = min(10.0, args.duration_s / 6)
    if args.duration_s <= 0 or not 0 <= args.warmup_s < args.duration_s:
        p.error("--duration-s must be positive and --warmup-s from 0 to below it")
    if args.spectators < 0 or args.spectator_processes < 0 or args.join_interval_s < 0:
        p.error("--spectators, --spectator-processes and --join-interval-s must not be negative")
    return args


# ---- spectators: in a child process or in this one ----


class SpectatorClient(Session):
    """A spectator that notes when it asked to watch: just before its watch POST."""

    post_t: float | None = None

    async def _offer_watch(self, offer: str) -> str:
        self.post_t = time.perf_counter()
        return await super()._offer_watch(offer)


def _record(index: int, client: SpectatorClient) -> dict[str, Any]:
    """What a spectator received, as JSON: enough to rebuild its `ClientRun`."""
    run = client.run
    return {
        "index": index,
        "started_t": run.started_t,
        "post_t": client.post_t,
        "first_frame_t": run.first_frame_t,
        "frames": [[f.t, f.pts, f.stamp, f.content_id] for f in run.frames],
        "chunks": run.chunks,
        "ready": run.ready,
        "pts_origin": run.pts_origin,
        "errors": run.errors,
        "done": run.done,
        "stats_last": run.stats[-1] if run.stats else None,
    }


def _joined(index: int, client: SpectatorClient) -> dict[str, Any]:
    run = client.run
    first = run.first_frame_t
    return {
        "event": "joined",
        "index": index,
        "join_s": None if first is None or client.post_t is None else first - client.post_t,
        "start_s": None if first is None else first - run.started_t,
    }


async def watch(spec: dict[str, Any], report: Callable[[dict[str, Any]], None], stop: asyncio.Event) -> list[Any]:
    """Spectators join the session at the times `spec["joins"]` gives ([index, perf_counter time]; one
    clock across processes on Linux), each reported as it sees video, and watch until `stop`."""
    clients: dict[int, SpectatorClient] = {}

    async def join(index: int, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        client = SpectatorClient(spec["url"], watch=(spec["watch_url"], spec["watch_token"]))
        clients[index] = client
        try:
            await client.start()
        except Exception as exc:
            report({"event": "failed", "index": index, "error": f"{type(exc).__name__}: {exc}"})
        else:
            report(_joined(index, client))

    joins = [asyncio.create_task(join(int(i), float(at))) for i, at in spec["joins"]]
    await stop.wait()
    for task in joins:
        task.cancel()
    await asyncio.gather(*joins, return_exceptions=True)
    records = []
    for index, client in sorted(clients.items()):
        with contextlib.suppress(Exception):  # the record is what matters; a failed DELETE shows on the server
            await client.close()
        records.append(_record(index, client))
    return records


async def _child() -> int:
    """A spectator process: `hello`, then a spec line on stdin, `joined`/`failed` events as its
    spectators see video, and on `stop` (or stdin's end) one `result` line with their records."""

    def report(event: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    report({"event": "hello"})
    line = await asyncio.to_thread(sys.stdin.readline)
    if not line.strip():
        return 1
    stop = asyncio.Event()

    async def wait_stop() -> None:
        await asyncio.to_thread(sys.stdin.readline)
        stop.set()

    waiter = asyncio.create_task(wait_stop())
    records = await watch(json.loads(line), report, stop)
    await waiter
    report({"event": "result", "spectators": records})
    return 0


class ChildWatchers:
    """Spectators in a child process (`--child`)."""

    def __init__(self, proc: asyncio.subprocess.Process, events: asyncio.Queue[dict[str, Any]]) -> None:
        self.proc, self.events = proc, events
        self.pid: int | None = proc.pid
        self._result: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())

    @staticmethod
    async def spawn(events: asyncio.Queue[dict[str, Any]]) -> ChildWatchers:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.spectators",
            "--child",
            cwd=REPO,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=CHILD_LINE_LIMIT,
        )
        assert proc.stdout is not None
        hello = await asyncio.wait_for(proc.stdout.readline(), CHILD_TIMEOUT_S)
        if not hello:
            raise RuntimeError(f"a spectator process exited with {await proc.wait()} before it started")
        return ChildWatchers(proc, events)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            if msg["event"] == "result":
                self._result.set_result(msg["spectators"])
            else:
                self.events.put_nowait(msg)
        if not self._result.done():
            self._result.set_exception(RuntimeError("a spectator process ended without handing back its spectators"))

    def start(self, spec: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(spec) + "\n").encode())

    async def stop(self) -> list[Any]:
        assert self.proc.stdin is not None
        with contextlib.suppress(ConnectionError):
            self.proc.stdin.write(b"stop\n")
            await self.proc.stdin.drain()
        records = await asyncio.wait_for(asyncio.shield(self._result), CHILD_TIMEOUT_S)
        await self.proc.wait()
        await self._reader
        return records

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


class LocalWatchers:
    """Spectators in this process (`--spectator-processes 0`)."""

    pid: int | None = None

    def __init__(self, events: asyncio.Queue[dict[str, Any]]) -> None:
        self.events = events
        self._stop = asyncio.Event()
        self._task: asyncio.Task[list[Any]] | None = None

    def start(self, spec: dict[str, Any]) -> None:
        self._task = asyncio.create_task(watch(spec, self.events.put_nowait, self._stop))

    async def stop(self) -> list[Any]:
        self._stop.set()
        return [] if self._task is None else await self._task

    async def kill(self) -> None:
        await self.stop()


Watchers = ChildWatchers | LocalWatchers


# ---- readings ----


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (every core; idle and iowait excluded)."""
    t = psutil.cpu_times()
    return float(sum(getattr(t, f) for f in ("user", "nice", "system", "irq", "softirq", "steal") if hasattr(t, f)))


@dataclass
class Reading:
    t: float
    server_cpu_s: float
    descendants_cpu_s: dict[int, float]  # the server's child processes (its stage workers), by pid
    descendant_names: dict[int, str]
    bench_cpu_s: float
    watchers_cpu_s: float  # the spectator processes
    machine_busy_s: float
    engine: dict[str, Any]
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)


async def _metrics(http: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await http.get("/metrics")
    r.raise_for_status()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def _lag_histogram(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[float, float]:
    return {
        float(dict(labels)["le"]): v
        for (name, labels), v in metrics.items()
        if name == "worldrtc_event_loop_lag_seconds_bucket"
    }


async def read(http: httpx.AsyncClient, server_pid: int, watcher_pids: list[int]) -> Reading:
    engine, metrics = await engine_status(http), await _metrics(http)
    server = psutil.Process(server_pid)
    descendants: dict[int, float] = {}
    names: dict[int, str] = {}
    for child in server.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            descendants[child.pid] = _cpu_s(child)
            command = " ".join(child.cmdline())
            names[child.pid] = "resource tracker" if "resource_tracker" in command else f"{child.name()} {child.pid}"
    watchers = 0.0
    for pid in watcher_pids:
        with contextlib.suppress(psutil.Error):
            watchers += _cpu_s(psutil.Process(pid))
    return Reading(
        t=time.perf_counter(),
        server_cpu_s=_cpu_s(server),
        descendants_cpu_s=descendants,
        descendant_names=names,
        bench_cpu_s=_cpu_s(psutil.Process()),
        watchers_cpu_s=watchers,
        machine_busy_s=machine_busy_s(),
        engine=engine,
        metrics=metrics,
    )


def _worker_names(engine: dict[str, Any]) -> dict[int, str]:
    """pid → its stage (the engine's `workers`: stage → pids)."""
    names: dict[int, str] = {}
    for stage, pids in (engine.get("workers") or {}).items():
        for rank, pid in enumerate(pids if isinstance(pids, list) else [pids]):
            names[int(pid)] = stage if rank == 0 else f"{stage}[{rank}]"
    return names


def cpu_window(before: Reading, after: Reading) -> dict[str, Any]:
    """CPU seconds per wall second of the window: the server's process, its workers, the rest."""
    wall = after.t - before.t
    names = after.descendant_names | _worker_names(after.engine)
    workers = {
        names.get(pid, f"pid {pid}"): (cpu - before.descendants_cpu_s.get(pid, 0.0)) / wall
        for pid, cpu in after.descendants_cpu_s.items()
    }
    server = (after.server_cpu_s - before.server_cpu_s) / wall
    bench = (after.bench_cpu_s - before.bench_cpu_s) / wall
    watchers = (after.watchers_cpu_s - before.watchers_cpu_s) / wall
    machine = (after.machine_busy_s - before.machine_busy_s) / wall
    return {
        "window_s": wall,
        "server_cores": server,
        "workers_cores": workers,
        "workers_total_cores": sum(workers.values()),
        "benchmark_cores": bench,
        "spectator_processes_cores": watchers,
        "machine_busy_cores": machine,
        # what nobody above used: other programs on the machine (and exited processes)
        "others_cores": machine - server - sum(workers.values()) - bench - watchers,
        "machine_cores": psutil.cpu_count(),
    }


# ---- a phase ----


def _viewer(run: ClientRun, chunks: list[dict[str, Any]], sent: dict[int, float]) -> dict[str, Any]:
    ready = run.ready or {}
    fps = int(ready.get("fps", 16))
    # The first chunk is 3 frames short of the others (workers/chunk_geometry.py).
    first = int(ready.get("chunk_frames", 16)) - (VAE_TIME_STRIDE - 1)
    report = analyze(run.session_frames(), chunks, sent, fps, first, run.stamped)
    return report | {"fps": fps, "chunks_received": len(run.chunks), "errors": run.errors}


def frame_ids(run: ClientRun, chunks: list[dict[str, Any]]) -> set[int]:
    """The session frames a viewer received (by stamp on the synthetic model, else by pts), repeats aside."""
    frames = run.session_frames()
    if run.stamped:
        return {f.stamp for f in frames if f.stamp is not None}
    return {i for i in ids_by_pts(frames, chunks, int((run.ready or {}).get("fps", 16))) if i is not None}


def spectator_figures(record: dict[str, Any], driver: ClientRun) -> dict[str, Any]:
    """A spectator's delivery, its frames identified by the chunk messages it received (the server sends
    the last few again as it connects, for frames already queued when it joined). Beside it, the frames the
    driver received within the spectator's first and last that the spectator did not: what it lost
    in delivery, as opposed to what the session did not generate in time (repeats for everyone)."""
    run = ClientRun(
        started_t=record["started_t"],
        frames=[ReceivedFrame(t, pts, stamp, content) for t, pts, stamp, content in record["frames"]],
        chunks=record["chunks"],
        ready=record["ready"],
        pts_origin=record["pts_origin"],
        errors=record["errors"],
        done=record["done"],
        first_frame_t=record["first_frame_t"],
    )
    fps = int((run.ready or {}).get("fps", 16))
    unplaced = sum(i is None for i in ids_by_pts(run.session_frames(), run.chunks, fps))
    mine = frame_ids(run, run.chunks)
    missed = sorted(
        i for i in frame_ids(driver, driver.chunks) if mine and min(mine) <= i <= max(mine) and i not in mine
    )
    first, post = record["first_frame_t"], record["post_t"]
    return _viewer(run, run.chunks, {}) | {
        "index": record["index"],
        "join_s": None if first is None or post is None else first - post,
        "start_s": None if first is None else first - record["started_t"],
        "pts_origin": run.pts_origin,
        # frames outside every chunk message it got: repeats, or frames it could not place
        "frames_not_in_its_chunk_messages": unplaced,
        "frames_missed_that_the_driver_received": len(missed),
        "frames_missed_first": missed[:20],
        "done": run.done,
        "stats_last": record["stats_last"],
    }


async def run_phase(
    args: argparse.Namespace,
    url: str,
    trace: Trace,
    http: httpx.AsyncClient,
    server_pid: int,
    watchers: list[Watchers],
    events: asyncio.Queue[dict[str, Any]],
) -> dict[str, Any]:
    n = args.spectators if watchers else 0
    driver = Session(url, scene=args.scene, prompt=args.prompt, seed=args.seed)
    watcher_pids = [w.pid for w in watchers if w.pid is not None]
    label = f"driver + {n} spectators" if n else "driver alone"
    metrics_before = await _metrics(http)
    replaying: asyncio.Task[None] | None = None
    try:
        await driver.start()
        t0 = time.perf_counter()
        replaying = asyncio.create_task(replay(driver, trace, args.duration_s))
        print(f"{label}: replaying {args.duration_s:g} s", file=sys.stderr, flush=True)
        await wait_steady([driver])
        joins: list[dict[str, Any]] = []
        if n:
            assert driver.info is not None
            base = time.perf_counter()
            for k, w in enumerate(watchers):
                mine = [[i, base + i * args.join_interval_s] for i in range(k, n, len(watchers))]
                w.start(
                    {
                        "url": url,
                        "watch_url": driver.info["watch_url"],
                        "watch_token": driver.info["watch_token"],
                        "joins": mine,
                    }
                )
            deadline = base + n * args.join_interval_s + JOIN_TIMEOUT_S
            while len(joins) < n:
                joins.append(await asyncio.wait_for(events.get(), max(0.1, deadline - time.perf_counter())))
            watching = sum(j["event"] == "joined" for j in joins)
            print(f"{label}: {watching} of {n} spectators see video", file=sys.stderr, flush=True)
        start = max(t0 + args.warmup_s, time.perf_counter())
        if start >= t0 + args.duration_s - 1.0:
            raise RuntimeError(
                f"the spectators saw video only {start - t0:.1f} s into the {args.duration_s:g} s replay: "
                "no window is left (a longer --duration-s?)"
            )
        await asyncio.sleep(start - time.perf_counter())
        before = await read(http, server_pid, watcher_pids)
        await replaying
        after = await read(http, server_pid, watcher_pids)
        session_during = await driver.server_info()
        records = [r for w in watchers for r in await w.stop()]
        session = await driver.server_info()
        metrics_after = await _metrics(http)  # spectators' skipped frames are counted as they leave
    finally:
        if replaying is not None and not replaying.done():
            replaying.cancel()
        await driver.close()

    def counter(name: str) -> float:  # over the whole phase: the joins come before the window
        return metrics_after.get((name, ()), 0.0) - metrics_before.get((name, ()), 0.0)

    driver_report = _viewer(driver.run, driver.run.chunks, driver.run.sent) | {"controls_sent": len(driver.run.sent)}
    spectators = sorted((spectator_figures(r, driver.run) for r in records), key=lambda s: s["index"])
    return {
        "spectators_requested": n,
        "window_from_replay_start_s": before.t - t0,
        "cpu": cpu_window(before, after),
        "engine": engine_window(before.engine, after.engine, after.t - before.t)
        | {"event_loop_lag_p99_s": after.engine.get("event_loop_lag_p99_s")},
        "event_loop_lag_p99_window_bound_s": lag_p99_bound_s(
            _lag_histogram(before.metrics), _lag_histogram(after.metrics)
        ),
        "server_session": session_during,
        "server_session_after_spectators_left": session,
        "server_counters": {
            "spectator_joins": counter("worldrtc_spectator_joins_total"),
            "spectator_frames_skipped": counter("worldrtc_spectator_frames_skipped_total"),
        },
        "joins": sorted(joins, key=lambda j: j["index"]),
        "driver": driver_report,
        "spectators": spectators,
    }


# ---- the run ----


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def figures(alone: dict[str, Any], crowd: dict[str, Any]) -> dict[str, Any]:
    """The four figures against their targets."""
    viewers = [crowd["driver"], *crowd["spectators"]]
    fractions = [v["client_unique_fps_over_target"] or 0.0 for v in viewers]
    missing = crowd["spectators_requested"] - len(crowd["spectators"])
    worst = min(fractions) if fractions and not missing else 0.0
    g_a, g_b = alone["driver"]["glass_to_glass_s"]["p50"], crowd["driver"]["glass_to_glass_s"]["p50"]
    increase = None if not g_a or g_b is None else g_b / g_a - 1
    c_a, c_b = alone["cpu"]["server_cores"], crowd["cpu"]["server_cores"]
    ratio = c_b / c_a if c_a > 0 else math.inf
    joins = [j["join_s"] for j in crowd["joins"] if j["event"] == "joined" and j["join_s"] is not None]
    all_joined = len(joins) == crowd["spectators_requested"]
    join_p50 = _pct(joins, 50)
    return {
        "unique_fps_fraction_min": {
            "value": worst,
            "per_viewer": fractions,
            "target": f">= {UNIQUE_FPS_FRACTION}",
            "pass": worst >= UNIQUE_FPS_FRACTION,
        },
        "driver_glass_to_glass_p50_increase": {
            "value": increase,
            "alone_s": g_a,
            "with_spectators_s": g_b,
            "target": f"<= {G2G_P50_INCREASE}",
            "pass": increase is not None and increase <= G2G_P50_INCREASE,
        },
        "server_cpu_ratio": {
            "value": ratio,
            "alone_cores": c_a,
            "with_spectators_cores": c_b,
            "target": f"<= {CPU_RATIO}",
            "pass": ratio <= CPU_RATIO,
        },
        "join_to_first_frame_p50_s": {
            "value": join_p50,
            "max_s": max(joins) if joins else None,
            "all_joined": all_joined,
            "target": f"<= {JOIN_P50_S}",
            "pass": all_joined and join_p50 is not None and join_p50 <= JOIN_P50_S,
        }
        if crowd["spectators_requested"]
        else {"value": None, "pass": None},
    }


async def run_all(args: argparse.Namespace, url: str, server_pid: int) -> dict[str, Any]:
    trace = Trace.load(args.trace) if args.trace else Trace.random_walk(args.duration_s, args.trace_seed)
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    watchers: list[Watchers] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        try:
            # Started first, so that their start-up is in no window; they wait on stdin until phase B.
            processes = min(args.spectator_processes, args.spectators)
            if args.spectators:
                watchers = [await ChildWatchers.spawn(events) for _ in range(processes)] or [LocalWatchers(events)]
            alone = await run_phase(args, url, trace, http, server_pid, [], events)
            crowd = await run_phase(args, url, trace, http, server_pid, watchers, events)
        finally:
            for w in watchers:
                await w.kill()
    return {
        "figures": figures(alone, crowd),
        "phases": {"driver_alone": alone, "with_spectators": crowd},
        "spectators_ran_in": f"{processes} child process(es)" if processes else "the benchmark's process",
        "model": alone["server_session"].get("model"),
        "request": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "PASS" if ok else "FAIL"


def _viewer_line(name: str, v: dict[str, Any]) -> str:
    fps = v["client_unique_fps"] or 0.0
    return (
        f"    {name}: unique {fps:.2f} FPS ({fps / v['fps']:.3f} of {v['fps']}), repeats {v['repeated_frames']} "
        f"({v['repeated_frames_after_first_chunk']} after the first chunk), stalls {v['stalls']}, "
        f"out of order {v['out_of_order_frames']}, frames {v['frames_received']}"
    )


def headline(result: dict[str, Any]) -> list[str]:
    f = result["figures"]
    alone, crowd = result["phases"]["driver_alone"], result["phases"]["with_spectators"]
    n = crowd["spectators_requested"]
    u, g = f["unique_fps_fraction_min"], f["driver_glass_to_glass_p50_increase"]
    c, j = f["server_cpu_ratio"], f["join_to_first_frame_p50_s"]
    lines = [
        f"every viewer (driver + {n} spectators) at >= {UNIQUE_FPS_FRACTION} of the target unique FPS: "
        f"min {u['value']:.3f} -- {_verdict(u['pass'])}",
        f"driver glass-to-glass p50 with {n} spectators {g['with_spectators_s'] or 0:.3f} s vs alone "
        f"{g['alone_s'] or 0:.3f} s ({100 * (g['value'] or 0):+.1f} %, at most +{100 * G2G_P50_INCREASE:.0f} %) "
        f"-- {_verdict(g['pass'])}",
        f"server CPU with {n} spectators {c['with_spectators_cores']:.3f} vs alone {c['alone_cores']:.3f} "
        f"cores: {c['value']:.2f}x (at most {CPU_RATIO}x) -- {_verdict(c['pass'])}",
    ]
    if n:
        lines.append(
            f"spectator join -> first frame p50 {j['value'] or 0:.2f} s, max {j['max_s'] or 0:.2f} s "
            f"(p50 at most {JOIN_P50_S} s; {'all' if j['all_joined'] else 'NOT all'} joined) -- {_verdict(j['pass'])}"
        )
    for name, phase in (("alone", alone), (f"with {n} spectators", crowd)):
        cpu, e = phase["cpu"], phase["engine"]
        workers = ", ".join(f"{k} {v:.2f}" for k, v in cpu["workers_cores"].items())
        m = phase["server_session"]["metrics"]
        gg = phase["driver"]["glass_to_glass_s"]
        lines += [
            f"  {name}: window {cpu['window_s']:.1f} s from {phase['window_from_replay_start_s']:.1f} s; cores: "
            f"server {cpu['server_cores']:.3f}, workers {cpu['workers_total_cores']:.2f} ({workers}), benchmark "
            f"{cpu['benchmark_cores']:.2f}, spectator processes {cpu['spectator_processes_cores']:.2f}, machine "
            f"{cpu['machine_busy_cores']:.2f} of {cpu['machine_cores']} (others {cpu['others_cores']:.2f})",
            f"    server: frames sent {m['frames_sent']} repeated {m['frames_repeated']} dropped "
            f"{m['frames_dropped']}, spectators {m['spectators']} (joined {m['spectators_joined']}), spectator "
            f"frames skipped {phase['server_counters']['spectator_frames_skipped']:g}; loop lag p99 "
            f"{e['event_loop_lag_p99_s'] or 0:.3f} s (window bound {phase['event_loop_lag_p99_window_bound_s']}); "
            f"DiT idle {e['dit_idle_fraction']:.2f}",
            _viewer_line("driver", phase["driver"])
            + f", glass-to-glass p50 {gg['p50'] or 0:.3f} s p95 {gg['p95'] or 0:.3f} s",
        ]
        for s in phase["spectators"]:
            lines.append(
                _viewer_line(f"spectator {s['index'] + 1}", s)
                + f", missed {s['frames_missed_that_the_driver_received']}"
                f" the driver got, join -> first frame {s['join_s'] or 0:.2f} s"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return asyncio.run(_child())
    t0 = time.perf_counter()
    with ExitStack() as stack:
        log = args.out.with_suffix(".server.log")
        print(f"starting: python -m server {args.serve} (log {log})", file=sys.stderr, flush=True)
        server = stack.enter_context(local_server(shlex.split(args.serve), log))
        result = asyncio.run(run_all(args, server.url, server.proc.pid))
    result["wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(headline(result)))
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
