"""Headless replay on the tiny preset: RUN.json figures, the MP4, and frame-hash determinism."""

from __future__ import annotations

import json
import re
from pathlib import Path

import av
import pytest
import torch

from benchmarks.replay import DEFAULT_TRACE, main
from workers.frame_stamp import read_stamp


def _replay(tmp_path: Path, name: str, *extra: str, chunks: int = 2, seed: int = 0) -> dict:
    out = tmp_path / f"{name}.json"
    argv = ["--model", "tiny", "--chunks", str(chunks), "--seed", str(seed), "--quiet", "--out", str(out), *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


@pytest.mark.long
@pytest.mark.processes
def test_run_report_and_video(tmp_path, capsys) -> None:
    video = tmp_path / "run.mp4"
    report = _replay(tmp_path, "run", "--trace", str(DEFAULT_TRACE), "--video", str(video), chunks=3)
    stdout = capsys.readouterr().out
    assert "frames: 45" in stdout and str(tmp_path / "run.json") in stdout

    assert report["num_chunks"] == 3
    assert report["num_frames"] == 13 + 16 + 16
    assert report["media_duration_s"] == pytest.approx(45 / 16)
    assert report["model"]["preset"] == "tiny"
    assert (report["model"]["width_px"], report["model"]["height_px"], report["model"]["fps"]) == (128, 128, 16)
    # Frames per wall second of the steady chunks, where they leave the generator (not stage busy time).
    steady_wall_s = report["chunks"][-1]["frames_ready_s"] - report["chunks"][0]["frames_ready_s"]
    assert report["steady_compute_fps"] == pytest.approx(32 / steady_wall_s)
    assert report["intra_op_threads"] == 1
    stats = report["chunk_compute_s"]
    assert {"p50", "p90", "p99", "max"} <= set(stats)
    assert stats["count"] == 2
    assert 0 < stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"]
    assert report["first_frame_s"] > 0
    assert report["peak_rss_bytes"] > 0
    assert report["kernels"] == {
        "attention": "auto",
        "attention_resolved": "auto",
        "compile": False,
        "deterministic": False,
    }
    peaks = report["peak_memory"]
    assert set(peaks) == {"encode0", "dit0", "decode0"}  # one figure per worker
    assert all(p["host_rss_bytes"] > 0 and p["device_allocated_bytes"] is None for p in peaks.values())
    assert re.fullmatch(r"[0-9a-f]{64}", report["frames_sha256"])
    assert report["environment"]["device"] == "cpu"
    assert report["request"]["chunks"] == 3 and report["request"]["seed"] == 0
    assert report["request"]["trace"] == str(DEFAULT_TRACE)

    # Chunk k starts on the media clock after the frames before it, and takes the trace's state then.
    chunks = report["chunks"]
    assert [c["num_frames"] for c in chunks] == [13, 16, 16]
    assert [c["media_start_s"] for c in chunks] == pytest.approx([0.0, 13 / 16, 29 / 16])
    assert [c["keys"] for c in chunks] == [["w"], ["w"], ["w"]]  # w is held until 2.0 s
    assert [c["applied_seq"] for c in chunks] == [1, 1, 1]
    for c in chunks:
        assert c["compute_s"] == pytest.approx(c["encode_s"] + c["dit_s"] + c["decode_s"])

    assert video.is_file()
    with av.open(str(video)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 45
    assert all(f.shape == (128, 128, 3) for f in frames)


@pytest.mark.heavy
def test_frames_hash_is_deterministic_and_input_sensitive(tmp_path) -> None:
    """On the in-process engine at this process's thread count (engines agree: the next tests)."""
    turn_right = tmp_path / "turn_right.json"
    turn_right.write_text(
        json.dumps({"events": [{"delay_s": 0.0, "message": {"type": "control", "key": "l", "action": "press"}}]})
    )
    # Short chunks (1 latent frame: 1 video frame, then 4) keep it quick.
    engine = ("--in-process", "--threads", str(torch.get_num_threads()), "--chunk-frames", "1")
    a = _replay(tmp_path, "a", *engine)
    b = _replay(tmp_path, "b", *engine)
    other_trace = _replay(tmp_path, "trace", *engine, "--trace", str(turn_right))
    other_seed = _replay(tmp_path, "seed", *engine, seed=1)

    assert [c["num_frames"] for c in a["chunks"]] == [1, 4]
    assert [c["keys"] for c in a["chunks"]] == [["w"], ["w"]]
    assert [c["keys"] for c in other_trace["chunks"]] == [["l"], ["l"]]

    assert a["frames_sha256"] == b["frames_sha256"]
    assert other_trace["frames_sha256"] != a["frames_sha256"]
    assert other_seed["frames_sha256"] != a["frames_sha256"]
    assert len({a["frames_sha256"], other_trace["frames_sha256"], other_seed["frames_sha256"]}) == 3


@pytest.mark.parametrize("chunks", ["0", "-1"])
def test_non_positive_chunks_is_an_argparse_error(tmp_path, capsys, chunks: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--chunks", chunks, "--out", str(tmp_path / "run.json")])
    assert info.value.code == 2
    assert "--chunks must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "run.json").exists()


def test_out_is_required(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--chunks", "1"])
    assert info.value.code == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.long
@pytest.mark.processes
def test_pipeline_and_in_process_engines_agree(tmp_path) -> None:
    pipelined = _replay(tmp_path, "pipelined", "--schedule", "pipelined")
    serial = _replay(tmp_path, "serial", "--schedule", "serial")
    in_process = _replay(tmp_path, "inproc", "--in-process")
    assert pipelined["frames_sha256"] == serial["frames_sha256"] == in_process["frames_sha256"]
    assert pipelined["intra_op_threads"] == serial["intra_op_threads"] == in_process["intra_op_threads"] == 1
    assert pipelined["engine"] == "pipeline (cpu, pipelined)"
    assert in_process["engine"] == "in-process serial"
    for report in (pipelined, serial):
        assert set(report["stage_seconds"]) == {"encode", "dit", "decode"}
        assert all(v["idle_s"] is not None for v in report["stage_seconds"].values())
        assert report["engine_counters"]["leaked_slots"] == 0
        assert all(n == 0 for n in report["slots_in_use_after"].values())
    assert in_process["stage_seconds"]["dit"]["idle_s"] is None


@pytest.mark.processes
def test_engines_agree_at_another_equal_thread_count(tmp_path) -> None:
    """The contract holds at any equal count: workers and the in-process engine both at 2 threads."""
    pipelined = _replay(tmp_path, "pipelined2", "--threads", "2", chunks=1)
    in_process = _replay(tmp_path, "inproc2", "--in-process", "--threads", "2", chunks=1)
    assert pipelined["intra_op_threads"] == in_process["intra_op_threads"] == 2
    assert pipelined["frames_sha256"] == in_process["frames_sha256"]


@pytest.mark.processes
def test_synthetic_model_replays_stamped_frames(tmp_path) -> None:
    video = tmp_path / "synthetic.mp4"
    args = ("--stage-ms", "10,20,10", "--synthetic-geometry", "tiny", "--video", str(video))
    report = _replay(tmp_path, "synthetic", "--model", "synthetic", *args, chunks=3)
    assert report["model"]["preset"] == "synthetic" and report["num_frames"] == 13 + 16 + 16
    assert report["stage_seconds"]["dit"]["busy_s"] >= 3 * 0.020  # each stage holds for its time
    with av.open(str(video)) as container:
        stamps = [read_stamp(f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]
    assert stamps == list(range(45))
