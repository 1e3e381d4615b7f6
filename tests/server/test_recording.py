"""Recordings through the real server: a session steered over the data channel keeps its recipe and
each chunk's digest; its video plays during and after the session; the recording regenerates the
session headless with every chunk's digest equal, and is refused on other weights."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import av
import httpx
import numpy as np
import pytest

from benchmarks.local_server import ServerProcess, local_server
from server.media import recording
from server.media.recording import RECORDING_SCHEMA, SessionRecording, read_image_from
from server.media.recording_store import RecordingStore
from tests.support.waiting import wait_until_async
from workers.chunk_geometry import chunk_num_frames
from workers.controls import ChunkControl
from worldrtc import Session

WAIT_S = 90.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerProcess, Path]]:
    tmp = tmp_path_factory.mktemp("recording")
    env = {"WORLDRTC_RECORDINGS_DIR": str(tmp / "videos")}
    with local_server(["--model", "tiny", "--placement", "cpu"], tmp / "server.log", env=env) as srv:
        yield srv.url, srv, tmp


def _applied(client: Session, seq: int) -> bool:
    return any((c.get("applied_seq") or 0) >= seq for c in client.run.chunks)


def _video_frames(data: bytes, path: Path, growing: bool = False) -> int:
    """Frames a player decodes from the file. A file still being written may end inside its last
    fragment: a player plays the fragments before it, as this counts them."""
    path.write_bytes(data)
    frames = 0
    with av.open(str(path)) as container:
        try:
            for packet in container.demux(video=0):
                frames += len(packet.decode())
        except av.error.InvalidDataError:
            if not growing:
                raise
    return frames


@pytest.mark.long
@pytest.mark.processes
async def test_a_session_is_recorded_and_regenerates_exactly(server) -> None:
    url, _, tmp = server
    client = Session(url, scene="main-street", prompt="a walk", seed=3, keep_frames=8)
    await client.start()
    sid = client.info["session_id"]
    assert client.info["recording_url"].endswith(f"/v1/sessions/{sid}/recording")
    assert client.info["video_url"].endswith(f"/v1/sessions/{sid}/video.mp4")
    try:
        await client.next_frame()
        seq = client.press("w")
        await wait_until_async(lambda: any((c.get("applied_seq") or 0) >= seq for c in client.run.chunks), WAIT_S, "W")
        seq = client.look(40.0, -10.0)
        await wait_until_async(
            lambda: any((c.get("applied_seq") or 0) >= seq for c in client.run.chunks), WAIT_S, "look"
        )
        client.release("w")
        seq = client.reset_pose()
        await wait_until_async(lambda: _applied(client, seq), WAIT_S, "the pose reset")
        await wait_until_async(lambda: len(client.run.chunks) >= 6, WAIT_S, "six chunks")
        # During the session, through the Python client: the recording so far, and a video that plays.
        live = await client.recording()
        assert live["schema"] == RECORDING_SCHEMA and len(live["chunks"]) >= 1
        size = await client.save_video(str(tmp / "live.mp4"))
        assert size > 0 and _video_frames((tmp / "live.mp4").read_bytes(), tmp / "live.mp4", growing=True) >= 1
    finally:
        await client.close()

    async with httpx.AsyncClient(base_url=url) as http:
        got = await http.get(f"/v1/sessions/{sid}/recording")
        video = await http.get(f"/v1/sessions/{sid}/video.mp4")
    assert got.headers["content-disposition"].startswith("attachment")
    record = got.json()
    assert record["complete"] and record["model"] == "tiny" and record["seed"] == 3 and record["prompt"] == "a walk"
    assert record["weights"].startswith("random:")  # tiny runs on seeded random weights
    chunks = record["chunks"]
    assert [c["index"] for c in chunks] == list(range(len(chunks))) and len(chunks) >= 6
    assert all(len(c["frames_sha256"]) == 64 for c in chunks)
    assert any(c["keys"] == ["w"] for c in chunks) and any(c["look"] == [40.0, -10.0] for c in chunks)
    assert any(c["reset_pose"] for c in chunks)
    image = read_image_from(record)
    assert image.shape == (record["image"]["height"], record["image"]["width"], 3)
    # The video holds every generated frame, at the model's resolution.
    frames = sum(chunk_num_frames(c["index"], record["chunk_latent_frames"]) for c in chunks)
    assert record["video"] == {"frames": frames, "bytes": len(video.content), "complete": True, "reason": None}
    assert _video_frames(video.content, tmp / "after.mp4") == frames
    # A few kilobytes a minute: the per-chunk entries, beside the start image.
    entries = len(json.dumps(chunks, separators=(",", ":")))
    assert entries / len(chunks) < 160, entries  # under 10 kB a minute at gridworld's chunk a second

    path = tmp / "rec.json"
    path.write_text(got.text)
    cmd = [sys.executable, "-m", "benchmarks.replay", "--recording", str(path), "--quiet"]
    done = subprocess.run([*cmd, "--out", str(tmp / "run.json")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"every chunk's digest equal ({len(chunks)} of {len(chunks)})" in done.stdout
    run = json.loads((tmp / "run.json").read_text())
    assert [c["frames_sha256"] for c in run["chunks"]] == [c["frames_sha256"] for c in chunks]

    # Other weights are refused before anything loads.
    done = subprocess.run([*cmd, "--weights-seed", "1", "--out", str(tmp / "x.json")], capture_output=True, text=True)
    assert done.returncode == 2 and "recorded on other weights" in done.stderr


def test_the_store_keeps_its_quota_oldest_finished_first(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path, quota_bytes=3000)
    for i, sid in enumerate(("a", "b", "c")):
        path = store.start_video(sid)
        path.write_bytes(b"x" * 1000)
        if sid != "b":
            store.finished(sid)
        os.utime(path, (1000 + i, 1000 + i))
    assert store.has_room("c")  # 3000 bytes: within
    store.start_video("d").write_bytes(b"x" * 500)
    assert store.has_room("d")  # the oldest finished one (a) went; b is still being written
    assert sorted(p.stem for p in tmp_path.glob("*.mp4")) == ["b", "c", "d"]
    (tmp_path / "d.mp4").write_bytes(b"x" * 5000)
    assert not store.has_room("d")  # those being written alone exceed the quota
    assert not (tmp_path / "c.mp4").exists()  # …after every finished one made room
    store.remove("d")
    assert not (tmp_path / "d.mp4").exists()


def test_a_recorder_that_falls_behind_says_so_and_never_blocks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(recording, "QUEUE_PARTS", 2)
    image = np.zeros((16, 16, 3), np.uint8)
    recipe = recording.Recipe("tiny", "random:0", "cpu", {}, 1, 0, "", 16, 4, image)
    rec = SessionRecording("s", recipe, RecordingStore(tmp_path, 2**30))
    rec._queue.put(None)  # the thread stops: nothing is taken off the queue from here on
    rec._thread.join()
    frames = np.zeros((4, 16, 16, 3), np.uint8)
    for index in range(4):
        rec.control_taken(index, ChunkControl(), False)
        rec.frames(index, frames, last=True)  # returns at once, full queue or not
    record = rec.record()
    assert not record["complete"] and "fell behind at chunk 2" in record["incomplete_reason"]


def test_another_thread_count_or_placement_promises_the_tolerance_not_equal_digests(tmp_path: Path) -> None:
    from benchmarks.recorded import Recorded
    from workers.runtime.placement import PLACEMENTS

    cpu = PLACEMENTS["cpu"]
    data = {
        "session_id": "s",
        "intra_op_threads": cpu.cpu_threads_per_worker,
        "placement": {"name": "cpu", "stages": {s: ["cpu"] for s in ("encode", "dit", "decode")}},
        "chunks": [{"frames_sha256": "a"}, {"frames_sha256": "b"}],
    }
    recorded = Recorded(tmp_path / "rec.json", data, np.zeros((2, 2, 3), np.uint8))
    assert recorded.placement() is cpu
    same = recorded.verdict(["a", "b"], cpu)
    assert same["ok"] and same["summary"] == "every chunk's digest equal (2 of 2)"
    differs = recorded.verdict(["a", "x"], cpu)
    assert not differs["ok"] and "1 of 2 chunk digests differ" in differs["summary"]
    other = dataclasses.replace(cpu, cpu_threads_per_worker=cpu.cpu_threads_per_worker + 1)
    elsewhere = recorded.verdict(["a", "x"], other)
    assert elsewhere["ok"] and not elsewhere["equality_promised"]
    assert "equal digests are not promised" in elsewhere["summary"] and "tolerance" in elsewhere["summary"]
