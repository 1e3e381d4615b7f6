"""Our DiT against FastVideo 0.2.1's LingBot World 2 causal-fast DiT, with identical weights.

FastVideo's port reproduces the released LingBot-World v2 code exactly, and keeps its native key
names, so our state dict loads into it strictly. Both sides run the same chunk loop the live
denoise stage runs: per chunk, forwards at the sampler's timesteps on a staged cache, then one
t = 0 forward that commits the clean chunk; the chunk's start reaches RoPE as a frame offset on our
side and as a token offset on theirs. Inputs (noisy latents, condition, text, camera) are shared
random tensors, so each forward is compared on its own.

What the reference is run with, and nothing else changed: its attention entry points
(`attention`, which casts to bf16 when FlashAttention is absent, and `flash_attention`, CUDA-only)
are routed to float32 SDPA over the same tensors, and its sequence-parallel group queries answer
one rank (its single-GPU path) so no torch.distributed group is started.

The camera input is shared in most cases; one case feeds each side from its own camera code
(tests/parity/camera_paths.py). Configurations: a small one, and one with the real head dim 128
and the 14B's ratios (dim / heads = 128, ffn / dim = 2.7, window 18 with 6 sink frames, 4-frame
chunks), so RoPE's three-way split (44 / 42 / 42 channel pairs) and the window are exercised as at
14B. Six chunks run each window past its first roll. Negative controls show the comparison can
fail: a wrong sink count, and our side without the camera.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.parity.camera_paths import our_cells, reference_cells, walk_preset
from tests.parity.compare import F32_REL_BOUND, Agreement, measure
from tests.parity.references import fastvideo_module, float32_sdpa
from workers.models.dit import WanDiT
from workers.models.kv_cache import KVCacheSpec, SessionKVCache
from workers.models.presets import DiTConfig

pytestmark = pytest.mark.parity

STEP_TIMESTEPS = (999, 967, 908, 768)  # the released schedule at indices (0, 250, 500, 750), shift 10


@dataclass(frozen=True)
class Case:
    name: str
    dit: DiTConfig
    chunk_frames: int
    latent_hw: tuple[int, int]
    num_chunks: int = 6


SMALL = Case(
    "small",
    DiTConfig(
        dim=48,
        ffn_dim=96,
        num_layers=2,
        num_heads=2,
        freq_dim=32,
        text_dim=32,
        text_len=16,
        local_attn_size_frames=6,
        sink_size_frames=2,
    ),
    chunk_frames=2,
    latent_hw=(4, 6),
)
# 14B ratios at the real head dim: 5120 / 40 heads = 128 = 640 / 5; ffn 13824 / 5120 = 2.7 = 1728 / 640.
HEAD_DIM_128 = Case(
    "head-dim-128",
    DiTConfig(
        dim=640,
        ffn_dim=1728,
        num_layers=2,
        num_heads=5,
        text_dim=64,
        text_len=16,
        local_attn_size_frames=18,
        sink_size_frames=6,
    ),
    chunk_frames=4,
    latent_hw=(4, 4),
)


def _unmasked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The reference's `attention` / `flash_attention` call; it passes no masks on these paths."""
    assert kwargs.get("q_lens") is None and kwargs.get("k_lens") is None
    return float32_sdpa(q, k, v)


@pytest.fixture
def reference(monkeypatch: pytest.MonkeyPatch) -> Any:
    module = fastvideo_module("models.dits.lingbotworld2.causal_fast")
    monkeypatch.setattr(module, "attention", _unmasked_sdpa)
    monkeypatch.setattr(module, "flash_attention", _unmasked_sdpa)
    monkeypatch.setattr(module, "get_sp_world_size", lambda: 1)
    monkeypatch.setattr(module, "get_sp_parallel_rank", lambda: 0)
    return module


def _reference_dit(module: Any, cfg: DiTConfig, chunk_frames: int, sink_frames: int) -> torch.nn.Module:
    configs = fastvideo_module("configs.models.dits.lingbotworld2")
    arch = configs.LingBotWorld2CausalFastArchConfig(
        dim=cfg.dim,
        ffn_dim=cfg.ffn_dim,
        num_heads=cfg.num_heads,
        num_layers=cfg.num_layers,
        text_dim=cfg.text_dim,
        text_len=cfg.text_len,
        freq_dim=cfg.freq_dim,
        local_attn_size=cfg.local_attn_size_frames,
        sink_size=sink_frames,
        chunk_size=chunk_frames,
    )
    dit: torch.nn.Module = module.LingBotWorld2CausalFastTransformer3DModel(
        configs.LingBotWorld2CausalFastVideoConfig(arch_config=arch), {}
    )
    return dit.eval()


class ReferenceSession:
    """The released chunk loop's caches and call signature (FastVideo's generation stage)."""

    def __init__(self, dit: Any, cfg: DiTConfig, chunk_frames: int, tokens_per_frame: int, context: torch.Tensor):
        head_dim = cfg.dim // cfg.num_heads
        self.kv_size = tokens_per_frame * cfg.local_attn_size_frames
        shape = [1, self.kv_size, cfg.num_heads, head_dim]
        self.kv = [
            {
                "k": torch.zeros(shape),
                "v": torch.zeros(shape),
                "global_end_index": torch.tensor([0]),
                "local_end_index": torch.tensor([0]),
            }
            for _ in range(cfg.num_layers)
        ]
        text_shape = [1, cfg.text_len, cfg.num_heads, head_dim]
        self.cross = [
            {"k": torch.zeros(text_shape), "v": torch.zeros(text_shape), "is_init": torch.tensor([0], dtype=torch.bool)}
            for _ in range(cfg.num_layers)
        ]
        self.dit, self.chunk, self.fs, self.context = dit, chunk_frames, tokens_per_frame, context
        self.first_call = True

    def forward(
        self, k: int, x: torch.Tensor, cond: torch.Tensor, t: torch.Tensor, cells: torch.Tensor | None
    ) -> torch.Tensor:
        """x [1, 16, F, h, w], t [1] or per frame [1, F] -> velocity [1, 16, F, h, w]."""
        if t.dim() == 2:
            t = t.repeat_interleave(self.fs, dim=1)  # the reference takes a timestep per token
        out = self.dit(
            x=[x[0]],
            t=t,
            context=[self.context],
            seq_len=self.chunk * self.fs,
            y=[cond[0]],
            dit_cond_dict=None if cells is None else {"c2ws_plucker_emb": cells.chunk(1, dim=0)},
            kv_cache=self.kv,
            crossattn_cache=self.cross,
            current_start=k * self.chunk * self.fs,
            max_attention_size=self.kv_size,
            frame_seqlen=self.fs,
            cross_attn_first_call=self.first_call,
        )[0]
        self.first_call = False
        return out[None]


class OurSession:
    """What workers/stages/denoise.py holds per session: text K/V, the rolling cache, the camera."""

    def __init__(self, dit: WanDiT, cfg: DiTConfig, chunk_frames: int, tokens_per_frame: int, context: torch.Tensor):
        spec = KVCacheSpec(
            num_layers=cfg.num_layers,
            batch=1,
            num_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
            tokens_per_frame=tokens_per_frame,
            chunk_frames=chunk_frames,
            local_attn_size_frames=cfg.local_attn_size_frames,
            sink_size_frames=cfg.sink_size_frames,
        )
        self.dit, self.chunk = dit, chunk_frames
        self.cache = SessionKVCache(spec, torch.float32, torch.device("cpu"))
        self.text_kv = dit.text_kv([context])

    def forward(
        self, k: int, x: torch.Tensor, cond: torch.Tensor, t: torch.Tensor, cells: torch.Tensor | None, commit: bool
    ) -> torch.Tensor:
        camera = None if cells is None else self.dit.chunk_camera(cells)
        assert self.cache.committed_frames == k * self.chunk
        return self.dit(x, cond, t, self.text_kv, camera, k * self.chunk, self.cache, commit=commit)


@dataclass(frozen=True)
class ChunkInputs:
    noisy: list[torch.Tensor]  # one [1, 16, F, h, w] per sampling step
    clean: torch.Tensor  # the chunk committed at t = 0
    cond: torch.Tensor  # [1, 20, F, h, w]
    cells: torch.Tensor  # Plücker cells [1, 384, F, h, w]


def _inputs(case: Case, generator: torch.Generator) -> list[ChunkInputs]:
    f, (h, w) = case.chunk_frames, case.latent_hw
    chunks = []
    for _ in range(case.num_chunks):
        chunks.append(
            ChunkInputs(
                noisy=[torch.randn(1, 16, f, h, w, generator=generator) for _ in STEP_TIMESTEPS],
                clean=torch.randn(1, 16, f, h, w, generator=generator),
                cond=torch.randn(1, 20, f, h, w, generator=generator),
                # Plücker cells hold ray origins and unit directions: values of order one.
                cells=torch.randn(1, case.dit.camera_in_features // 4, f, h, w, generator=generator),
            )
        )
    return chunks


def _step_timesteps(step: int, frames: int, per_frame: bool) -> torch.Tensor:
    if not per_frame:
        return torch.tensor([STEP_TIMESTEPS[step]])
    # Frames of one chunk at different noise levels, as the DiT accepts a [B, F] timestep.
    return torch.tensor([[STEP_TIMESTEPS[(step + i) % len(STEP_TIMESTEPS)] for i in range(frames)]])


def run_both(
    case: Case,
    module: Any,
    *,
    reference_sink_frames: int | None = None,
    our_camera: bool = True,
    reference_cells: list[torch.Tensor] | None = None,
    our_cells: list[torch.Tensor] | None = None,
    per_frame_timesteps: bool = False,
    label: str = "",
) -> list[float]:
    """Run the chunk loop on both sides; print and return each chunk's largest relative velocity
    error over its forwards (the sampling steps and the commit)."""
    torch.manual_seed(0)
    ours = WanDiT(case.dit).eval()
    theirs = _reference_dit(module, case.dit, case.chunk_frames, reference_sink_frames or case.dit.sink_size_frames)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    g = torch.Generator().manual_seed(1)
    context = torch.randn(case.dit.text_len - 5, case.dit.text_dim, generator=g)  # shorter than text_len: padded
    tokens = (case.latent_hw[0] // 2) * (case.latent_hw[1] // 2)
    our_side = OurSession(ours, case.dit, case.chunk_frames, tokens, context)
    their_side = ReferenceSession(theirs, case.dit, case.chunk_frames, tokens, context)
    errors = []
    with torch.no_grad():
        for k, chunk in enumerate(_inputs(case, g)):
            cells_ours = chunk.cells if our_cells is None else our_cells[k]
            cells_theirs = chunk.cells if reference_cells is None else reference_cells[k]
            cam_ours = cells_ours if our_camera else None
            chunk_label = f"dit {case.name}{label} chunk {k}"
            forwards: list[Agreement] = []
            for step, noisy in enumerate(chunk.noisy):
                t = _step_timesteps(step, case.chunk_frames, per_frame_timesteps)
                v_ours = our_side.forward(k, noisy, chunk.cond, t, cam_ours, commit=False)
                v_theirs = their_side.forward(k, noisy, chunk.cond, t, cells_theirs)
                forwards.append(measure(f"{chunk_label} step {step}", v_ours, v_theirs))
            t0 = torch.zeros(1, dtype=torch.long)
            v_ours = our_side.forward(k, chunk.clean, chunk.cond, t0, cam_ours, commit=True)
            v_theirs = their_side.forward(k, chunk.clean, chunk.cond, t0, cells_theirs)
            forwards.append(measure(f"{chunk_label} commit", v_ours, v_theirs))
            worst = max(forwards, key=lambda a: a.rel)
            print(worst)
            errors.append(worst.rel)
    return errors


def test_one_chunk_from_an_empty_cache(reference: Any) -> None:
    errors = run_both(replace(SMALL, num_chunks=1), reference)
    assert errors[0] <= F32_REL_BOUND, errors


@pytest.mark.parametrize("case", [SMALL, HEAD_DIM_128], ids=lambda c: c.name)
def test_six_chunks_through_the_rolling_window_with_sink_frames(reference: Any, case: Case) -> None:
    window = case.dit.local_attn_size_frames
    assert case.num_chunks * case.chunk_frames > window + case.chunk_frames, "the window must roll at least twice"
    errors = run_both(case, reference)
    assert max(errors) <= F32_REL_BOUND, errors


def test_per_frame_timesteps(reference: Any) -> None:
    errors = run_both(replace(SMALL, num_chunks=2), reference, per_frame_timesteps=True, label=", per-frame t")
    assert max(errors) <= F32_REL_BOUND, errors


def test_a_wrong_sink_count_fails_the_comparison_once_the_window_rolls(reference: Any) -> None:
    case = SMALL
    errors = run_both(case, reference, reference_sink_frames=case.dit.sink_size_frames + 1, label=", wrong sink")
    # Chunks that fit the window never evict, so they agree; the first roll keeps other frames.
    first_roll = case.dit.local_attn_size_frames // case.chunk_frames
    assert max(errors[:first_roll]) <= F32_REL_BOUND, errors
    assert min(errors[first_roll:]) > 100 * F32_REL_BOUND, errors


def test_our_side_without_the_camera_fails_the_comparison(reference: Any) -> None:
    errors = run_both(replace(SMALL, num_chunks=1), reference, our_camera=False, label=", ours without camera")
    assert errors[0] > 100 * F32_REL_BOUND, errors


def test_each_side_with_its_own_camera_code(reference: Any, tmp_path: Path) -> None:
    case = SMALL
    preset = walk_preset(case.latent_hw[0] * 8, case.latent_hw[1] * 8)
    errors = run_both(
        case,
        reference,
        our_cells=our_cells(preset, case.chunk_frames, case.num_chunks),
        reference_cells=reference_cells(preset, case.chunk_frames, case.num_chunks, tmp_path),
        label=", own camera code",
    )
    assert max(errors) <= F32_REL_BOUND, errors
