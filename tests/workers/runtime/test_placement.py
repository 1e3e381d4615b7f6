"""Placements: presets, JSON, and validation messages that say what to change."""

from __future__ import annotations

import json

import pytest

from workers.models.presets import LINGBOT_1_3B, LINGBOT_14B, TINY
from workers.runtime.placement import PLACEMENTS, Placement, PlacementError, get_placement


def test_presets_exist_and_fit_their_models() -> None:
    assert set(PLACEMENTS) >= {"cpu", "cpu-sp2", "1gpu", "2gpu", "4gpu", "7gpu-split"}
    PLACEMENTS["cpu"].validate_for(TINY, cuda_device_count=0)
    PLACEMENTS["cpu-sp2"].validate_for(TINY, cuda_device_count=0)
    for name, gpus in (("1gpu", 1), ("2gpu", 2), ("4gpu", 4), ("7gpu-split", 7)):
        PLACEMENTS[name].validate_for(LINGBOT_14B, cuda_device_count=gpus)
    assert PLACEMENTS["7gpu-split"].dit == ("cuda:2", "cuda:3", "cuda:4", "cuda:5", "cuda:6")
    assert PLACEMENTS["4gpu"].decode == ("cuda:0", "cuda:1", "cuda:2", "cuda:3")


def test_heads_not_divisible_says_what_to_change() -> None:
    p = Placement("three", ("cuda:0",), ("cuda:0", "cuda:1", "cuda:2"), ("cuda:0",))
    with pytest.raises(PlacementError, match="40 attention heads are not divisible by the DiT's 3 Ulysses ranks"):
        p.validate_for(LINGBOT_14B, cuda_device_count=3)
    p.validate_for(LINGBOT_1_3B, cuda_device_count=3)  # 12 heads, 1560 tokens: 3 ranks are fine


def test_decode_rows_and_missing_gpus() -> None:
    p = Placement("d7", ("cpu",), ("cpu",), tuple(["cpu"] * 7))
    with pytest.raises(PlacementError, match="60 latent rows cannot be split into 7 decode bands"):
        p.validate_for(LINGBOT_14B, cuda_device_count=0)
    with pytest.raises(PlacementError, match="has 0 CUDA device"):
        PLACEMENTS["1gpu"].validate_for(TINY, cuda_device_count=0)


def test_malformed_placements() -> None:
    with pytest.raises(PlacementError, match="at least one device"):
        Placement("x", ("cpu",), (), ("cpu",))
    with pytest.raises(PlacementError, match="exactly one device"):
        Placement("x", ("cpu", "cpu"), ("cpu",), ("cpu",))
    with pytest.raises(PlacementError, match="mixes cpu and cuda"):
        Placement("x", ("cpu",), ("cpu", "cuda:0"), ("cpu",))
    with pytest.raises(PlacementError, match="lists a CUDA device twice"):
        Placement("x", ("cuda:0",), ("cuda:0", "cuda:0"), ("cuda:0",)).validate_for(TINY, cuda_device_count=1)
    with pytest.raises(PlacementError, match="not a device name"):
        Placement("x", ("gpu0",), ("cpu",), ("cpu",))
    with pytest.raises(PlacementError, match="unknown placement"):
        get_placement("no-such-placement")


def test_json_placement(tmp_path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"name": "mine", "encode": ["cpu"], "dit": ["cpu", "cpu"], "decode": ["cpu"]}))
    p = get_placement(str(path))
    assert p.name == "mine" and p.dit == ("cpu", "cpu")
    p.validate_for(TINY, cuda_device_count=0)
    path.write_text(json.dumps({"encode": ["cpu"]}))
    with pytest.raises(PlacementError, match="missing 'dit'"):
        get_placement(str(path))
    path.write_text("{not json")
    with pytest.raises(PlacementError, match="not valid JSON"):
        get_placement(str(path))
