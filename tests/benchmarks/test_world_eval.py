"""benchmarks.world_eval end to end on a short budget: the report's shape and the strip image."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from benchmarks.image_metrics import laplacian_variance
from benchmarks.world_eval import CONTROLS, main

pytestmark = pytest.mark.processes


def test_world_eval_writes_report_and_strip(tmp_path: Path) -> None:
    out = tmp_path / "EVAL.json"
    args = ["--walks", "1", "--walk-chunks", "2", "--control-starts", "1", "--geometry-clips", "1"]
    assert main(["--out", str(out), *args]) == 0
    report = json.loads(out.read_text())
    head = report["headline"]
    assert report["preset"] == "gridworld" and report["checkpoint"] == "bundled"
    finite = ("vae_psnr_db", "model_psnr_db_0_1s", "model_ssim_0_1s", "model_psnr_db_1_2s", "controllability")
    for key in (*finite, "sharpness_0_4s", "geometry_ssim_1_2s_wall", "geometry_ssim_1_2s_corner"):
        assert math.isfinite(head[key]), key
    assert 0.0 < head["sharpness_0_4s"] < 2.0  # generated over rendered high-frequency energy
    for kind, keys in (("wall", "w"), ("corner", ("jw", "lw"))):
        clip = report["geometry"][kind]["clips"][0]
        assert clip["keys"] in keys and 0.0 < clip["ssim_1_2s"] <= 1.0, clip
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


def test_laplacian_variance_sees_blur() -> None:
    rng = np.random.default_rng(0)
    sharp = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    blurred = np.asarray(
        [np.asarray(Image.fromarray(f).filter(ImageFilter.GaussianBlur(2))) for f in sharp], dtype=np.uint8
    )
    flat = np.full_like(sharp, 128)
    assert (laplacian_variance(blurred) < 0.2 * laplacian_variance(sharp)).all()
    assert (laplacian_variance(flat) == 0).all()
