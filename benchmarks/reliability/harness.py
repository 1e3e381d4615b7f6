"""The suite's plumbing: what a case returns, the servers it runs against, and what can be read off
a running server from outside (psutil, /dev/shm, its own /metrics and /v1/engine).

A case is a function `(Lab) -> CaseResult`. It injects something into a real server started with
`python -m server` (real worker processes, real aiortc peers over loopback) and returns checks: each
one a figure, the bound it had to meet, and whether it did. `Lab.server(config)` shares a running
server between cases with the same configuration; `Lab.own_server(config)` starts one the case may
break.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.local_server import ServerProcess, local_server, log_tail
from workers.runtime.channel import leaked_segments
from worldrtc import Session

# The synthetic timing model at the gridworld preset's shapes: real stage processes and channels,
# stages that take a stated time and little CPU, so that what is measured is the server.
SYNTHETIC = ("--model", "synthetic", "--stage-ms", "20,150,100", "--synthetic-geometry", "gridworld")
# What the server's log shows for an exception nobody handled (asyncio's reports, and the server's).
UNHANDLED = ("Traceback", "Task exception was never retrieved", "Exception in callback", "Unhandled")
LAG_BOUND_S = 0.02  # a histogram bucket bound (server/common/metrics.py LAG_BUCKETS), so "p99 < 20 ms" is exact


class Size(StrEnum):
    SHORT = "short"  # what `make test` runs
    FULL = "full"  # what the table asks for


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Check:
    what: str
    value: Any
    bound: str
    ok: bool

    @property
    def figure(self) -> str:
        return _fmt(self.value)

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.what}: {self.figure} (must be {self.bound})"


def at_most(what: str, value: float | None, limit: float, unit: str = "") -> Check:
    return Check(what, value, f"≤ {_fmt(limit)}{unit}", value is not None and value <= limit)


def below(what: str, value: float | None, limit: float, unit: str = "") -> Check:
    return Check(what, value, f"< {_fmt(limit)}{unit}", value is not None and value < limit)


def at_least(what: str, value: float | None, limit: float, unit: str = "") -> Check:
    return Check(what, value, f"≥ {_fmt(limit)}{unit}", value is not None and value >= limit)


def equal(what: str, value: Any, expected: Any) -> Check:
    return Check(what, value, f"= {_fmt(expected)}", value == expected)


def holds(what: str, ok: bool, value: Any = None) -> Check:
    return Check(what, ok if value is None else value, "true", bool(ok))


@dataclass
class CaseResult:
    number: int
    name: str
    injected: str
    must_hold: str
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None  # the case itself broke (an exception): it fails

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    def report(self) -> str:
        head = f"#{self.number} {self.name}: {'pass' if self.passed else 'FAIL'} ({self.seconds:.1f} s)"
        lines = [head, *(f"  {c.line()}" for c in self.checks)]
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "case": self.name,
            "injected": self.injected,
            "must_hold": self.must_hold,
            "passed": self.passed,
            "seconds": round(self.seconds, 2),
            "checks": [{"what": c.what, "value": c.value, "bound": c.bound, "ok": c.ok} for c in self.checks],
            "figures": self.figures,
            "error": self.error,
        }


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


# ---------------------------------------------------------------- a server under test


@dataclass(frozen=True)
class ServerConfig:
    args: tuple[str, ...] = SYNTHETIC
    # WORLDRTC_* settings without a flag. The rows that are not about the waiting room want a full
    # server to refuse (429) rather than hand out tickets.
    env: tuple[tuple[str, str], ...] = (("WORLDRTC_QUEUE", "false"),)

    def with_env(self, **settings: object) -> ServerConfig:
        extra = tuple((f"WORLDRTC_{k.upper()}", str(v)) for k, v in settings.items())
        return ServerConfig(self.args, self.env + extra)


@dataclass(frozen=True)
class Resources:
    """What a leak would grow: the server process and its children."""

    rss_bytes: int
    fds: int
    threads: int
    children: int
    zombies: int
    segments: int  # channel files in /dev/shm of this server's processes (any it has had)
    udp_sockets: int
    tasks: int  # the server's asyncio tasks
    peer_connections: int

    def delta(self, base: Resources) -> dict[str, int]:
        return {k: getattr(self, k) - getattr(base, k) for k in self.__dataclass_fields__}

    def back_to(self, base: Resources) -> bool:
        """Everything `leak_checks` checks is back to `base`. Rows wait for this before they measure:
        a closing connection's tasks, socket and encoder thread go one after another, not at once."""
        return all(check.ok for check in leak_checks(base, self))


def leak_checks(base: Resources, end: Resources) -> list[Check]:
    """The server's connections, tasks, sockets and threads back to where they were."""
    return [
        equal("peer connections over the count before", end.peer_connections - base.peer_connections, 0),
        at_most("asyncio tasks over the count before", end.tasks - base.tasks, 0),
        at_most("UDP sockets over the count before", end.udp_sockets - base.udp_sockets, 0),
        at_most("threads over the count before", end.threads - base.threads, 0),
    ]


class ServerUnderTest:
    def __init__(self, process: ServerProcess, token: str | None = None) -> None:
        self.url, self.popen, self.log = process.url, process.proc, process.log
        self.process = process
        self.ps = psutil.Process(self.popen.pid)
        self.token = token
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=30)
        self._pids_seen: set[int] = set()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def engine(self) -> dict[str, Any]:
        r = self.http.get("/v1/engine")
        r.raise_for_status()
        return dict(r.json())

    def worker_pids(self) -> dict[str, list[int]]:
        return {k: list(v) for k, v in self.engine()["workers"].items()}

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, by (name, sorted labels)."""
        r = self.http.get("/metrics")
        r.raise_for_status()
        out = {}
        for family in text_string_to_metric_families(r.text):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, tuple(sorted(labels.items()))), 0.0)

    def lag_histogram(self) -> dict[float, float]:
        """Cumulative event-loop lag counts by bucket bound (seconds; inf for all)."""
        return {
            float(dict(labels)["le"]): v
            for (name, labels), v in self.metrics().items()
            if name == "worldrtc_event_loop_lag_seconds_bucket"
        }

    def resources(self) -> Resources:
        procs = [self.ps, *self.ps.children(recursive=True)]
        children = procs[1:]
        self._pids_seen.update(p.pid for p in procs)  # a restarted worker's files still count
        udp = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                udp += len(p.net_connections(kind="udp"))
        engine = self.engine()
        return Resources(
            rss_bytes=self.ps.memory_info().rss,
            fds=self.ps.num_fds(),
            threads=self.ps.num_threads(),
            children=len(children),
            zombies=sum(_status(p) == psutil.STATUS_ZOMBIE for p in children),
            segments=sum(len(leaked_segments(pid)) for pid in self._pids_seen),
            udp_sockets=udp,
            tasks=int(engine["event_loop_tasks"]),
            peer_connections=int(engine["peer_connections"]),
        )

    def listening(self) -> list[tuple[str, str, int]]:
        """(kind, address, port) of every TCP listener and bound UDP socket of the server and its workers."""
        out = []
        for p in [self.ps, *self.ps.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                for c in p.net_connections(kind="inet"):
                    if c.laddr and (c.status == psutil.CONN_LISTEN or c.type == 2):  # SOCK_DGRAM
                        out.append(("udp" if c.type == 2 else "tcp", c.laddr.ip, c.laddr.port))
        return out

    def log_text(self) -> str:
        return log_tail(self.log, chars=10_000_000)

    def unhandled(self) -> list[str]:
        """Log lines that show an exception nobody handled (asyncio's and the server's own reports)."""
        return [line for line in self.log_text().splitlines() if any(u in line for u in UNHANDLED)]

    def sessions(self) -> list[dict[str, Any]]:
        """GET /v1/sessions: live sessions and those that ended within closed_session_keep_s."""
        return list(self.http.get("/v1/sessions").json()["sessions"])

    def wait_ended(self, session_id: str, timeout_s: float) -> tuple[float | None, str | None]:
        """Seconds until the server lists the session as ended (None: not within timeout_s), and why
        it ended (its `done` code)."""
        seen: dict[str, Any] = {}

        def ended() -> bool:
            seen.update(next(s for s in self.sessions() if s["session_id"] == session_id))
            return seen["state"] in ("closed", "failed")

        return wait_for(ended, timeout_s), seen.get("ended")

    def close(self) -> None:
        self.http.close()


def _status(p: psutil.Process) -> str:
    try:
        return str(p.status())
    except psutil.Error:
        return "gone"


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def lag_p99_bound_s(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The smallest histogram bound under which ≥ 99 % of the loop-lag samples taken between two
    reads fall (None: no samples)."""
    total = after.get(math.inf, 0.0) - before.get(math.inf, 0.0)
    if total <= 0:
        return None
    for bound in sorted(after):
        if (after[bound] - before.get(bound, 0.0)) / total >= 0.99:
            return bound
    return math.inf


def wait_for(predicate: Callable[[], Any], timeout_s: float, poll_s: float = 0.05) -> float | None:
    """Seconds until `predicate()` was true, or None if it was not within `timeout_s`."""
    t0 = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            return None
        time.sleep(poll_s)


async def all_ended(sessions: Sequence[Session], timeout_s: float, poll_s: float = 0.02) -> None:
    """Until every session got `done` from the server, or `timeout_s`."""
    t0 = time.monotonic()
    while any(s.run.done is None for s in sessions) and time.monotonic() - t0 < timeout_s:
        await asyncio.sleep(poll_s)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group."""
    members = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(pid) == pgid and alive(pid):
                members.append(pid)
    return members


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------- the lab


class Lab:
    """Servers for the cases, and where their logs go."""

    def __init__(self, size: Size, log_dir: Path) -> None:
        self.size = size
        self.log_dir = log_dir
        self._shared: dict[ServerConfig, tuple[contextlib.ExitStack, ServerUnderTest]] = {}
        self._count = 0

    def pick(self, short: Any, full: Any) -> Any:
        return full if self.size is Size.FULL else short

    def progress(self, text: str) -> None:
        """A line on stderr for the long rows (the soak runs for a quarter of an hour)."""
        print(f"    {text}", file=sys.stderr, flush=True)

    def server(self, config: ServerConfig = ServerConfig()) -> ServerUnderTest:
        """A running server with this configuration, shared with other cases (leave it as you found it)."""
        running = self._shared.get(config)
        if running is not None and running[1].popen.poll() is None:
            return running[1]
        stack = contextlib.ExitStack()
        server = stack.enter_context(self.own_server(config))
        self._shared[config] = (stack, server)
        return server

    @contextlib.contextmanager
    def own_server(self, config: ServerConfig = ServerConfig()) -> Iterator[ServerUnderTest]:
        """A server only this case uses; stopped (SIGINT, then SIGKILL to its group) afterwards."""
        self._count += 1
        env = dict(config.env)
        log = self.log_dir / f"server-{self._count}.log"
        with local_server(list(config.args), log, env=env) as process:
            server = ServerUnderTest(process, env.get("WORLDRTC_API_TOKEN"))
            try:
                yield server
            finally:
                server.close()

    def close(self) -> None:
        for stack, _ in self._shared.values():
            stack.close()
        self._shared.clear()


def kill_group(process: ServerProcess) -> None:
    """SIGKILL whatever is left of a server (and its workers, in its process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.proc.pid, 9)
    process.proc.wait(timeout=10)


class PeerProcess:
    """A viewer in its own process (benchmarks/reliability/peer.py); its JSON lines are events."""

    def __init__(self, mode: str, url: str, *args: str) -> None:
        repo = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.reliability.peer", mode, url, *args],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def event(self, timeout_s: float) -> dict[str, Any]:
        """The next JSON line, or an error naming what the peer said on stderr."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.kill()
            err = self.proc.stderr.read()[-2000:] if self.proc.stderr else ""
            raise RuntimeError(f"the peer said nothing within {timeout_s:g} s (exit {self.proc.returncode}): {err}")
        return dict(json.loads(line))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


# ---------------------------------------------------------------- the case table


@dataclass(frozen=True)
class CaseSpec:
    number: int
    name: str
    injected: str
    must_hold: str
    run: Callable[[Lab, CaseResult], None]  # fills in the result's checks and figures


CASES: dict[int, CaseSpec] = {}


def case(number: int, name: str, injected: str, must_hold: str) -> Callable[[Callable[[Lab, CaseResult], None]], Any]:
    """Register a case for its row of the table."""

    def register(fn: Callable[[Lab, CaseResult], None]) -> Callable[[Lab, CaseResult], None]:
        assert number not in CASES, f"case {number} registered twice"
        CASES[number] = CaseSpec(number, name, injected, must_hold, fn)
        return fn

    return register


def run_case(spec: CaseSpec, lab: Lab) -> CaseResult:
    result = CaseResult(spec.number, spec.name, spec.injected, spec.must_hold)
    t0 = time.monotonic()
    try:
        spec.run(lab, result)
    except Exception as exc:  # a broken case fails with its error, and the suite goes on
        result.error = f"{type(exc).__name__}: {exc}"
    result.seconds = time.monotonic() - t0
    return result
