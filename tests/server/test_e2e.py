"""An aiortc client against the real server over 127.0.0.1: the whole path, then a clean idle state."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from benchmarks.local_server import ServerProcess, local_server
from tests.support.processes import children_of, pid_alive
from tests.support.waiting import wait_until, wait_until_async
from workers.runtime.channel import leaked_segments
from worldrtc import Session

pytestmark = pytest.mark.processes
WAIT_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerProcess, list[int]]]:
    log = tmp_path_factory.mktemp("e2e") / "server.log"
    with local_server(["--model", "tiny", "--placement", "cpu"], log) as srv:
        yield srv.url, srv, children_of(srv.proc.pid)


async def test_stream_controls_and_clean_close(server) -> None:
    url, _, _ = server
    tasks_idle = httpx.get(f"{url}/v1/engine").json()["event_loop_tasks"]
    client = Session(url, scene="main-street", prompt="a walk", seed=1, keep_frames=64)
    await client.start()
    try:
        first = (await client.next_frame()).image
        await wait_until_async(lambda: len(client.run.frames) >= 20, WAIT_S, "20 frames of video")
        assert client.run.ready is not None and client.run.ready["model"] == "tiny"
        seq = client.send({"type": "control", "key": "ArrowUp", "action": "press"})
        client.send({"type": "control", "key": "l", "action": "press"})
        echoed = await wait_until_async(
            lambda: [c for c in client.run.chunks if (c.get("applied_seq") or 0) >= seq], WAIT_S, "the controls applied"
        )
        assert {"w", "l"} <= set(echoed[-1]["applied_keys"])
        # Unknown and malformed messages get an error, and the session keeps working.
        client.channel.send('{"type": "teleport"}')
        client.channel.send("not json")
        client.channel.send('{"type": "look", "dx": "fast"}')
        client.channel.send('{"type": "ping", "pad": "' + "x" * 5000 + '"}')
        for _ in range(300):  # a flood well past 120 messages/s
            client.channel.send('{"type": "ping"}')
        expected_codes = {"unknown_type", "bad_json", "bad_message", "message_too_large", "rate_limited"}
        await wait_until_async(
            lambda: expected_codes <= {e["code"] for e in client.run.errors}, WAIT_S, f"error codes {expected_codes}"
        )
        frames_before = len(client.run.frames)
        await wait_until_async(lambda: len(client.run.frames) > frames_before, WAIT_S, "video after the flood")
        await wait_until_async(client.glass_to_glass_s, WAIT_S, "a control on the screen")
        latest = (await client.latest_frame()).image
        assert not np.array_equal(first, latest), "the video does not change"
    finally:
        final = await client.close()
    assert final is not None and final["state"] == "closed"

    async with httpx.AsyncClient(base_url=url) as http:

        async def engine_idle() -> dict | None:
            engine = (await http.get("/v1/engine")).json()
            return None if engine["sessions"] else engine

        engine = await wait_until_async(engine_idle, WAIT_S, "the engine to forget the session")
        assert engine["outstanding_slots"] == 0 and engine["counters"]["leaked_slots"] == 0
        # The server's own torch copies frames out of the workers' slots on one thread, not a pool
        # spinning on the cores the workers compute on.
        assert engine["server_intra_op_threads"] == 1
        assert all(st["slots_in_use"] == 0 and st["sessions"] == 0 for st in engine["stages"].values())
        # The session's tasks are gone too (the closed session lingers only as a record for GET).
        assert engine["event_loop_tasks"] <= tasks_idle + 1, (engine["event_loop_tasks"], tasks_idle)


def test_shutdown_leaves_nothing(server) -> None:
    _, srv, workers = server
    assert workers, "the server runs stage workers"
    srv.proc.send_signal(signal.SIGINT)
    assert srv.proc.wait(60) == 0
    # Children (stage workers, and multiprocessing's resource tracker) go with the server; they
    # notice within their parent-death poll.
    wait_until(lambda: not any(pid_alive(pid) for pid in workers), 10, "the server's children to exit")
    for pid in workers:
        assert leaked_segments(pid) == []
