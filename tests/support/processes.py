"""Process helpers: liveness by /proc state, and children (servers start via benchmarks.local_server)."""

from __future__ import annotations

import subprocess


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


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
