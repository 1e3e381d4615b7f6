"""The CPU image, built from a base made from Debian's packages, run with podman, streamed from.

Marker `container`: building takes minutes (and needs root, podman, runc and debootstrap), so it is
left out of `make test`; `make test-container` runs it. The container uses host networking and binds
loopback, so nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.local_server import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.container
REPO = Path(__file__).resolve().parents[2]
STOCK_CLIENT = REPO / "tests" / "support" / "stock_client.py"
IMAGE = "localhost/worldrtc:cpu"
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / "docker" / "containers.conf")}


def podman(*args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=ENV, capture_output=True, text=True, timeout=timeout_s, check=check)


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.skip("needs root and podman (apt-get install podman buildah runc debootstrap)")
    build = subprocess.run(
        ["bash", str(REPO / "docker" / "build.sh"), "cpu", IMAGE], env=ENV, capture_output=True, text=True, timeout=1800
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return IMAGE


@pytest.fixture
def container(image: str) -> Iterator[tuple[str, str]]:
    port, name = free_port(), f"worldrtc-test-{free_port()}"
    env = ["-e", "WORLDRTC_HOST=127.0.0.1", "-e", f"WORLDRTC_PORT={port}"]
    podman("run", "-d", "--name", name, "--network", "host", *env, image)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), 300, "the container's server ready")
        yield name, url
    finally:
        podman("rm", "-f", name, check=False)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=3).status_code == 200
    except httpx.TransportError:
        return False


def test_the_cpu_image_serves_streams_and_drains_on_sigterm(container: tuple[str, str]) -> None:
    name, url = container
    assert podman("exec", name, "id", "-u").stdout.strip() == "1000"  # not root
    assert podman("healthcheck", "run", name, check=False).returncode == 0  # the image's healthcheck
    viewer = [sys.executable, str(STOCK_CLIENT), url, "rest", "32"]
    done = subprocess.run(viewer, capture_output=True, text=True, timeout=180)
    got = json.loads(done.stdout)
    assert got["frames"] >= 32 and got["pts_increasing"] and got["delete_status"] == 200
    # SIGTERM reaches the server (PID 1): it drains and exits 0 well before the kill.
    podman("stop", "--time", "40", name, timeout_s=60)
    state = json.loads(podman("inspect", name).stdout)[0]["State"]
    assert state["ExitCode"] == 0, state
    logs = podman("logs", name).stdout + podman("logs", name).stderr
    assert "Finished server process [1]" in logs
