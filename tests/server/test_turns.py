"""Turns over real peers: a driver alone keeps the slot past max_turn_s; once someone waits it is told
`turn_ending`, then ends with `turn_over`, and the waiting client's ticket becomes its session:
a world of its own (fresh) or the same world where it was (continue: a branch of a snapshot taken at
the turn's end). The synthetic model's stage workers and aiortc clients on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.local_server import ServerProcess, local_server
from tests.support.waiting import wait_until_async
from worldrtc import Session

pytestmark = pytest.mark.processes
MAX_TURN_S = 3.0
WARNING_S = 1.0


@pytest.fixture(scope="module", params=["fresh", pytest.param("continue", marks=pytest.mark.long)])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, str]]:
    log: Path = tmp_path_factory.mktemp("turns") / "server.log"
    args = ["--model", "synthetic", "--stage-ms", "10,60,40", "--synthetic-geometry", "tiny", "--max-sessions", "1"]
    args += ["--max-turn-s", str(MAX_TURN_S), "--turn-warning-s", str(WARNING_S), "--turn-handover", request.param]
    with local_server(args, log) as srv:
        yield srv, request.param


async def test_a_turn_ends_only_while_someone_waits_and_the_slot_goes_to_them(
    server: tuple[ServerProcess, str],
) -> None:
    srv, handover = server
    first = await Session(srv.url).start()
    second = Session(srv.url, poll_s=0.3)
    try:
        first.press("w")
        # Alone, the driver keeps the slot past its turn.
        await asyncio.sleep(MAX_TURN_S + 1.0)
        assert first.run.done is None and first.run.turn_endings == []
        asked_t = time.perf_counter()
        waiting = asyncio.create_task(second.start())
        await wait_until_async(lambda: first.run.turn_endings, 5, "turn_ending for the driver")
        told_t = time.perf_counter()
        # The warning, or in `continue` the two chunks its snapshot may wait for if that is longer.
        lead_s = 2.0 if handover == "continue" else 0.0  # tiny: 16 frames a chunk at 16 FPS
        assert first.run.turn_endings[0]["seconds_left"] == pytest.approx(max(WARNING_S, lead_s), abs=0.3)
        await wait_until_async(lambda: first.run.done is not None, 5, "the turn's end")
        # On time in both modes: `continue` asks for its snapshot ahead of the end.
        assert time.perf_counter() - told_t == pytest.approx(first.run.turn_endings[0]["seconds_left"], abs=0.6)
        assert first.run.done is not None and first.run.done["code"] == "turn_over"
        await asyncio.wait_for(waiting, 30)
        await wait_until_async(lambda: len(second.run.frames) >= 16, 30, "the next driver's frames")
        took_s = second.run.frames[0].t - asked_t
        said = [w for _, w in second.run.waits]
        assert said[0]["state"] == "waiting" and said[0]["position"] == 1
        assert "watch_url" in said[0], "the one in line can watch the world meanwhile"
        assert said[-1]["state"] == "ready"
        assert WARNING_S <= took_s < WARNING_S + 6, took_s
        parent = second.run.ready and second.run.ready.get("parent")
        spans = (await second.recording())["drivers"]
        assert first.info is not None and second.info is not None
        if handover == "continue":  # the same world, from where the last turn left it: one line, two drivers
            assert parent is not None and parent["chunk_index"] > 0, second.run.ready
            assert min(c["index"] for c in second.run.chunks) == parent["chunk_index"]
            assert spans == [
                {"session_id": first.info["session_id"], "from_chunk": 0},
                {"session_id": second.info["session_id"], "from_chunk": parent["chunk_index"]},
            ]
        else:
            assert parent is None and min(c["index"] for c in second.run.chunks) == 0
            assert spans == [{"session_id": second.info["session_id"], "from_chunk": 0}]
    finally:
        await second.close()
        await first.close()
