"""Start `python -m server …` on a free loopback port, wait until it is warm, stop it afterwards.

    with local_server(["--model", "synthetic", "--stage-ms", "100,800,500"], Path("runs/server.log")) as url:
        ...

The server runs in its own process group (so its stage workers can be reached if it hangs), logs to
`log`, and is stopped with SIGINT (SIGKILL to the group if it does not exit in time).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

READY_TIMEOUT_S = 180.0
EXIT_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "<no server log>"


@dataclass
class ServerProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.proc.returncode} before it was ready:\n{log_tail(self.log)}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> int:
        """SIGINT, wait; SIGKILL the whole group if it hangs. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode


def start_server(
    args: list[str],
    log: Path,
    ready_timeout_s: float = READY_TIMEOUT_S,
    env: dict[str, str] | None = None,
    host: str | None = "127.0.0.1",
    port: int | None = None,
    entry: tuple[str, ...] = ("-m", "server"),
) -> ServerProcess:
    """Start a server and wait until it is warm; the caller stops it. `env`: extra environment, e.g.
    WORLDRTC_* settings that have no flag. `host` None: the server's default bind. `port` None: a free one.
    `entry`: how it is started, after the interpreter (`-m worldrtc serve` is `worldrtc serve`)."""
    port = free_port() if port is None else port
    cmd = [sys.executable, *entry, *(("--host", host) if host else ()), "--port", str(port), *args]
    # No saves on disk unless asked for (WORLDRTC_SNAPSHOT_DIR in `env` or the environment): a
    # benchmark's or a test's server neither writes the user's state directory nor reads another's saves.
    saves = {} if "WORLDRTC_SNAPSHOT_DIR" in os.environ else {"WORLDRTC_SNAPSHOT_DIR": ""}
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **saves, **(env or {})}
    log.parent.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[1]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=repo, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    server = ServerProcess(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not server.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready within {ready_timeout_s:g} s:\n{log_tail(log)}")
            time.sleep(0.2)
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def local_server(
    args: list[str],
    log: Path,
    ready_timeout_s: float = READY_TIMEOUT_S,
    env: dict[str, str] | None = None,
    host: str | None = "127.0.0.1",
    port: int | None = None,
    entry: tuple[str, ...] = ("-m", "server"),
) -> Iterator[ServerProcess]:
    server = start_server(args, log, ready_timeout_s, env, host, port, entry)
    try:
        yield server
    finally:
        server.stop()
