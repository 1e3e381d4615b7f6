"""Rows 8-11 and 38: workers that die, hang or cannot start, and a server that is killed.

 8 worker SIGKILL       each stage (short: the DiT), 2 live sessions
 9 worker hang          SIGSTOP the DiT, 2 live sessions
10 start failure        a corrupt checkpoint file; an unknown placement
11 server SIGKILL       2 live sessions
38 group SIGKILL        the server and every worker at once (2 live sessions), then a new server
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.local_server import free_port, start_server
from benchmarks.reliability.harness import (
    SYNTHETIC,
    CaseResult,
    Check,
    Lab,
    ServerConfig,
    ServerUnderTest,
    alive,
    all_ended,
    at_most,
    case,
    equal,
    group_members,
    holds,
    kill_group,
    wait_for,
)
from workers.models.presets import DEFAULT_PRESET, get_preset
from workers.runtime.channel import leaked_segments
from workers.runtime.memory_plan import machine_capacity
from workers.runtime.placement import get_placement
from workers.runtime.savings_plan import fit_savings
from worldrtc import Session

FRAMES_BEFORE = 8  # frames each viewer gets before the fault
RECOVERY_TIMEOUT_S = 60.0
POLL_S = 0.02


async def _viewers(url: str, n: int) -> list[Session]:
    sessions = [await Session(url).start() for _ in range(n)]
    for s in sessions:
        for _ in range(FRAMES_BEFORE):
            await asyncio.wait_for(s.next_frame(), 60)
    return sessions


async def _new_session_frames(url: str) -> int:
    """Frames a new session gets, up to FRAMES_BEFORE: whether the server streams (again)."""
    session = await Session(url).start()
    frames = 0
    async for _ in session.frames(limit=FRAMES_BEFORE):
        frames += 1
    await session.close()
    return frames


def _ready(server: ServerUnderTest) -> int:
    try:
        return server.http.get("/readyz").status_code
    except httpx.HTTPError:
        return 0


async def _lose_a_stage(server: ServerUnderTest, stage: str, sig: signal.Signals) -> dict[str, Any]:
    """Two live viewers; `sig` to the stage's worker; what happened, timed from the signal."""
    viewers = await _viewers(server.url, 2)
    pid = server.worker_pids()[stage][0]
    t0 = time.perf_counter()
    os.kill(pid, sig)
    loop = asyncio.get_running_loop()
    detected = await loop.run_in_executor(None, wait_for, lambda: _ready(server) == 503, 15.0, POLL_S)
    await all_ended(viewers, 15.0)
    ended = [
        {
            "error_s": next((e["received_t"] - t0 for e in s.run.errors if e["code"] == "session_failed"), None),
            "done_s": None if s.run.done is None else s.run.done["received_t"] - t0,
            "code": None if s.run.done is None else s.run.done["code"],
            "reason": None if s.run.done is None else s.run.done["reason"],
        }
        for s in viewers
    ]
    for s in viewers:
        await s.close()
    ready = await loop.run_in_executor(None, wait_for, lambda: _ready(server) == 200, RECOVERY_TIMEOUT_S, POLL_S)
    new_pid = server.worker_pids()[stage][0]
    frames = await _new_session_frames(server.url)
    return {
        "stage": stage,
        "pid": pid,
        "new_pid": new_pid,
        "readyz_503_s": detected,
        "sessions": ended,
        "ready_again_s": None if ready is None else ready + (detected or 0),
        "new_session_frames": frames,
    }


def _recovery_checks(run: dict[str, Any], server: ServerUnderTest, end_limit_s: float) -> list[Check]:
    stage = run["stage"]
    sessions = run["sessions"]
    zombies = server.resources().zombies
    return [
        at_most(f"{stage}: error at every viewer", max((s["error_s"] or 99) for s in sessions), end_limit_s, " s"),
        at_most(f"{stage}: every session closed", max((s["done_s"] or 99) for s in sessions), end_limit_s, " s"),
        holds(f"{stage}: closed as generation_failed", all(s["code"] == "generation_failed" for s in sessions)),
        holds(f"{stage}: a new worker", run["new_pid"] != run["pid"] and not alive(run["pid"])),
        holds(f"{stage}: /readyz 503 then 200", run["readyz_503_s"] is not None and run["ready_again_s"] is not None),
        equal(f"{stage}: frames of a new session", run["new_session_frames"], FRAMES_BEFORE),
        equal(f"{stage}: zombies", zombies, 0),
        equal(f"{stage}: the lost worker's slot files", len(leaked_segments(run["pid"])), 0),
    ]


@case(
    8,
    "worker SIGKILL",
    "SIGKILL a stage worker (each stage; short: the DiT) under 2 live sessions",
    "detected ≤ 1 s; error then close ≤ 2 s; restarted; /readyz says so; new session works; 0 zombies, 0 segments",
)
def worker_sigkill(lab: Lab, r: CaseResult) -> None:
    stages = lab.pick(["dit"], ["encode", "dit", "decode"])
    with lab.own_server(ServerConfig().with_env(create_burst=1000)) as server:
        for stage in stages:
            run = asyncio.run(_lose_a_stage(server, stage, signal.SIGKILL))
            r.figures[stage] = run
            r.checks.append(at_most(f"{stage}: detected (/readyz 503)", run["readyz_503_s"], 1.0, " s"))
            r.checks += _recovery_checks(run, server, 2.0)


@case(
    9,
    "worker hang",
    "SIGSTOP the DiT worker under 2 live sessions",
    "its command deadline fires; the same recovery as row 8 within 5 s",
)
def worker_hang(lab: Lab, r: CaseResult) -> None:
    with lab.own_server(ServerConfig().with_env(create_burst=1000)) as server:
        run = asyncio.run(_lose_a_stage(server, "dit", signal.SIGSTOP))
        r.figures["dit"] = run
        reasons = [s["reason"] or "" for s in run["sessions"]]
        r.checks = [
            holds("the deadline named the hang", all("hung" in reason for reason in reasons), reasons[0]),
            *_recovery_checks(run, server, 5.0),
        ]


def _broken_checkpoint(root: Path) -> Path:
    """The bundled gridworld weights with the VAE file cut in half."""
    source = Path(__file__).resolve().parents[2] / "workers" / "models" / "weights" / "gridworld"
    dest = root / "gridworld"
    shutil.copytree(source, dest)
    vae = dest / "vae.safetensors"
    vae.write_bytes(vae.read_bytes()[: vae.stat().st_size // 2])
    return dest


def _start_failure(args: list[str], log: Path, limit_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "server", "--port", str(free_port()), *args]
    repo = Path(__file__).resolve().parents[2]
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=repo, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=limit_s + 30)
    except subprocess.TimeoutExpired:
        code = None
    elapsed = time.monotonic() - t0
    orphans = wait_for(lambda: not group_members(proc.pid), 2.0) is None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if code is None:
        proc.kill()
        proc.wait()
    return {"exit": code, "seconds": elapsed, "orphans": orphans, "output": log.read_text(errors="replace")[-3000:]}


@case(
    10,
    "worker start failure",
    "a corrupt checkpoint file (VAE cut in half); an unknown placement",
    "exit non-zero ≤ 15 s naming the stage and cause; no orphans",
)
def start_failure(lab: Lab, r: CaseResult) -> None:
    lab.log_dir.mkdir(parents=True, exist_ok=True)
    # As after any earlier start of the model on this machine, its memory plan's traces are stored
    # (workers/runtime/footprint.py): the row times the workers' failure, not a first trace.
    fit_savings(get_preset(DEFAULT_PRESET), get_placement("cpu"), 1, machine_capacity())
    with tempfile.TemporaryDirectory(prefix="worldrtc-broken-") as tmp:
        checkpoint = _broken_checkpoint(Path(tmp))
        bad_weights = _start_failure(["--checkpoint-dir", str(checkpoint)], lab.log_dir / "start-failure.log", 15)
    bad_config = _start_failure(["--placement", "no-such-placement"], lab.log_dir / "bad-config.log", 15)
    r.figures = {"corrupt_checkpoint": bad_weights, "unknown_placement": bad_config}
    for name, run, cause in (
        ("corrupt checkpoint", bad_weights, "vae"),
        ("unknown placement", bad_config, "no-such-placement"),
    ):
        out = run["output"]
        names_stage = name != "corrupt checkpoint" or any(s in out for s in ("encode[", "decode["))
        r.checks += [
            holds(f"{name}: exit status non-zero", run["exit"] not in (None, 0), run["exit"]),
            at_most(f"{name}: exited after", run["seconds"], 15.0, " s"),
            holds(f"{name}: names the stage and the cause", names_stage and cause in out.lower()),
            holds(f"{name}: no process left", not run["orphans"]),
        ]


@case(
    11,
    "server SIGKILL",
    "SIGKILL the server process under 2 live sessions",
    "every worker gone ≤ 2 s; /dev/shm back to baseline",
)
def server_sigkill(lab: Lab, r: CaseResult) -> None:
    process = start_server(list(SYNTHETIC), lab.log_dir / "server-sigkill.log")
    server = ServerUnderTest(process)
    try:
        workers = [pid for pids in server.worker_pids().values() for pid in pids]

        async def live_then_kill() -> float | None:
            viewers = await _viewers(server.url, 2)
            os.kill(server.pid, signal.SIGKILL)
            gone = await asyncio.get_running_loop().run_in_executor(
                None, wait_for, lambda: not any(alive(p) for p in workers), 10.0, POLL_S
            )
            for v in viewers:
                await v.close()  # the server is gone: only the connection closes
            return gone

        gone_s = asyncio.run(live_then_kill())
        left = [name for pid in (server.pid, *workers) for name in leaked_segments(pid)]
    finally:
        server.close()
        kill_group(process)
    r.figures = {"workers": workers, "gone_s": gone_s, "segments_left": left}
    r.checks = [
        at_most("every worker gone after", gone_s, 2.0, " s"),
        equal("channel files left in /dev/shm", len(left), 0),
    ]


@case(
    38,
    "group SIGKILL",
    "SIGKILL the server's whole process group at once (kill -9 -- -PGID) under 2 live sessions; start a new server",
    "the killed tree leaves its channel files (nobody could unlink them); once the new server is ready, "
    "0 files and 0 processes of the first are left; the new server streams",
)
def group_sigkill(lab: Lab, r: CaseResult) -> None:
    first = start_server(list(SYNTHETIC), lab.log_dir / "group-sigkill.log")
    tree: list[int] = []
    try:
        workers = [pid for pids in ServerUnderTest(first).worker_pids().values() for pid in pids]
        tree = [first.proc.pid, *workers]

        async def live_then_kill() -> None:
            viewers = await _viewers(first.url, 2)
            os.killpg(first.proc.pid, signal.SIGKILL)  # the OOM killer's or systemd's way: no one runs a handler
            first.proc.wait(10)
            for v in viewers:
                await v.close()

        asyncio.run(live_then_kill())
        gone_s = wait_for(lambda: not any(alive(pid) for pid in tree), 10.0, POLL_S)
        left_by_kill = sum(len(leaked_segments(pid)) for pid in tree)
    finally:
        kill_group(first)
    second = start_server(list(SYNTHETIC), lab.log_dir / "group-sigkill-after.log")
    try:
        left_after = sum(len(leaked_segments(pid)) for pid in tree)
        processes_after = [pid for pid in tree if alive(pid)]

        frames = asyncio.run(_new_session_frames(second.url))
    finally:
        second.stop()
        kill_group(second)
    r.figures = {
        "tree": tree,
        "gone_s": gone_s,
        "files_left_by_the_kill": left_by_kill,
        "files_left_once_ready": left_after,
        "processes_left_once_ready": processes_after,
        "new_server_frames": frames,
    }
    r.checks = [
        at_most("every process of the tree gone after", gone_s, 2.0, " s"),
        holds("the kill left channel files (what the new server must clean)", left_by_kill > 0, left_by_kill),
        equal("channel files of the first once the new server is ready", left_after, 0),
        equal("processes of the first once the new server is ready", processes_after, []),
        equal("frames from the new server", frames, FRAMES_BEFORE),
    ]
