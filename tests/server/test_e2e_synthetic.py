"""Live pipelining end to end: the synthetic timing model through the real server and an aiortc client.

Stages hold 50, 600 and 500 ms per 1 s chunk, so the DiT + decode latency (1.1 s) exceeds a chunk's
media time: only a viewer whose next chunk enters the DiT while the previous one decodes gets every
frame. Needs processes: the server, its three stage workers and a real peer connection.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.delivery import analyze
from benchmarks.local_server import local_server
from benchmarks.timeline import FRAMES_LANE, PACER_LANE, STAGES, lanes, overlap_s, timeline_bars
from benchmarks.timeline import main as timeline_main
from tests.support.waiting import wait_until_async
from worldrtc import Session

pytestmark = pytest.mark.processes
STAGE_MS = "50,600,500"
CHUNKS = 8
FPS = 16


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log: Path = tmp_path_factory.mktemp("synthetic") / "server.log"
    args = ["--model", "synthetic", "--stage-ms", STAGE_MS, "--synthetic-geometry", "tiny"]
    with local_server(args, log) as srv:
        yield srv.url


async def test_live_session_overlaps_dit_and_decode_and_repeats_nothing(server_url: str, tmp_path: Path) -> None:
    client = Session(server_url)
    await client.start()
    try:
        await wait_until_async(lambda: len(client.run.chunks) >= 2, 60, "two chunks")
        client.send({"type": "control", "key": "w", "action": "press"})
        await wait_until_async(lambda: len(client.run.chunks) >= CHUNKS, 60, f"{CHUNKS} chunks")
        last_pts = max(c["pts_end"] for c in client.run.chunks[:CHUNKS])
        await wait_until_async(lambda: any(f.pts >= last_pts for f in client.run.frames), 30, "their frames")
        await asyncio.sleep(0)  # let the last frame's bookkeeping finish
        # The pacer keeps ticking between two requests: bracket the timeline by two metric reads.
        before = await client.server_info()
        live = await client.timeline()
        server = await client.server_info()
    finally:
        await client.close()
    run = client.run
    assert run.ready is not None and run.ready["model"] == "synthetic" and run.ready["dispatch"] == "jit"
    chunks = sorted(run.chunks, key=lambda c: c["index"])[:CHUNKS]

    # Chunk k+1 entered the DiT before chunk k's decode was done, every time after start-up (chunk 1
    # starts as soon as the DiT is free, which leaves chunk 2 some slack).
    overlaps = [b["stages"]["dit"][0] < a["stages"]["decode"][1] for a, b in itertools.pairwise(chunks)]
    assert all(overlaps[2:]), [(c["index"], c["stages"]) for c in chunks]

    frames = [f for f in run.frames if f.pts <= chunks[-1]["pts_end"]]
    report = analyze(frames, chunks, run.sent, FPS, chunks[0]["num_frames"], stamped=True)
    assert report["out_of_order_frames"] == 0  # every stamp readable, in order
    assert report["repeated_frames_after_first_chunk"] == 0, report
    assert report["unique_frames"] == sum(c["num_frames"] for c in chunks)
    assert report["pts_identity_agrees_with_stamps"] == 1.0  # the pts map real models rely on is exact

    # The live stage timeline (GET /v1/sessions/{id}/timeline) says the same, in the replay's shape.
    rows = {c["index"]: c for c in live["chunks"]}
    assert set(range(CHUNKS)) <= set(rows)
    for k in range(CHUNKS):
        spans = rows[k]["stage_spans_s"]
        assert set(spans) == set(STAGES)
        assert spans["encode"][1] <= spans["dit"][0] < spans["dit"][1] <= spans["decode"][0] < spans["decode"][1]
    bars = timeline_bars(live)
    assert overlap_s(bars, "dit", "decode") > 0.1  # the next chunk denoises while this one decodes
    pacer = live["pacer"]
    assert len(pacer["t_s"]) == len(pacer["buffered_frames"]) == len(pacer["repeated"]) > 0
    assert all(b >= a for a, b in itertools.pairwise(pacer["t_s"]))
    assert max(pacer["buffered_frames"]) <= 2 * chunks[1]["num_frames"] + 4  # the pacer's bound
    ticks, repeats = len(pacer["repeated"]), sum(pacer["repeated"])
    assert before["metrics"]["frames_sent"] <= ticks <= server["metrics"]["frames_sent"]  # every tick so far
    assert before["metrics"]["frames_repeated"] <= repeats <= server["metrics"]["frames_repeated"]
    # Each control's way to the screen, in order: it waited for a chunk to take it, that chunk's compute,
    # then the pacer's queue.
    assert live["controls"]
    for c in live["controls"]:
        assert 0 < c["arrived_s"] <= c["sampled_s"] < c["in_pacer_s"] <= c["shown_s"], c
    assert lanes(live) == [*STAGES, FRAMES_LANE, PACER_LANE]
    # The CLI draws it straight from the URL, with the session's own token (closed sessions stay a while).
    pytest.importorskip("matplotlib")
    assert client.info is not None
    picture, url = tmp_path / "live.svg", f"{server_url}/v1/sessions/{client.info['session_id']}/timeline"
    # `--token=…` in one word: a URL-safe token may start with "-", which argparse would read as a flag.
    assert timeline_main([url, f"--token={client.info['token']}", "--out", str(picture)]) == 0
    assert "pacer buffer" in picture.read_text()
