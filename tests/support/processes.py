"""Process and port helpers: liveness by /proc state, children, free loopback ports, a server subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SERVER_READY_TIMEOUT_S = 120.0
SERVER_EXIT_TIMEOUT_S = 60.0


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "<no server log>"


@dataclass
class ServerProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> int:
        """SIGINT, wait; SIGKILL the whole group if it hangs. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=SERVER_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode


def _ready(server: ServerProcess) -> bool:
    if server.proc.poll() is not None:
        raise AssertionError(f"server exited with {server.proc.returncode} before it was ready:\n{tail(server.log)}")
    try:
        return httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def running_server(log: Path, *args: str) -> Iterator[ServerProcess]:
    """`python -m server --port <free> *args` on loopback, ready (workers warm) when yielded; stopped after."""
    port = free_port()
    cmd = [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(port), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        # Own process group: a last-resort cleanup reaches the stage workers too.
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = ServerProcess(f"http://127.0.0.1:{port}", proc, log)
    try:
        try:
            wait_until(lambda: _ready(server), SERVER_READY_TIMEOUT_S, "the server to be ready", poll_s=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{tail(log)}") from None
        yield server
    finally:
        server.stop()
