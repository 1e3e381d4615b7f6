"""Prompts typed while walking, over WebRTC against the real server: the DiT reads the new prompt from
a chunk on and every chunk says which prompt it read; transitions, the rate limit (latest wins) and a
family without text (Matrix-Game: `not_supported`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.delivery import analyze
from benchmarks.local_server import local_server
from tests.support.regenerate import regenerate_exactly
from tests.support.waiting import wait_until_async
from workers.models.loading import model_events
from workers.models.presets import get_preset
from worldrtc import Session

pytestmark = pytest.mark.processes
WAIT_S = 60.0
FPS = 16
# Pipeline depth after the prompt lands: a chunk in the DiT, one waiting for it, and the encode of the
# prompt ahead of the next (the scheduler hands a prompt to the DiT's next chunk to start).
MAX_CHUNKS_LATE = 3


def _serve(tmp_path_factory: pytest.TempPathFactory, args: list[str]) -> Iterator[str]:
    log: Path = tmp_path_factory.mktemp("prompts") / "server.log"
    with local_server(args, log) as srv:
        yield srv.url


@pytest.fixture(
    scope="module", params=["tiny", pytest.param("gridworld", marks=pytest.mark.long)]
)  # gridworld: a real-time stream of its 128 × 128 frames, in the long tier
def model_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(tmp_path_factory, ["--model", request.param, "--placement", "cpu"])


@pytest.fixture(scope="module")
def synthetic_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(
        tmp_path_factory, ["--model", "synthetic", "--stage-ms", "20,250,100", "--synthetic-geometry", "tiny"]
    )


def _texts(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["prompt"]["text"] for c in sorted(chunks, key=lambda c: c["index"])]


@pytest.mark.long
async def test_the_dit_reads_a_typed_prompt_from_a_chunk_on_and_the_recording_regenerates_it(
    model_url: str, tmp_path: Path
) -> None:
    model = httpx.get(f"{model_url}/v1/model").json()
    assert model["live_prompts"] is True and model["limits"]["max_transition_chunks"] >= 1
    # The events the bundled weights learned, from their model card (tiny: random weights, none).
    learned = model_events(get_preset(model["model"]), None)
    assert model["events"] == [{"name": n, "prompt": p} for n, p in learned.items()]
    client = Session(model_url, prompt="a quiet town", seed=3)
    await client.start()
    try:
        await wait_until_async(lambda: len(client.run.chunks) >= 2, WAIT_S, "two chunks")
        client.hold("w")
        sent_after = max(c["index"] for c in client.run.chunks)
        client.prompt("snow falls")
        await wait_until_async(
            lambda: "snow falls" in _texts(client.run.chunks) and len(client.run.chunks) >= sent_after + 5,
            WAIT_S,
            "chunks after the prompt",
        )
    finally:
        await client.close()
    texts = _texts(client.run.chunks)
    switch = texts.index("snow falls")
    assert texts[:switch] == ["a quiet town"] * switch and set(texts[switch:]) == {"snow falls"}, texts
    assert sent_after < switch <= sent_after + MAX_CHUNKS_LATE, (sent_after, texts)
    assert not client.run.errors
    latency = client.prompt_to_frame_s()  # send → first frame of the first chunk that read it
    assert len(latency) == 1 and 0 < latency[0] < WAIT_S

    # The recording keeps the change on the chunk whose DiT took it; the replay hands it to exactly
    # that chunk and meets every digest.
    sid = client.info["session_id"]
    record = httpx.get(f"{model_url}/v1/sessions/{sid}/recording").json()
    changes = {c["index"]: c["prompt"] for c in record["chunks"] if "prompt" in c}
    assert record["prompt"] == "a quiet town" and changes == {switch: {"text": "snow falls", "transition_chunks": 1}}
    regenerate_exactly(record, tmp_path)


async def test_a_transition_and_fifty_prompts_in_a_second(synthetic_url: str) -> None:
    client = Session(synthetic_url, prompt="day", seed=0)
    await client.start()
    try:
        await wait_until_async(lambda: len(client.run.chunks) >= 2, WAIT_S, "two chunks")
        client.prompt("dusk", transition_chunks=3)
        await wait_until_async(
            lambda: any(c["prompt"] == {"text": "dusk"} for c in client.run.chunks), WAIT_S, "the transition's end"
        )
        # Fifty prompts within a second: each chunk reads the latest, nothing queues up behind them.
        for i in range(50):
            client.prompt(f"night {i}")
            await asyncio.sleep(0.018)
        flood_to = max(c["index"] for c in client.run.chunks)
        await wait_until_async(lambda: "night 49" in _texts(client.run.chunks), WAIT_S, "the last prompt")
        await wait_until_async(lambda: len(client.run.chunks) >= flood_to + MAX_CHUNKS_LATE + 2, WAIT_S, "chunks")
    finally:
        await client.close()
    receipts = [c["prompt"] for c in sorted(client.run.chunks, key=lambda c: c["index"])]
    start = next(i for i, r in enumerate(receipts) if r["text"] == "dusk")
    assert receipts[start : start + 3] == [
        {"text": "dusk", "weight": round(1 / 3, 6), "from": "day"},
        {"text": "dusk", "weight": round(2 / 3, 6), "from": "day"},
        {"text": "dusk"},
    ]
    nights = [(i, r["text"]) for i, r in enumerate(receipts) if r["text"].startswith("night")]
    order = [int(text.split()[1]) for _, text in nights]
    assert order == sorted(order), nights  # never an older prompt after a newer one
    first_last = next(i for i, text in nights if text == "night 49")
    assert first_last <= flood_to + MAX_CHUNKS_LATE, (flood_to, nights)  # no backlog of encodes
    assert all(text == "night 49" for i, text in nights if i >= first_last)
    assert not client.run.errors  # fifty a second is within the prompt rate
    chunks = sorted(client.run.chunks, key=lambda c: c["index"])
    report = analyze(client.run.session_frames(), chunks, client.run.sent, FPS, chunks[0]["num_frames"], stamped=True)
    assert report["repeated_frames_after_first_chunk"] == 0, report  # the stream kept its frame rate


async def test_a_rewind_past_a_prompt_change_brings_back_the_old_prompt(synthetic_url: str) -> None:
    client = Session(synthetic_url, prompt="day", seed=0)
    await client.start()
    try:
        await wait_until_async(lambda: len(client.run.chunks) >= 2, WAIT_S, "two chunks")
        saved = await client.save()
        b = saved["chunk_index"]
        client.prompt("night falls")
        await wait_until_async(lambda: "night falls" in _texts(client.run.chunks), WAIT_S, "the new prompt read")
        changed_at = min(c["index"] for c in client.run.chunks if c["prompt"]["text"] == "night falls")
        assert changed_at >= b  # the change came after the snapshot
        seen = len(client.run.chunks)
        await client.restore(saved["snapshot_id"])
        await wait_until_async(lambda: client.run.rewinds, WAIT_S, "a rewound message")
        # Every chunk of the first engine session up to the change had arrived before `seen`: a chunk
        # numbered up to `changed_at` arriving after it is the rewound session's.
        await wait_until_async(
            lambda: any(c["index"] == changed_at for c in client.run.chunks[seen:]), WAIT_S, "the chunk again"
        )
    finally:
        await client.close()
    again = {c["index"]: c["prompt"] for c in client.run.chunks[seen:] if c["index"] <= changed_at}
    # The snapshot holds the prompt as it was: the chunk that read the new prompt reads the old one again.
    assert set(again) == set(range(b, changed_at + 1)) and all(p == {"text": "day"} for p in again.values()), again


async def test_a_family_without_text_answers_not_supported(tmp_path: Path) -> None:
    args = ["--model", "synthetic", "--stage-ms", "20,100,50", "--synthetic-geometry", "matrix-game-2-tiny"]
    with local_server(args, tmp_path / "server.log") as srv:
        assert httpx.get(f"{srv.url}/v1/model").json()["live_prompts"] is False
        client = Session(srv.url)
        await client.start()
        try:
            await wait_until_async(lambda: client.run.chunks, WAIT_S, "a chunk")
            client.prompt("snow")
            error = await wait_until_async(lambda: client.run.errors, WAIT_S, "an error")
            frames = len(client.run.frames)
            await wait_until_async(lambda: len(client.run.frames) > frames, WAIT_S, "video after the refusal")
        finally:
            await client.close()
    assert error[0]["code"] == "not_supported" and "prompt cannot change" in error[0]["message"]
    assert all(c["prompt"] is None for c in client.run.chunks)
