"""benchmarks.world_eval end to end on a short budget: the report's shape and the strip image."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from benchmarks.image_metrics import gaussian_blur, laplacian_variance
from benchmarks.world_eval import CONTROLS, EVENT_WALK, generate, main, parse_args, spread, versus_baseline
from workers.controls import ChunkControl
from workers.models.presets import get_preset
from workers.serial_engine import SerialEngine
from workers.world import EVENT_PROMPTS, WorldEvent

pytestmark = pytest.mark.processes


@pytest.mark.long
def test_world_eval_writes_report_and_strip(tmp_path: Path) -> None:
    out = tmp_path / "EVAL.json"
    args = ["--walks", "1", "--walk-chunks", "2", "--control-starts", "1", "--geometry-clips", "1"]
    assert main(["--out", str(out), *args, "--event-starts", "1"]) == 0
    report = json.loads(out.read_text())
    head = report["headline"]
    assert report["preset"] == "gridworld" and report["checkpoint"] == "bundled"
    assert report["timestep_indices"] == [0, 250, 500, 750]
    finite = ("vae_psnr_db", "model_psnr_db_0_1s", "model_ssim_0_1s", "model_psnr_db_1_2s", "controllability")
    for key in (*finite, "sharpness_0_4s", "geometry_ssim_1_2s_wall", "geometry_ssim_1_2s_corner"):
        assert math.isfinite(head[key]), key
    assert 0.0 < head["sharpness_0_4s"] < 2.0  # generated over rendered high-frequency energy
    scale = report["walking"]["sharpness_of_blurred_truth_0_4s"]
    assert 0.0 < scale["1.0px"] < scale["0.5px"] < 1.0  # more blur, less detail
    for kind, keys in (("wall", "w"), ("corner", ("jw", "lw"))):
        clip = report["geometry"][kind]["clips"][0]
        assert clip["keys"] in keys and 0.0 < clip["ssim_1_2s"] <= 1.0, clip
    assert head["drift_psnr_db_9_10s"] is None  # a 1.8 s walk has no 10 s horizon
    assert report["walking"]["model"]["psnr_db"]["4-10s"] is None
    assert 10.0 < head["vae_psnr_db"] < 100.0 and 0.0 < head["model_ssim_0_1s"] <= 1.0
    control = report["controllability"]
    assert control["trials"] == len(CONTROLS) and 0.0 <= control["accuracy"] <= 1.0
    assert set(report["targets_met"]) == set(report["targets"])
    assert set(report["events"]) == {"night", "snow", "fog", "dusk"}
    for name, event in report["events"].items():
        assert event["prompt"] == EVENT_PROMPTS[WorldEvent(name)][0]
        assert math.isfinite(event["psnr_db_to_event"]) and math.isfinite(event["psnr_db_to_day"])
        assert len(event["psnr_db_per_chunk"]["to_event"]) == EVENT_WALK
        assert event["crossover_chunk"] in (None, 0, 1, 2) and math.isfinite(event["day_back_db"])
    assert 0.0 <= head["event_frames_closer"] <= 1.0
    strip = Image.open(report["strip_png"])
    assert strip.size[1] == 2 * 128 and strip.size[0] % 128 == 0  # generated row above ground truth


@pytest.mark.long
def test_parts_given_none_to_measure_are_left_out_of_the_report(tmp_path: Path) -> None:
    out = tmp_path / "EVAL.json"
    zero = ["--control-starts", "0", "--geometry-clips", "0", "--event-starts", "0"]
    assert main(["--out", str(out), "--walks", "1", "--walk-chunks", "2", *zero]) == 0
    report = json.loads(out.read_text())
    head = report["headline"]
    assert math.isfinite(head["model_psnr_db_0_1s"]) and report["controllability"] is None
    assert head["controllability"] is head["geometry_ssim_1_2s_wall"] is None and report["geometry"] is None
    assert report["targets_met"]["controllability"] is False  # not measured is not met


def test_world_eval_vae_only_measures_the_vae_alone(tmp_path: Path) -> None:
    out = tmp_path / "EVAL.json"
    assert main(["--out", str(out), "--walks", "1", "--walk-chunks", "2", "--vae-only"]) == 0
    report = json.loads(out.read_text())
    assert report["vae_only"] and set(report["headline"]) == {"vae_psnr_db", "vae_sharpness_0_4s", "vae_edge_f1_0_4s"}
    assert set(report["targets_met"]) == {"vae_psnr_db"}
    assert 10.0 < report["headline"]["vae_psnr_db"] < 100.0
    assert 0.0 < report["headline"]["vae_edge_f1_0_4s"] <= 1.0
    # The scale: a slight blur of the renderer's own frames keeps its outlines.
    assert report["walking"]["edge_f1_of_blurred_truth_0_4s"]["0.5px"] > 0.9
    assert "model" not in report["walking"] and report["controllability"] is None
    assert Image.open(report["strip_png"]).size[1] == 2 * 128  # reconstruction above ground truth


def test_world_eval_refuses_an_unreadable_or_vae_only_baseline_before_evaluating(tmp_path: Path) -> None:
    vae_only = tmp_path / "vae.json"
    vae_only.write_text(json.dumps({"walking": {"walks": []}}))
    fewer_walks = tmp_path / "fewer.json"  # the default is 8 walks of 11 chunks
    fewer_walks.write_text(json.dumps({"walking": {"model": {}, "walks": [{"keys": ["w"] * 11}]}}))
    for bad in (tmp_path / "missing.json", vae_only, fewer_walks):
        with pytest.raises(SystemExit) as exc:
            main(["--out", str(tmp_path / "EVAL.json"), "--baseline", str(bad)])
        assert exc.value.code == 2  # argparse's usage error, before any model is loaded
    assert not (tmp_path / "EVAL.json").exists()


@pytest.mark.long
def test_a_baseline_of_other_walks_loses_its_comparison_not_the_evaluation(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"  # right count and length, other starts: found only after walking
    walk = {"start": {"x": -1.0, "z": -1.0, "yaw_deg": 0.0}, "keys": ["w"]}
    elsewhere.write_text(json.dumps({"walking": {"model": {}, "walks": [walk]}}))
    out = tmp_path / "EVAL.json"
    args = ["--walks", "1", "--walk-chunks", "1", "--control-starts", "1", "--geometry-clips", "1"]
    assert main(["--out", str(out), *args, "--baseline", str(elsewhere)]) == 1
    report = json.loads(out.read_text())
    assert "not a report of these walks" in report["versus_baseline"]["error"]
    assert "difference" not in report["versus_baseline"] and report["headline"]["model_psnr_db_0_1s"] is not None


def test_timestep_indices_pick_a_subset_of_the_trained_ones_and_refuse_others(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "EVAL.json")]
    trained = parse_args(out).preset.timestep_indices
    assert trained == (0, 250, 500, 750)
    assert parse_args([*out, "--timestep-indices", "0"]).preset.timestep_indices == (0,)
    assert parse_args([*out, "--timestep-indices", "0,750"]).preset.timestep_indices == (0, 750)
    # untrained, descending, repeated, not a number
    refused = [["--timestep-indices", bad] for bad in ("0,100", "750,0", "0,0", "x")]
    refused.append(["--timestep-indices", "0", "--card", str(tmp_path / "card.json")])  # not the shipped sampler
    for extra in refused:
        with pytest.raises(SystemExit) as exc:
            parse_args([*out, *extra])
        assert exc.value.code == 2


def test_a_path_walks_the_same_frames_in_a_preset_of_shorter_chunks() -> None:
    """The 1-latent preset steps four chunks per path chunk and makes as many frames as the 4-latent
    one; a preset whose chunk does not divide the paths' is refused before anything loads."""
    path = [ChunkControl.from_keys(["w"]), ChunkControl(keys=frozenset("l"), look_dx_px=40.0)]
    start = np.zeros((128, 128, 3), np.uint8)
    made = {}
    for name in ("gridworld", "gridworld-responsive"):
        engine = SerialEngine.load(get_preset(name), None, cpu_threads=1)
        made[name] = generate(engine, start, path, seed=0, prompts={1: "night"})
    assert made["gridworld"].shape == made["gridworld-responsive"].shape == (13 + 16, 128, 128, 3)
    with pytest.raises(SystemExit) as exc:
        parse_args(["--out", "EVAL.json", "--model", "matrix-game-2-tiny"])
    assert exc.value.code == 2


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


def test_gaussian_blur_keeps_shape_and_flat_frames_and_removes_detail() -> None:
    rng = np.random.default_rng(0)
    sharp = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    blurred = gaussian_blur(sharp, 1.0)
    assert blurred.shape == sharp.shape and blurred.dtype == np.uint8
    assert (laplacian_variance(blurred) < 0.2 * laplacian_variance(sharp)).all()
    flat = np.full_like(sharp, 77)
    assert (gaussian_blur(flat, 1.0) == flat).all()  # replicated edges: no darkening at the border


def _walk(x: float, psnr: list[float | None]) -> dict:
    """A walk record as `walking` writes it, with PSNR per horizon and the 9–10 s drift figure."""
    horizons = dict(zip(("0-1s", "1-2s", "2-4s", "4-10s"), psnr[:4], strict=True))
    return {
        "start": {"x": x, "z": 0.0, "yaw_deg": 0.0},
        "keys": ["w"],
        "model_psnr_db": horizons,
        "drift_psnr_db_9_10s": psnr[4],
    }


def test_walking_figures_carry_their_standard_error_and_a_paired_difference_from_a_baseline() -> None:
    base = [_walk(0.0, [20.0, 18.0, 16.0, 14.0, 13.0]), _walk(1.0, [30.0, 26.0, 22.0, 20.0, 19.0])]
    better = [_walk(0.0, [21.0, 18.5, 16.0, 14.0, 13.0]), _walk(1.0, [31.0, 25.5, 22.0, 20.0, 19.0])]
    err = spread(base)["model_psnr_db_0_1s"]
    assert err == pytest.approx({"mean": 25.0, "standard_error": 5.0})  # sd 7.07 over two walks
    diff = versus_baseline(better, {"walking": {"walks": base, "model": {}}})
    # +1 dB on both walks: exactly known although the walks' own spread is 5 dB.
    assert diff["model_psnr_db_0_1s"] == pytest.approx({"mean": 1.0, "standard_error": 0.0})
    assert diff["model_psnr_db_1_2s"] == pytest.approx({"mean": 0.0, "standard_error": 0.5})
    short = [_walk(0.0, [20.0, 18.0, None, None, None]), _walk(1.0, [30.0, 26.0, None, None, None])]
    assert spread(short)["drift_psnr_db_9_10s"] is None  # a walk too short for the horizon
    with pytest.raises(ValueError, match="not a report of these walks"):
        versus_baseline(better, {"walking": {"walks": base[::-1], "model": {}}})


def _town_like(seed: int, tile_px: int = 8) -> np.ndarray:
    """Hard-edged tiles of random shades, as the renderer draws them: [2, 64, 64, 3] uint8."""
    n = 64 // tile_px + 1
    tiles = np.random.default_rng(seed).integers(40, 220, (2, n, n, 1), dtype=np.uint8)
    return np.repeat(np.repeat(np.repeat(tiles, tile_px, axis=1), tile_px, axis=2), 3, axis=3)[:, :64, :64]


def test_edge_f1_rewards_outlines_in_place() -> None:
    from benchmarks.image_metrics import edge_f1

    truth = _town_like(0)
    assert (edge_f1(truth, truth) == 1).all()
    # One pixel off is within the tolerance; three (diagonally) are not.
    assert (edge_f1(np.roll(truth, (1, 1), axis=(1, 2)), truth) > 0.9).all()
    assert (edge_f1(np.roll(truth, (3, 3), axis=(1, 2)), truth) < 0.5).all()
    # A slight blur keeps the outlines where they are; a strong one loses them.
    assert (edge_f1(gaussian_blur(truth, 1.0), truth) > 0.9).all()
    assert (edge_f1(gaussian_blur(truth, 2.0), truth) < edge_f1(gaussian_blur(truth, 1.0), truth)).all()
    # Detail of the same kind elsewhere (other tiles, other outlines) matches about half at best.
    assert (edge_f1(_town_like(1, tile_px=11), truth) < 0.6).all()
    flat = np.full_like(truth, 128)
    assert (edge_f1(flat, truth) == 0).all() and (edge_f1(flat, flat) == 1).all()
