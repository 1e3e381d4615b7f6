"""benchmarks.world_eval end to end on a short budget: the report's shape and the strip image."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from PIL import Image

from benchmarks.world_eval import CONTROLS, main

pytestmark = pytest.mark.processes


def test_world_eval_writes_report_and_strip(tmp_path: Path) -> None:
    out = tmp_path / "EVAL.json"
    assert main(["--out", str(out), "--walks", "1", "--walk-chunks", "2", "--control-starts", "1"]) == 0
    report = json.loads(out.read_text())
    head = report["headline"]
    assert report["preset"] == "gridworld" and report["checkpoint"] == "bundled"
    for key in ("vae_psnr_db", "model_psnr_db_0_1s", "model_ssim_0_1s", "controllability"):
        assert math.isfinite(head[key]), key
    assert head["drift_psnr_db_9_10s"] is None  # a 1.8 s walk has no 10 s horizon
    assert report["walking"]["model"]["psnr_db"]["4-10s"] is None
    assert 10.0 < head["vae_psnr_db"] < 100.0 and 0.0 < head["model_ssim_0_1s"] <= 1.0
    control = report["controllability"]
    assert control["trials"] == len(CONTROLS) and 0.0 <= control["accuracy"] <= 1.0
    assert set(report["targets_met"]) == set(report["targets"])
    strip = Image.open(report["strip_png"])
    assert strip.size[1] == 2 * 128 and strip.size[0] % 128 == 0  # generated row above ground truth


def test_world_eval_vae_only_measures_the_vae_alone(tmp_path: Path) -> None:
    out = tmp_path / "EVAL.json"
    assert main(["--out", str(out), "--walks", "1", "--walk-chunks", "2", "--vae-only"]) == 0
    report = json.loads(out.read_text())
    assert report["vae_only"] and set(report["headline"]) == {"vae_psnr_db"} == set(report["targets_met"])
    assert 10.0 < report["headline"]["vae_psnr_db"] < 100.0
    assert "model" not in report["walking"] and report["controllability"] is None
    assert Image.open(report["strip_png"]).size[1] == 2 * 128  # reconstruction above ground truth


def test_world_eval_refuses_to_record_a_vae_only_run_in_a_card(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "EVAL.json"), "--vae-only", "--card", str(tmp_path / "card.json")])
    assert exc.value.code == 2
