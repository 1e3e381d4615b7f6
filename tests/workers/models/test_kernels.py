"""Kernel choices: attention backends agree, compiled and eager agree, settings fail early; a small
model's camera modulation kept for its chunk gives the same bits as recomputing it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from benchmarks.kernels import Variant, run
from server.common.settings import Settings
from workers.models import dit as dit_module
from workers.models.attention import fa3_installed
from workers.models.attention_backend import AttentionBackend
from workers.models.components import load_dit
from workers.models.kernels import KernelConfig, apply_to_dit, apply_to_process
from workers.models.presets import get_preset
from workers.runtime.engine import PipelineEngine
from workers.runtime.placement import get_placement
from workers.stages.denoise import DenoiseSession

CPU = torch.device("cpu")


def _latents(backend: AttentionBackend, chunks: int = 3) -> torch.Tensor:
    preset = get_preset("tiny")
    dit = apply_to_dit(load_dit(preset, CPU, None), KernelConfig(attention=backend), CPU)
    session = DenoiseSession(dit, preset, torch.zeros(5, preset.dit.text_dim), seed=0, chunk_latent_frames=4)
    cond = torch.randn(1, 20, 4, preset.latent_height, preset.latent_width, generator=torch.Generator().manual_seed(0))
    poses = torch.eye(4, dtype=torch.float64).repeat(4, 1, 1)
    return torch.cat([session.run_chunk(cond, poses) for _ in range(chunks)], dim=2)


@pytest.mark.heavy
def test_cpu_attention_backends_agree() -> None:
    reference = _latents(AttentionBackend.MATH)
    for backend in (AttentionBackend.FLASH, AttentionBackend.AUTO):
        # float32 kernels that sum in different orders: rounding-level differences only.
        torch.testing.assert_close(_latents(backend), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", [AttentionBackend.CUDNN, AttentionBackend.EFFICIENT])
def test_gpu_only_backends_are_refused_on_the_cpu_with_the_alternatives(backend: AttentionBackend) -> None:
    with pytest.raises(ValueError, match=rf"'{backend.value}' needs CUDA; on cpu use one of auto, flash, math"):
        KernelConfig(attention=backend).check(CPU)


@pytest.mark.skipif(fa3_installed(), reason="FlashAttention 3 is installed here")
def test_fa3_is_detected_never_required() -> None:
    assert KernelConfig().record(CPU)["attention_resolved"] == "auto"  # auto never asks for FA3 it lacks
    with pytest.raises(ValueError, match="flash_attn_interface"):
        KernelConfig(attention=AttentionBackend.FA3).check(CPU)


def test_the_engine_refuses_a_kernel_before_starting_any_worker() -> None:
    with pytest.raises(ValueError, match="needs CUDA"):
        PipelineEngine("tiny", get_placement("cpu"), kernels=KernelConfig(attention=AttentionBackend.CUDNN))


def test_server_settings_carry_the_kernel_choice() -> None:
    settings = Settings(attention="math", compile=True)
    assert settings.kernels == KernelConfig(AttentionBackend.MATH, compile=True)
    with pytest.raises(ValueError, match="attention"):
        Settings(attention="fastest")


@pytest.fixture
def restore_determinism() -> Iterator[None]:
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic)
    env = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic = before[1]
    if env is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def test_deterministic_mode_turns_on_deterministic_algorithms(restore_determinism: None) -> None:
    apply_to_process(KernelConfig(deterministic=True), CPU)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    # The regression property itself: two runs give the same bits.
    assert torch.equal(_latents(AttentionBackend.AUTO, chunks=2), _latents(AttentionBackend.AUTO, chunks=2))


@pytest.mark.long
@pytest.mark.processes  # inductor runs the C++ compiler
def test_compiled_and_eager_gridworld_agree_and_sessions_reuse_the_graphs() -> None:
    eager, compiled = Variant(KernelConfig()), Variant(KernelConfig(compile=True))
    report = run("gridworld", CPU, [eager, compiled], chunks=3, quiet=True)
    row = report["variants"][1]
    assert row["kernels"]["compile"] is True
    assert row["frames_vs_reference"]["within"], row["frames_vs_reference"]
    # Sessions share their worker's DiT: a second session on a compiled DiT compiles nothing new.
    from torch._dynamo.utils import counters  # here: the import takes seconds of every collection

    preset = get_preset("gridworld")
    dit = apply_to_dit(load_dit(preset, CPU, None), KernelConfig(compile=True), CPU)
    cond = torch.zeros(1, 20, 4, preset.latent_height, preset.latent_width)
    poses = torch.eye(4, dtype=torch.float64).repeat(4, 1, 1)
    graphs = []
    for seed in (1, 2):
        session = DenoiseSession(dit, preset, torch.zeros(5, preset.dit.text_dim), seed, chunk_latent_frames=4)
        out = torch.cat([session.run_chunk(cond, poses) for _ in range(3)])
        assert torch.isfinite(out).all()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[1] == graphs[0], graphs


@pytest.mark.heavy
def test_a_small_models_kept_camera_modulation_changes_no_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = _latents(AttentionBackend.AUTO)  # the tiny model's modulations are kept for its chunks
    monkeypatch.setattr(dit_module, "CAMERA_MODULATION_KEEP_BYTES", 0)  # recomputed in every forward
    assert torch.equal(_latents(AttentionBackend.AUTO), kept)
