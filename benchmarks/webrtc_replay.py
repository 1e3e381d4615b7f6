"""WebRTC replay: real aiortc clients drive a server the way browsers do, and count what viewers get.

    # against a running server
    python -m benchmarks.webrtc_replay --url http://127.0.0.1:8000 --duration-s 60 --out runs/webrtc.json
    # start one (synthetic timing model), and A/B the dispatch policies on the same trace
    python -m benchmarks.webrtc_replay --serve "--model synthetic --stage-ms 100,800,500" \
        --dispatch jit,chunk-synchronous --duration-s 60 --out runs/webrtc-synthetic.json
    # two viewers at once
    python -m benchmarks.webrtc_replay --serve "--model synthetic --stage-ms 50,400,300" --viewers 2 ...
    # two models one after the other, on the same trace (each its own server)
    python -m benchmarks.webrtc_replay --serve "--model gridworld" --serve "--model gridworld-responsive" ...

Each viewer creates a session through the REST API (with the run's `dispatch`), negotiates (recvonly
video and a "control" data channel), replays the control trace over the data channel (default: a
seeded random walk whose key changes fall at random phases of the chunk schedule; or `--trace FILE`),
receives and decodes the video, and identifies every frame (`benchmarks/delivery.py`: stamped frame
numbers on the synthetic model, content on real ones). Per viewer it reports unique generated
frames per second (`client_unique_fps`), repeats (after the first chunk too), stalls, out-of-order
frames, frame-interval jitter and glass-to-glass p50/p95 (control sent → first received frame of
the first chunk that applied it; this client has no display, so a browser adds its render delay), and
beside them the server's own repeat/drop counters, and where the latency went (`latency_breakdown`:
waiting for a chunk to take the control, compute, the pacer's queue, network and client). Per run it
reports, from the engine, the DiT's idle fraction and every stage's busy seconds over the steady
window (after each viewer's first chunk), which is where compute shows, separately from delivery,
and, for a server on this machine, the cores each process used over that window beside the
machine's busy, idle and stolen time (`benchmarks/cpu_use.py`): whether a missed frame rate is one
stage too slow or a full machine.

Runs for several dispatch policies happen one after another against the same server and trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from benchmarks import cpu_use
from benchmarks.delivery import analyze
from benchmarks.local_server import local_server
from benchmarks.stats import summarize
from benchmarks.timeline import picture_path, write_picture
from benchmarks.trace import Trace
from server.wire.dispatch import DispatchPolicy
from workers.chunk_geometry import VAE_TIME_STRIDE
from worldrtc import Session

STEADY_WAIT_S = 120.0  # for every viewer's second chunk to arrive
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.webrtc_replay", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", default=None, help="a running server (default http://127.0.0.1:8000)")
    where.add_argument(
        "--serve",
        action="append",
        default=None,
        help='start a server with these arguments, e.g. "--model synthetic"; given again, each server in turn '
        "(its runs printed beside the others', on the same trace)",
    )
    p.add_argument("--trace", type=Path, default=None, help="control trace (default: a seeded random walk)")
    p.add_argument("--trace-seed", type=int, default=0, help="seed of the random-walk trace")
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--dispatch", default=None, help="comma-separated policies to run in turn (default: the server's)")
    p.add_argument("--viewers", type=int, default=1, help="concurrent viewers per run")
    p.add_argument("--scene", default=None, help="built-in scene (default: the server's default scene)")
    p.add_argument("--prompt", default="")
    p.add_argument(
        "--prompts",
        default=None,
        help='prompts to type while walking, "|"-separated, spread evenly over the run (e.g. "snow|night|"): '
        "each one's send → first frame of the first chunk that read it is measured",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token", default=None, help="API token, if the server requires one")
    p.add_argument(
        "--save-recordings",
        type=Path,
        default=None,
        help="after each run, save every viewer's session recording here (regenerate: benchmarks.replay --recording)",
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--timeline", type=picture_path, default=None, help="also draw each run's first viewer's timeline (.png/.svg)"
    )
    args = p.parse_args(argv)
    if args.viewers < 1 or args.duration_s <= 0:
        p.error("--viewers must be at least 1 and --duration-s positive")
    policies = [None] if args.dispatch is None else args.dispatch.split(",")
    valid = [d.value for d in DispatchPolicy]
    if any(d is not None and d not in valid for d in policies):
        p.error(f"--dispatch takes {valid}, comma-separated")
    args.policies = policies
    return args


def server_is_here(url: str) -> bool:
    """Whether the server runs on this machine, so that the worker pids it lists are processes here."""
    return urlsplit(url).hostname in LOOPBACK_HOSTS


async def engine_status(http: httpx.AsyncClient) -> dict[str, Any]:
    return (await http.get("/v1/engine")).json()


async def replay(session: Session, trace: Trace, duration_s: float) -> None:
    """Send the trace's messages on its clock (its `stop` ends a pass), starting over until `duration_s`."""
    t0 = time.perf_counter()
    offset, period = 0.0, trace.duration_s + 1.0
    while time.perf_counter() - t0 < duration_s:
        for event in trace.events:
            wait = t0 + offset + event.at_s - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if time.perf_counter() - t0 > duration_s or event.message.get("type") == "stop":
                break
            session.send({k: v for k, v in event.message.items() if k not in ("seq", "t")})
        offset += period
    rest = t0 + duration_s - time.perf_counter()
    if rest > 0:
        await asyncio.sleep(rest)


async def type_prompts(session: Session, prompts: list[str], duration_s: float) -> None:
    """Each prompt at an even share of the run (the first after one share: the world has started)."""
    every_s = duration_s / (len(prompts) + 1)
    for text in prompts:
        await asyncio.sleep(every_s)
        session.prompt(text)


async def wait_steady(clients: list[Session]) -> None:
    deadline = time.perf_counter() + STEADY_WAIT_S
    while not all(any(c["index"] >= 1 for c in client.run.chunks) for client in clients):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"no second chunk within {STEADY_WAIT_S:g} s")
        await asyncio.sleep(0.05)


def engine_window(before: dict[str, Any], after: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Stage busy/idle seconds between two engine readings, and the DiT's idle fraction."""
    b, a = before["stage_busy_idle_s"], after["stage_busy_idle_s"]
    busy = {s: a[s]["busy_s"] - b[s]["busy_s"] for s in a}
    idle = {s: a[s]["idle_s"] - b[s]["idle_s"] for s in a}
    return {"window_s": wall_s, "stage_busy_s": busy, "stage_idle_s": idle, "dit_idle_fraction": idle["dit"] / wall_s}


async def run_policy(args: argparse.Namespace, url: str, trace: Trace, policy: str | None) -> dict[str, Any]:
    clients = [
        Session(url, scene=args.scene, prompt=args.prompt, seed=args.seed, dispatch=policy, token=args.token)
        for _ in range(args.viewers)
    ]
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as http:
        try:
            for c in clients:
                await c.start()
            print(
                f"{policy or 'server default'}: {args.viewers} viewer(s) connected; replaying {args.duration_s:g} s",
                file=sys.stderr,
                flush=True,
            )
            t0 = time.perf_counter()
            replays = [asyncio.create_task(replay(c, trace, args.duration_s)) for c in clients]
            if args.prompts is not None:  # the first viewer types: each prompt changes every viewer's world
                replays.append(asyncio.create_task(type_prompts(clients[0], args.prompts.split("|"), args.duration_s)))
            await wait_steady(clients)
            steady_t, before = time.perf_counter(), await engine_status(http)
            cpu_before = cpu_use.read(before["workers"]) if server_is_here(url) else None
            await asyncio.gather(*replays)
            after = await engine_status(http)
            cpu = None if cpu_before is None else cpu_use.cores_used(cpu_before, cpu_use.read(after["workers"]))
            engine = engine_window(before, after, time.perf_counter() - steady_t)
            servers = [await c.server_info() for c in clients]
            timelines = [await c.timeline() for c in clients]
        finally:
            for c in clients:
                await c.close()
        recordings = [await _save_recording(args, http, c, policy, i) for i, c in enumerate(clients, 1)]
    viewers = []
    for c, server, timeline, recording in zip(clients, servers, timelines, recordings, strict=True):
        ready = c.run.ready or {}
        fps = ready.get("fps", 16)
        # The first chunk is 3 frames short of the others (workers/chunk_geometry.py).
        first = ready.get("chunk_frames", 16) - (VAE_TIME_STRIDE - 1)
        report = analyze(c.run.session_frames(), c.run.chunks, c.run.sent, fps, first, c.run.stamped)
        m = server.get("metrics", {})
        report |= {
            "fps": fps,
            "dispatch": m.get("dispatch"),
            "controls_sent": len(c.run.sent),
            "prompts_sent": len(c.run.prompts_sent),
            "prompt_to_frame_s": summarize(c.prompt_to_frame_s()),
            "chunks_received": len(c.run.chunks),
            "errors": c.run.errors,
            "server_frames_repeated": m.get("frames_repeated"),
            "server_frames_dropped": m.get("frames_dropped"),
            "server_real_time_factor": m.get("real_time_factor"),
            "server_control_to_frame_p50_s": m.get("control_to_frame_p50_s"),
            "server_session": server,
            "server_stats_last": c.run.stats[-1] if c.run.stats else None,
            "timeline": timeline,  # the server's, for python -m benchmarks.timeline
            "latency_breakdown_s": latency_breakdown(timeline, report["glass_to_glass_s"]["p50"]),
            "recording": recording,
        }
        viewers.append(report)
    return {
        "dispatch": viewers[0]["dispatch"],
        "model": (clients[0].run.ready or {}).get("model"),
        "viewers": viewers,
        "engine": engine | {"event_loop_lag_p99_s": after.get("event_loop_lag_p99_s")},
        "cpu_cores_used": cpu,
        "wall_s": time.perf_counter() - t0,
    }


def latency_breakdown(timeline: dict[str, Any], glass_to_glass_p50_s: float | None) -> dict[str, Any]:
    """Where control-to-frame latency went: medians over the controls the server saw reach the wire
    (its timeline) of waiting for a chunk to take them, that chunk's compute up to its first frames in
    the pacer, and the pacer's queue; the rest of glass-to-glass (network, the client's receive path
    and jitter buffer) is the client's p50 less the server's. Medians of parts need not add up exactly."""
    rows = [c for c in timeline.get("controls", []) if c.get("sampled_s") is not None]

    def p50(key_from: str, key_to: str) -> float | None:
        return summarize([c[key_to] - c[key_from] for c in rows])["p50"]

    server = p50("arrived_s", "shown_s")
    return {
        "controls": len(rows),
        "wait_for_sample": p50("arrived_s", "sampled_s"),
        "compute": p50("sampled_s", "in_pacer_s"),
        "pacer_queue": p50("in_pacer_s", "shown_s"),
        "server": server,
        "network_and_client": None if server is None or glass_to_glass_p50_s is None else glass_to_glass_p50_s - server,
    }


async def _save_recording(
    args: argparse.Namespace, http: httpx.AsyncClient, client: Session, policy: str | None, viewer: int
) -> dict[str, Any] | None:
    """The ended session's recording, saved, with its size: the chunk entries per minute of video
    (the start image aside, which a recording carries once)."""
    if args.save_recordings is None or client.info is None:
        return None
    r = await http.get(f"/v1/sessions/{client.info['session_id']}/recording")
    r.raise_for_status()
    record = r.json()
    path = args.save_recordings / f"{policy or 'default'}-viewer{viewer}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(r.text)
    entries = len(json.dumps(record["chunks"], separators=(",", ":")))
    frames = record["video"]["frames"]
    minutes = frames / record["fps"] / 60 if frames else None
    return {
        "path": str(path),
        "chunks": len(record["chunks"]),
        "complete": record["complete"],
        "bytes": len(r.content),
        "chunk_bytes_per_minute": entries / minutes if minutes else None,
        "video": record["video"],
    }


async def run_all(args: argparse.Namespace, url: str) -> dict[str, Any]:
    trace = Trace.load(args.trace) if args.trace else Trace.random_walk(args.duration_s, args.trace_seed)
    runs = [await run_policy(args, url, trace, policy) for policy in args.policies]
    return {
        "runs": runs,
        "request": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }


def headline(run: dict[str, Any]) -> list[str]:
    lines = []
    e = run["engine"]
    busy = ", ".join(f"{s} {v:.1f}" for s, v in e["stage_busy_s"].items())
    lines.append(
        f"{run['dispatch']} ({run['model']}): DiT idle {e['dit_idle_fraction']:.2f} of the steady "
        f"{e['window_s']:.0f} s; stage busy s: {busy}"
    )
    if run["cpu_cores_used"] is not None:
        lines.append("  " + cpu_use.describe(run["cpu_cores_used"]))
    for i, v in enumerate(run["viewers"], 1):
        g = v["glass_to_glass_s"]
        fps = v["client_unique_fps"] or 0.0
        lines.append(
            f"  viewer {i}: unique {fps:.2f} FPS ({fps / v['fps']:.3f} of {v['fps']}), "
            f"repeats {v['repeated_frames']} ({v['repeated_frames_after_first_chunk']} after the first chunk, "
            f"{100 * v['repeated_fraction_after_first_chunk']:.1f} %; by content {v['repeated_frames_by_content']}), "
            f"stalls {v['stalls']}, "
            f"out of order {v['out_of_order_frames']}, glass-to-glass p50 {g['p50'] or 0:.2f} s "
            f"p95 {g['p95'] or 0:.2f} s; server repeats {v['server_frames_repeated']} drops "
            f"{v['server_frames_dropped']}"
        )
        b = v["latency_breakdown_s"]
        if b["server"] is not None:
            lines.append(
                f"    latency p50 over {b['controls']} controls: wait for the sample {b['wait_for_sample']:.3f} s, "
                f"compute {b['compute']:.3f} s, pacer queue {b['pacer_queue']:.3f} s (server {b['server']:.3f} s), "
                f"network and client {b['network_and_client'] or 0:.3f} s"
            )
        if v["prompts_sent"]:
            p = v["prompt_to_frame_s"]
            lines.append(
                f"    prompts: {v['prompts_sent']} typed, {p['count']} seen; prompt → frame p50 {p['p50'] or 0:.2f} s "
                f"max {p['max'] or 0:.2f} s"
            )
        rec = v.get("recording")
        if rec is not None:
            per_min = rec["chunk_bytes_per_minute"] or 0.0
            lines.append(
                f"    recording: {rec['chunks']} chunks, complete {rec['complete']}, {rec['bytes'] / 1000:.1f} kB "
                f"({per_min / 1000:.1f} kB a minute beside the start image), video {rec['video']['frames']} frames; "
                f"{rec['path']}"
            )
    return lines


def _against_servers(args: argparse.Namespace) -> dict[str, Any]:
    """Every run against the given server, or against each server started in turn (one at a time)."""
    if args.serve is None:
        return asyncio.run(run_all(args, args.url or "http://127.0.0.1:8000"))
    results = []
    for i, serve in enumerate(args.serve):
        log = args.out.with_suffix(f".server{i if len(args.serve) > 1 else ''}.log")
        print(f"starting: python -m server {serve} (log {log})", file=sys.stderr, flush=True)
        with ExitStack() as stack:
            url = stack.enter_context(local_server(shlex.split(serve), log)).url
            results.append(asyncio.run(run_all(args, url)))
    return {"runs": [run for r in results for run in r["runs"]], "request": results[0]["request"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = _against_servers(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for run in result["runs"]:
        print("\n".join(headline(run)))
    if args.timeline is not None:
        runs = result["runs"]
        why = write_picture([r["viewers"][0]["timeline"] for r in runs], args.timeline, [r["dispatch"] for r in runs])
        print(f"timeline: {args.timeline}" if why is None else f"no timeline: {why}", file=sys.stderr)
        if why is not None:
            return 2
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
