"""An aiortc client against the real server over 127.0.0.1: the whole path, then a clean idle state."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.webrtc_replay import WebRTCClient, use_loopback_if_local
from workers.runtime.channel import leaked_segments

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--port", str(port), "--model", "tiny", "--placement", "cpu"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.3)
    else:
        proc.kill()
        raise AssertionError("server did not become ready")
    workers = children_of(proc.pid)
    yield url, proc, workers
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


async def test_stream_controls_and_clean_close(server) -> None:
    url, _, _ = server
    use_loopback_if_local(url)
    tasks_idle = httpx.get(f"{url}/v1/engine").json()["event_loop_tasks"]
    client = WebRTCClient(url)
    client.run.keep_frames = 200
    await client.start("main-street", "a walk", seed=1)
    try:
        deadline = time.monotonic() + 60
        while len(client.run.frame_times) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(client.run.frame_times) >= 20, "no video"
        assert client.run.ready is not None and client.run.ready["model"] == "tiny"
        seq = client.send({"type": "control", "key": "ArrowUp", "action": "press"})
        client.send({"type": "control", "key": "l", "action": "press"})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            echoed = [c for c in client.run.chunks if (c.get("applied_seq") or 0) >= seq]
            if echoed:
                break
            await asyncio.sleep(0.1)
        assert echoed, "controls were never applied"
        assert {"w", "l"} <= set(echoed[-1]["applied_keys"])
        # Unknown and malformed messages get an error, and the session keeps working.
        client.channel.send('{"type": "teleport"}')
        client.channel.send("not json")
        client.channel.send('{"type": "look", "dx": "fast"}')
        client.channel.send('{"type": "ping", "pad": "' + "x" * 5000 + '"}')
        for _ in range(300):  # a flood well past 120 messages/s
            client.channel.send('{"type": "ping"}')
        await asyncio.sleep(1.0)
        codes = [e["code"] for e in client.run.errors]
        assert {"unknown_type", "bad_json", "bad_message", "message_too_large", "rate_limited"} <= set(codes), codes
        frames_before = len(client.run.frame_times)
        await asyncio.sleep(1.5)
        assert len(client.run.frame_times) > frames_before
        assert client.run.glass_to_glass_s(), "no control reached the screen"
        kept = client.run.frames
        assert len(kept) >= 20 and not np.array_equal(kept[0], kept[-1]), "the video does not change"
    finally:
        final = await client.close()
    assert final is not None and final["state"] == "closed"

    async with httpx.AsyncClient(base_url=url) as http:
        for _ in range(50):
            engine = (await http.get("/v1/engine")).json()
            if not engine["sessions"]:
                break
            await asyncio.sleep(0.1)
        assert engine["sessions"] == {}
        assert engine["outstanding_slots"] == 0 and engine["counters"]["leaked_slots"] == 0
        assert all(st["slots_in_use"] == 0 and st["sessions"] == 0 for st in engine["stages"].values())
        # The session's tasks are gone too (the closed session lingers only as a record for GET).
        assert engine["event_loop_tasks"] <= tasks_idle + 1, (engine["event_loop_tasks"], tasks_idle)


def test_shutdown_leaves_nothing(server) -> None:
    _, proc, workers = server
    assert workers, "the server runs stage workers"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    # Children (stage workers, and multiprocessing's resource tracker) go with the server; allow
    # them a moment to notice.
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in workers:
        assert not _running(pid), f"child {pid} outlived the server"
        assert leaked_segments(pid) == []


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
