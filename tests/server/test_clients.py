"""Any WebRTC client can watch and steer: stock aiortc in its own process (REST and WHEP), a viewer that
sends nothing, one that vanishes, a second connection refused, and the project's own Python client.

Needs processes: the server and its workers, and viewers in processes that import nothing of ours
and patch nothing (the test process's own aioice may be patched by other tests' servers).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.local_server import ServerProcess, local_server
from tests.support.waiting import wait_until, wait_until_async
from worldrtc import ClientError, Session

pytestmark = pytest.mark.processes
STOCK_CLIENT = Path(__file__).resolve().parents[1] / "support" / "stock_client.py"
# The session timers a silent viewer could trip, all but the idle one, shortened from their defaults
# (offer 30 s, ICE 15 s) so that watching past them all takes seconds, not a minute.
TIMERS_ENV = {"WORLDRTC_OFFER_TIMEOUT_S": "10", "WORLDRTC_ICE_TIMEOUT_S": "8"}
WATCH_S = 14.0  # past the offer, ICE and peer (4.5 s) timers


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # The synthetic model on the tiny geometry: real workers and video, almost no compute.
    args = ["--model", "synthetic", "--stage-ms", "20,60,40", "--synthetic-geometry", "tiny", "--max-sessions", "4"]
    with local_server(args, tmp_path_factory.mktemp("clients") / "server.log", env=TIMERS_ENV) as srv:
        yield srv


def stock_client(url: str, mode: str, frames: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(STOCK_CLIENT), url, mode, str(frames), *extra], stdout=subprocess.PIPE, text=True
    )


def session_record(url: str, session_id: str) -> dict:
    return httpx.get(f"{url}/v1/sessions/{session_id}").json()


def test_stock_aiortc_client_streams_over_rest(server: ServerProcess) -> None:
    proc = stock_client(server.url, "rest", 32)
    out, _ = proc.communicate(timeout=180)
    got = json.loads(out)
    # It offered its own (non-loopback) addresses; the server kept them, as they are this host's.
    assert any("127.0.0.1" not in c for c in got["offer_candidates"]), got["offer_candidates"]
    assert got["created"] == {"status": 201, "scene": "main-street"}  # POST /v1/sessions {}: the default scene
    assert got["frames"] >= 32 and got["pts_increasing"] and got["delete_status"] == 200


def test_whep_exchange_from_a_plain_client(server: ServerProcess) -> None:
    proc = stock_client(server.url, "whep", 32)
    out, _ = proc.communicate(timeout=180)
    got = json.loads(out)
    assert got["created"] == {"status": 201, "content_type": "application/sdp"}
    assert got["location"] == f"/v1/whep/{got['session_id']}"
    assert got["frames"] >= 32 and got["patch_status"] == 405 and got["delete_status"] == 200
    record = wait_until(lambda: session_record(server.url, got["session_id"]), 10, "the session record")
    assert (record["state"], record["ended"]) == ("closed", "deleted")


def test_whep_refuses_what_is_not_sdp(server: ServerProcess) -> None:
    r = httpx.post(f"{server.url}/v1/whep", json={"sdp": "v=0"})
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"
    r = httpx.post(f"{server.url}/v1/whep?seed=-3", content=b"v=0", headers={"content-type": "application/sdp"})
    assert r.status_code == 400 and "seed" in r.json()["message"]


def test_a_vanished_viewer_is_noticed_from_the_connection(server: ServerProcess) -> None:
    proc = stock_client(server.url, "rest", 16, "--hang")
    assert proc.stdout is not None
    got = json.loads(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)  # no DELETE, no close: the process is just gone
    killed_t = time.monotonic()
    proc.wait(10)
    record = wait_until(
        lambda: (r := session_record(server.url, got["session_id"]))["ended"] and r, 30, "the server to notice"
    )
    noticed_s = time.monotonic() - killed_t
    print(f"vanished viewer noticed after {noticed_s:.1f} s")
    assert record["ended"] == "peer_gone" and "RTCP" in record["error"], record


@pytest.mark.long
async def test_a_watch_only_viewer_keeps_streaming_without_sending_anything(server: ServerProcess) -> None:
    async with Session(server.url) as viewer:  # sends nothing at all: no controls, no pings
        t0 = time.perf_counter()
        await asyncio.sleep(WATCH_S)
        info = await viewer.server_info()
        times = [f.t for f in viewer.run.frames if f.t >= t0]
    assert info["state"] == "streaming" and info["ended"] is None
    assert len(times) >= 0.95 * 16 * WATCH_S
    assert max(b - a for a, b in itertools.pairwise(times)) < 1.0  # never stalled


async def test_the_python_client_steers_and_a_second_connection_is_refused(server: ServerProcess) -> None:
    async with Session(server.url, whep=False, seed=3) as s:
        seq = s.press("w")
        await wait_until_async(lambda: any((c["applied_seq"] or 0) >= seq for c in s.run.chunks), 60, "w applied")
        frame = await s.next_frame()
        assert frame.image.shape == (128, 128, 3) and frame.image.dtype.name == "uint8"
        chunk = await wait_until_async(lambda: s.chunk_at(frame.pts), 30, "the frame's chunk message")
        assert chunk["first_frame"] <= frame.pts // (90_000 // 16) < chunk["first_frame"] + chunk["num_frames"]
        assert s.glass_to_glass_s(), "the press reached the screen"
        assert s.info is not None
        r = httpx.post(
            f"{server.url}/v1/sessions/{s.info['session_id']}/offer",
            json={"sdp": "v=0", "type": "offer"},
            headers={"authorization": f"Bearer {s.info['token']}"},
        )
        assert r.status_code == 409 and r.json()["error"] == "already_connected", r.text
    with pytest.raises(ClientError) as info:
        await Session(server.url, scene="atlantis").start()
    assert info.value.code == "unknown_scene" and "atlantis" in info.value.message


async def test_the_python_client_watches_over_whep(server: ServerProcess) -> None:
    viewer = Session(server.url, whep=True, control=False)
    await viewer.start()
    try:
        frames = [f async for f in viewer.frames(limit=20)]
        assert len(frames) == 20 and all(b.pts > a.pts for a, b in itertools.pairwise(frames))
        assert viewer.info is not None and viewer.info["resource"].startswith("/v1/whep/")
    finally:
        await viewer.close()
    sid = viewer.info["resource"].rsplit("/", 1)[-1]
    assert session_record(server.url, sid)["ended"] == "deleted"
