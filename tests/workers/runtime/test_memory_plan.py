"""The memory plan: its traced figures match real objects, it prints and refuses what cannot fit,
and on the CPU it agrees with the workers' measured peak resident sets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from server.common.settings import Settings
from server.http.app import create_app
from workers.__main__ import main as models_cli
from workers.models.checkpoint_files import CheckpointMissing, require_checkpoint
from workers.models.components import load_dit, load_vae
from workers.models.live_bytes import LiveBytes
from workers.models.presets import get_preset
from workers.runtime import footprint
from workers.runtime.memory_plan import GIB, check_fits, machine_capacity, plan_memory
from workers.runtime.placement import PlacementError, get_placement
from workers.stages.denoise import DenoiseSession

CPU = torch.device("cpu")
GPU_80 = machine_capacity(device_gib=80)


def test_live_bytes_counts_new_storages_until_their_last_view_is_gone() -> None:
    before = torch.zeros(1000, device="meta")  # from before the trace: never counted
    with LiveBytes() as live:
        a = torch.empty(100, device="meta")  # 400 B
        view = a[:10]
        del a
        assert live.live_bytes == 400  # the view keeps the storage alive
        b = before.view(10, 100)  # a view of an old tensor allocates nothing
        c = torch.empty(50, dtype=torch.float64, device="meta")  # 400 B
        assert live.live_bytes == 800
        del view, c
        d = b + 1  # 4000 B
    assert live.live_bytes == 4000 and live.peak_bytes == 4000
    del d
    assert live.live_bytes == 0


@pytest.fixture
def traced_afresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every footprint traced in the test, none read from the store or the process's cache."""
    monkeypatch.setattr(footprint, "STORE", False)
    caches = (footprint.dit_footprint, footprint.vae_footprints, footprint.context_encoder_footprint)
    for fn in caches:
        fn.cache_clear()
    yield
    for fn in caches:
        fn.cache_clear()


@pytest.mark.heavy
@pytest.mark.usefixtures("traced_afresh")
def test_traced_footprints_equal_the_real_objects() -> None:
    preset = get_preset("tiny")
    dit_fp = footprint.dit_footprint(preset, torch.float32)
    dit = load_dit(preset, CPU, None)
    assert dit_fp.weights_bytes == sum(p.numel() * p.element_size() for p in dit.parameters())
    session = DenoiseSession(dit, preset, torch.zeros(5, preset.dit.text_dim), 0, preset.chunk_latent_frames)
    assert dit_fp.kv_cache_bytes == session.kv_cache.nbytes()
    assert dit_fp.text_kv_bytes == sum(k.nbytes + v.nbytes for k, v in session.text_kv)

    vae = load_vae(preset, CPU, None)
    _, dec_fp = footprint.vae_footprints(preset, torch.float32)
    state = vae.new_stream_state()
    with torch.no_grad():
        for _ in range(3):
            vae.decode_stream(torch.zeros(1, 16, 1, preset.latent_height, preset.latent_width), state)
    cached = sum(c.nbytes for c in state.decoder_cache if isinstance(c, torch.Tensor))
    assert dec_fp.session_bytes == cached


@pytest.mark.heavy
@pytest.mark.usefixtures("traced_afresh")
def test_the_meta_trace_counts_what_the_real_trace_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large models are traced on meta, small ones on the CPU: both must give one answer."""
    preset = get_preset("tiny")
    real = (footprint.dit_footprint(preset, torch.float32), *footprint.vae_footprints(preset, torch.float32))
    monkeypatch.setattr(footprint, "REAL_TRACE_MAX_BYTES", 0)
    for fn in (footprint.dit_footprint, footprint.vae_footprints):
        fn.cache_clear()
    meta = (footprint.dit_footprint(preset, torch.float32), *footprint.vae_footprints(preset, torch.float32))
    assert meta == real


@pytest.mark.heavy
def test_a_trace_is_stored_for_the_next_process_and_read_back_equal(
    own_worldrtc_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's start reads its plan's traces from the store: the same footprints, for the same
    arguments and code; a trace under other arguments is a trace of its own."""
    preset = get_preset("tiny")
    monkeypatch.setattr(footprint, "STORE", False)
    footprint.vae_footprints.cache_clear()
    traced = footprint.vae_footprints(preset, torch.float32, 2)
    monkeypatch.setattr(footprint, "STORE", True)
    footprint.vae_footprints.cache_clear()
    stored_before = set((own_worldrtc_cache / "footprints").glob("*.json"))
    assert footprint.vae_footprints(preset, torch.float32, 2) == traced  # traced, then stored
    stored = set((own_worldrtc_cache / "footprints").glob("*.json")) - stored_before
    assert len(stored) == 1
    footprint.vae_footprints.cache_clear()  # as a new process: only the store is left

    def no_trace(*args: object) -> None:  # a test double: any trace from here on fails the test
        raise AssertionError("traced again")

    monkeypatch.setattr(footprint, "_for_tracing", no_trace)
    assert footprint.vae_footprints(preset, torch.float32, 2) == traced
    with pytest.raises(AssertionError, match="traced again"):
        footprint.vae_footprints(preset, torch.float32, 3)
    footprint.vae_footprints.cache_clear()


@pytest.mark.heavy
def test_plan_cli_prints_every_part_per_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert models_cli(["plan", "lingbot-world-v2-14b", "--placement", "4gpu", "--max-sessions", "1"]) == 0
    out = capsys.readouterr().out
    for part in (
        "cuda:0:",
        "cuda:3:",
        "DiT weights (bfloat16)",
        "umT5 weights (bfloat16)",
        "VAE weights (float32)",
        "KV cache (1/4) × 1",
        "activations (one chunk) (1/4)",
        "output slots: 4 latents",
        "CUDA contexts: 3 worker(s) computing here",
        "worker(s) mapping its slots",
        "NCCL buffers",
        "of capacity 80.00 GiB: fits",
        "the placement fits",
    ):
        assert part in out, part


@pytest.mark.long
@pytest.mark.heavy
def test_plan_cli_says_what_does_not_fit_and_what_would(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "lingbot-world-v2-14b", "--placement", "1gpu", "--max-sessions", "1", "--device-gib", "80"]
    assert models_cli(argv) == 1
    out = capsys.readouterr().out
    assert "cuda:0:" in out and "SHORT by" in out and "the placement does NOT fit" in out
    assert "placements that fit: 2gpu (1 session(s)), 4gpu (1 session(s)), 7gpu-split" in out
    assert models_cli([*argv, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is False and data["device_totals"]["cuda:0"]["capacity_bytes"] == 80 * GIB


@pytest.mark.long
@pytest.mark.heavy
def test_plan_cli_counts_the_sessions_that_fit_per_card_size(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "matrix-game-2-universal", "--placement", "1gpu", "--fit-gib", "8,16,24,80"]
    assert models_cli(argv) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "GiB cards" in line]
    counts = [int(line.split(": ")[1].split()[0]) for line in lines]
    assert counts[0] == 0 and "with every saving" in lines[0], out
    # A 16 GiB card holds one session with savings (workers/runtime/savings_plan.py), cheapest first.
    assert counts[1] == 1 and "with savings: --vae-bands" in lines[1] and "--quantization" not in lines[1], out
    assert counts[2] > counts[1] and counts[3] > counts[2] and lines[3].endswith("none (exact)"), out
    # The count is the plan's own verdict at the edge: one more session would not fit.
    n = counts[3]
    plan = plan_memory(get_preset("matrix-game-2-universal"), get_placement("1gpu"), n + 1, lambda d: 80 * GIB)
    assert not plan.fits
    assert models_cli([*argv[:-1], "24,x"]) == 2


@pytest.mark.heavy
def test_a_placement_that_cannot_fit_is_refused_naming_device_shortfall_and_alternatives() -> None:
    preset = get_preset("lingbot-world-v2-14b")
    with pytest.raises(PlacementError) as err:
        check_fits(preset, get_placement("4gpu"), 2, GPU_80, cuda_device_count=8)
    message = str(err.value)
    assert "cuda:0 needs" in message and "GiB short" in message
    assert "would fit: --max-sessions 1" in message and "--placement 7gpu-split" in message
    # More sessions need more memory, and the KV cache is the part that grows.
    one, two = (plan_memory(preset, get_placement("7gpu-split"), n, GPU_80) for n in (1, 2))
    assert two.worker("dit0").total_bytes > one.worker("dit0").total_bytes
    assert one.fits and two.fits


@pytest.mark.heavy
def test_the_server_refuses_a_placement_the_host_cannot_hold() -> None:
    with pytest.raises(PlacementError, match=r"host \(cpu\) needs .* GiB short"):
        create_app(Settings(host_memory_gib=0.25))


def test_an_official_preset_without_its_weights_fails_naming_the_missing_files(tmp_path) -> None:
    preset = get_preset("lingbot-world-v2-14b")
    with pytest.raises(CheckpointMissing, match="pass --checkpoint-dir DIR"):
        require_checkpoint(preset, None)
    (tmp_path / "transformers").mkdir()
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "transformers" / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "transformers" / "model-00001-of-00002.safetensors").touch()
    (tmp_path / "Wan2.1_VAE.pth").touch()
    with pytest.raises(CheckpointMissing) as err:
        require_checkpoint(preset, tmp_path)
    missing = str(err.value).split("missing: ")[1].split(", ")
    assert missing == [
        "transformers/model-00002-of-00002.safetensors",
        "models_t5_umt5-xxl-enc-bf16.pth",
        "google/umt5-xxl/tokenizer.json",
    ]
    require_checkpoint(get_preset("gridworld"), None)  # bundled weights
    require_checkpoint(get_preset("tiny"), None)  # a random-weight fixture


@pytest.mark.long
@pytest.mark.processes
def test_the_plan_agrees_with_each_cpu_workers_peak_resident_set(tmp_path) -> None:
    """gridworld here; the device check's rehearsal (tests/benchmarks/test_device_check.py) does tiny."""
    model = "gridworld"
    # As a user runs it: workers spawned from pytest would also import pytest (their parent's __main__).
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "benchmarks.replay", "--model", model, "--chunks", "3", "--quiet", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    planned, measured = report["memory_plan"], report["peak_memory"]
    assert set(planned) == set(measured) == {"encode0", "dit0", "decode0"}
    for worker, plan_bytes in planned.items():
        rss = measured[worker]["host_rss_bytes"]
        assert abs(plan_bytes - rss) <= 0.2 * rss, f"{worker}: plan {plan_bytes >> 20} MiB, measured {rss >> 20}"
