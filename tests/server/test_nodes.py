"""Two nodes behind Debian's HAProxy (docker/haproxy.cfg), each with one slot: creates spread over
the nodes with a free slot, each session's routes point at its own node, a third create is refused
with Retry-After, and a slot freed on a node takes the next create."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from benchmarks.local_server import ServerProcess, free_port, local_server
from tests.support.haproxy import haproxy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes
STOCK_CLIENT = Path(__file__).resolve().parents[1] / "support" / "stock_client.py"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    tmp = tmp_path_factory.mktemp("nodes")
    args = ["--model", "synthetic", "--stage-ms", "20,60,40", "--synthetic-geometry", "tiny", "--max-sessions", "1"]
    ports = [free_port(), free_port()]
    env = [{"WORLDRTC_PUBLIC_URL": f"http://127.0.0.1:{p}"} for p in ports]
    with (
        local_server(args, tmp / "node1.log", env=env[0], port=ports[0]) as one,
        local_server(args, tmp / "node2.log", env=env[1], port=ports[1]) as two,
    ):
        yield [one, two]


@pytest.fixture(scope="module")
def balancer(nodes: list[ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    hosts = [urlsplit(n.url).netloc for n in nodes]
    with haproxy(hosts[0], hosts[1], tmp_path_factory.mktemp("haproxy") / "haproxy.log") as url:
        yield url


def node_of(session_url: str) -> str:
    return f"http://{urlsplit(session_url).netloc}"


def viewer(url: str) -> subprocess.Popen[str]:
    """A stock aiortc viewer that creates through `url`, streams 24 frames, prints, and stays on."""
    cmd = [sys.executable, str(STOCK_CLIENT), url, "rest", "24", "--hang"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def capacity(node: ServerProcess) -> httpx.Response:
    return httpx.get(f"{node.url}/capacityz", timeout=10)


@pytest.mark.long
def test_sessions_spread_over_nodes_and_a_freed_slot_takes_the_next(nodes: list[ServerProcess], balancer: str) -> None:
    node_urls = {n.url for n in nodes}
    assert [capacity(n).json() for n in nodes] == [{"free": 1, "max_sessions": 1}] * 2
    first = viewer(balancer)
    got1 = json.loads(first.stdout.readline())  # type: ignore[union-attr]
    second = viewer(balancer)
    got2 = json.loads(second.stdout.readline())  # type: ignore[union-attr]
    try:
        # Each create landed on a node that had a free slot, so on different nodes; both stream.
        owners = {node_of(got1["session_url"]), node_of(got2["session_url"])}
        assert owners == node_urls, (got1, got2)
        assert got1["frames"] >= 24 and got2["frames"] >= 24
        for node in nodes:  # the probe the balancer checks: full
            r = capacity(node)
            assert r.status_code == 503 and r.json()["error"] == "full" and r.headers["retry-after"] == "5"

        # Both nodes full: the balancer (or a node not yet out of rotation) refuses, saying when to retry.
        def refused() -> httpx.Response | None:
            r = httpx.post(f"{balancer}/v1/sessions", json={"queue": False}, timeout=10)
            return r if r.status_code in (429, 503) else None

        r = wait_until(refused, 10, "a full cluster refusing a create")
        assert int(r.headers["retry-after"]) > 0 and r.json()["error"] in ("busy", "full")

        # One session ends: its node's slot takes the next create.
        freed = got1["session_url"]
        first.kill()
        first.wait()
        # The viewer is gone; ending its session at once (no API token on loopback) frees the slot now
        # rather than when its peer times out. 404: it had already ended.
        assert httpx.delete(freed, timeout=10).status_code in (200, 404)

        def created() -> dict | None:
            r = httpx.post(f"{balancer}/v1/sessions", json={"queue": False}, timeout=10)
            return r.json() if r.status_code == 201 else None

        again = wait_until(created, 30, "a create succeeding once a slot is free")
        assert node_of(again["session_url"]) == node_of(freed)
        httpx.delete(again["session_url"], headers={"authorization": f"Bearer {again['token']}"}, timeout=10)
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()
