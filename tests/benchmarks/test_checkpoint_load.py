"""The checkpoint-load benchmark at the `tiny` size: the synthetic checkpoint is in the released
layout, and the fresh-process load reports consistent figures within the loader's bound."""

from __future__ import annotations

import json
import tempfile

import pytest
import torch
from safetensors import safe_open

from benchmarks import checkpoint_load
from workers.models import loading
from workers.models.dit import WanDiT
from workers.models.presets import TINY

MIB = 1 << 20
SHARD_BYTES = 2 * MIB  # the tiny DiT's 5.6 MB of fp32 then spans three shards
# Besides its weights, a load keeps the module's Python objects and some allocator pages: 1.5-3 MB
# measured at this size, as much as the tiny DiT's 2.8 MB of bf16 weights themselves (and still
# about 4 MB with the 1.3B DiT's 3.3 GB, where it vanishes in the 10 %). So at this size the overall
# peak gets this allowance, and what the load holds beyond what it keeps is checked exactly.
FIXED_COSTS_BYTES = 8 * MIB


def _expected_shapes() -> dict[str, tuple[int, ...]]:
    return loading.state_shapes(loading.build_on_meta(lambda: WanDiT(TINY.dit)))


def _numel(shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel())


@pytest.mark.heavy
def test_the_synthetic_checkpoint_has_the_released_sharded_layout(tmp_path) -> None:
    messages: list[str] = []
    written = checkpoint_load.write_checkpoint(TINY, tmp_path, SHARD_BYTES, seed=1, progress=messages.append)
    shapes = _expected_shapes()
    sub = tmp_path / loading.DIT_SUBDIR
    index = json.loads((sub / loading.DIT_INDEX).read_text())
    assert written.shards == tuple(f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3))
    assert set(index["weight_map"]) == set(shapes)
    assert set(index["weight_map"].values()) == set(written.shards)
    assert index["metadata"]["total_size"] == written.total_bytes == 4 * sum(map(_numel, shapes.values()))
    assert written.largest_tensor_bytes == 4 * max(map(_numel, shapes.values()))
    assert written.tensors == len(shapes)
    assert len(messages) == len(written.shards)  # one line per shard on the progress channel
    # The format library reads what was written: every key, fp32, the module's shapes, the seeded values.
    generator = torch.Generator().manual_seed(1)
    for name in written.shards:
        in_shard = [k for k, shard in index["weight_map"].items() if shard == name]
        assert 4 * sum(_numel(shapes[k]) for k in in_shard) <= SHARD_BYTES
        with safe_open(str(sub / name), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a dict
                assert index["weight_map"][key] == name
                tensor = f.get_tensor(key)
                assert tensor.dtype == torch.float32 and tuple(tensor.shape) == shapes[key]
    first = next(iter(shapes))
    with safe_open(str(sub / index["weight_map"][first]), framework="pt") as f:
        assert torch.equal(f.get_tensor(first), torch.randn(shapes[first], generator=generator))
    assert loading.read_dit_shapes(tmp_path) == shapes


def test_shards_are_cut_by_size_in_module_order() -> None:
    sizes = {"a": 3, "b": 3, "c": 5, "d": 1, "e": 9}
    assert checkpoint_load.plan_shards(sizes, 6) == [["a", "b"], ["c", "d"], ["e"]]
    assert checkpoint_load.plan_shards(sizes, 100) == [["a", "b", "c", "d", "e"]]


@pytest.mark.processes
def test_a_fresh_process_load_reports_consistent_figures_within_the_bound(tmp_path) -> None:
    dtype_name = "bf16"
    written = checkpoint_load.write_checkpoint(TINY, tmp_path, SHARD_BYTES, progress=lambda _: None)
    report = checkpoint_load.measure_load(tmp_path, TINY, dtype_name)

    shapes = _expected_shapes()
    element = torch.empty((), dtype=checkpoint_load.DTYPES[dtype_name]).element_size()
    final = element * sum(map(_numel, shapes.values()))
    assert (report.preset, report.dtype, report.tensors) == ("tiny", dtype_name, len(shapes))
    assert report.final_weights_bytes == final
    assert report.largest_tensor_bytes == written.largest_tensor_bytes
    assert report.bound_bytes == int((final + written.largest_tensor_bytes) * 1.1)
    assert report.peak_rss_exact, "VmHWM could not be reset, so the peak may predate the load"
    assert report.samples >= 2
    assert report.peak_rss_bytes >= report.rss_after_bytes >= report.rss_before_bytes > 0
    assert report.peak_anon_bytes >= report.anon_before_bytes > 0
    assert report.load_peak_rss_bytes == report.peak_rss_bytes - report.rss_before_bytes
    assert report.load_peak_anon_bytes == report.peak_anon_bytes - report.anon_before_bytes
    assert report.retained_bytes + report.transient_bytes == report.load_peak_rss_bytes
    assert report.load_peak_over_final == pytest.approx(report.load_peak_rss_bytes / final)
    assert report.within_bound == (max(report.load_peak_rss_bytes, report.load_peak_anon_bytes) <= report.bound_bytes)

    # The bound: beyond what it keeps, the load held at most the largest source tensor (+10 %) ...
    assert report.transient_bytes <= 1.1 * report.largest_tensor_bytes
    # ... and overall at most the final weights + the largest tensor + 10 %, plus this size's fixed costs.
    assert report.load_peak_rss_bytes <= report.bound_bytes + FIXED_COSTS_BYTES
    assert report.load_peak_anon_bytes <= report.bound_bytes + FIXED_COSTS_BYTES


@pytest.mark.processes
def test_the_command_prints_json_and_removes_its_checkpoint(tmp_path, monkeypatch, capsys) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    args = ["--preset", "tiny", "--dtype", "fp32", "--shard-gib", str(SHARD_BYTES / (1 << 30)), "--json"]
    rc = checkpoint_load.main(args)
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert rc == (0 if report["within_bound"] else 1)
    assert (report["preset"], report["dtype"]) == ("tiny", "fp32")
    assert report["final_weights_bytes"] == 4 * sum(map(_numel, _expected_shapes().values()))
    assert "writing model-00001-of-00003.safetensors" in err and "loading in a fresh process" in err
    assert list(scratch.iterdir()) == [], "the temporary checkpoint was left behind"


def test_a_kept_checkpoint_is_reused_only_when_it_matches(tmp_path, capsys) -> None:
    checkpoint_load.ensure_checkpoint(TINY, tmp_path, SHARD_BYTES, seed=0)
    assert "writing" in capsys.readouterr().err
    assert json.loads((tmp_path / checkpoint_load.MANIFEST).read_text())["preset"] == "tiny"
    checkpoint_load.ensure_checkpoint(TINY, tmp_path, SHARD_BYTES, seed=0)
    err = capsys.readouterr().err
    assert "reusing the checkpoint" in err and "writing" not in err
    checkpoint_load.ensure_checkpoint(TINY, tmp_path, SHARD_BYTES, seed=1)  # other values: rewritten
    assert "writing" in capsys.readouterr().err
