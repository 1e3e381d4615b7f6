"""Debian's HAProxy, started on loopback with the repository's docker/haproxy.cfg in front of two nodes."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from benchmarks.local_server import free_port
from tests.support.processes import stop
from tests.support.waiting import wait_until

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _haproxy() -> str | None:
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


@contextmanager
def haproxy(node1: str, node2: str, log: Path) -> Iterator[str]:
    """The balancer's base URL; `node1`, `node2`: "host:port" of the two nodes."""
    exe = _haproxy()
    if exe is None:
        pytest.skip("haproxy is missing (make packages installs Debian's haproxy)")
    port = free_port()
    env = {
        **os.environ,
        "WORLDRTC_BALANCER_BIND": f"127.0.0.1:{port}",
        "WORLDRTC_NODE1": node1,
        "WORLDRTC_NODE2": node2,
        "WORLDRTC_HAPROXY_DIR": str(DOCKER),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen([exe, "-db", "-f", str(DOCKER / "haproxy.cfg")], env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url), 20, "haproxy listening")
        yield url
    finally:
        stop(proc)


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/healthz", timeout=2)
        return True
    except httpx.TransportError:
        return False
