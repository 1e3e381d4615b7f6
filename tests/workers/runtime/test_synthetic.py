"""The synthetic timing model's configuration: stage times, geometry, and how a model name resolves."""

from __future__ import annotations

import pytest

from workers.models.presets import LINGBOT_14B, TINY
from workers.runtime.synthetic import SYNTHETIC, SyntheticModel, resolve_model


def test_defaults_are_the_14b_geometry_and_a_real_time_load() -> None:
    preset, synthetic = resolve_model(SYNTHETIC)
    assert synthetic == SyntheticModel(0.1, 0.8, 0.5, "lingbot-world-v2-14b")
    assert preset.name == SYNTHETIC and (preset.width_px, preset.height_px) == (832, 480)
    assert preset.chunk_latent_frames == LINGBOT_14B.chunk_latent_frames
    assert "100,800,500 ms" in preset.weights_note and preset.bundled_weights is None


def test_stage_times_and_geometry_parse() -> None:
    preset, synthetic = resolve_model(SYNTHETIC, "50,400,300", "tiny")
    assert synthetic is not None and (synthetic.encode_s, synthetic.dit_s, synthetic.decode_s) == (0.05, 0.4, 0.3)
    assert synthetic.stage_ms == "50,400,300" and (preset.width_px, preset.height_px) == (TINY.width_px, 128)


@pytest.mark.parametrize(
    ("stage_ms", "geometry", "match"),
    [
        ("1,2", None, "three numbers"),
        ("a,b,c", None, "three numbers"),
        ("0,1,1", None, "positive"),
        (None, "nope", "unknown preset"),
    ],
)
def test_bad_synthetic_settings_fail_clearly(stage_ms: str | None, geometry: str | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_model(SYNTHETIC, stage_ms, geometry)


def test_real_presets_refuse_synthetic_settings() -> None:
    assert resolve_model("tiny") == (TINY, None)
    with pytest.raises(ValueError, match="only apply to --model synthetic"):
        resolve_model("tiny", "1,2,3")
