"""The stage timeline: lanes, one bar per chunk and stage, and overlap that shows only when pipelined."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.timeline import FRAMES_LANE, STAGES, lanes, main, overlap_s, timeline_bars

pytestmark = pytest.mark.processes
CHUNKS = 5


def replay(tmp: Path, schedule: str) -> Path:
    out = tmp / f"{schedule}.json"
    cmd = [sys.executable, "-m", "benchmarks.replay", "--model", "synthetic", "--stage-ms", "20,80,50"]
    cmd += ["--synthetic-geometry", "tiny", "--chunks", str(CHUNKS), "--schedule", schedule]
    cmd += ["--quiet", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("timeline")
    return {schedule: replay(tmp, schedule) for schedule in ("pipelined", "serial")}


def test_one_bar_per_chunk_and_stage_and_overlap_only_when_pipelined(runs: dict[str, Path]) -> None:
    for schedule, path in runs.items():
        bars = timeline_bars(json.loads(path.read_text()))
        assert sorted((b.lane, b.chunk) for b in bars) == sorted((s, k) for s in STAGES for k in range(CHUNKS))
        assert all(b.end_s > b.start_s >= 0 for b in bars), schedule
        # Within a chunk the stages run in order.
        by_chunk = {(b.lane, b.chunk): b for b in bars}
        for k in range(CHUNKS):
            assert by_chunk["encode", k].end_s <= by_chunk["dit", k].start_s <= by_chunk["dit", k].end_s
            assert by_chunk["dit", k].end_s <= by_chunk["decode", k].start_s
    pipelined = timeline_bars(json.loads(runs["pipelined"].read_text()))
    serial = timeline_bars(json.loads(runs["serial"].read_text()))
    # Pipelined: the DiT works on the next chunk while decode works on this one; serial: never.
    assert overlap_s(pipelined, "dit", "decode") > 0.1
    assert overlap_s(serial, "dit", "decode") == pytest.approx(0.0, abs=0.005)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_the_picture_is_written_side_by_side(runs: dict[str, Path], tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"timeline{suffix}"
    assert main([str(runs["pipelined"]), str(runs["serial"]), "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in data[:2000]
    if suffix == ".svg":
        text = data.decode()
        for title in ("pipelined", "serial", "frames out", "dit", "decode"):
            assert title in text


def test_a_run_without_stage_spans_is_refused(tmp_path: Path, runs: dict[str, Path]) -> None:
    report = json.loads(runs["serial"].read_text())
    for chunk in report["chunks"]:
        del chunk["stage_spans_s"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(report))
    with pytest.raises(SystemExit):
        main([str(old), "--out", str(tmp_path / "t.png")])


def test_a_stage_on_two_ranks_gets_a_lane_per_rank(tmp_path: Path) -> None:
    placement = tmp_path / "two-dit-ranks.json"
    placement.write_text(
        json.dumps({"name": "two-dit-ranks", "encode": ["cpu"], "dit": ["cpu", "cpu"], "decode": ["cpu"]})
    )
    out, picture = tmp_path / "run.json", tmp_path / "run.svg"
    cmd = [sys.executable, "-m", "benchmarks.replay", "--model", "synthetic", "--stage-ms", "20,80,50"]
    cmd += ["--synthetic-geometry", "tiny", "--chunks", "3", "--placement", str(placement)]
    cmd += ["--quiet", "--out", str(out), "--timeline", str(picture)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    assert lanes(report) == ["encode", "dit r0", "dit r1", "decode", FRAMES_LANE]
    bars = timeline_bars(report)
    assert sorted((b.lane, b.chunk) for b in bars if b.stage == "dit") == sorted(
        (f"dit r{r}", k) for r in (0, 1) for k in range(3)
    )
    assert "dit r1" in picture.read_text()
