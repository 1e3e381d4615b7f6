"""The causal DiT: streaming with the KV cache reproduces one masked forward over the whole sequence."""

from __future__ import annotations

import pytest
import torch

from tests.support.tiny_dit import LAT_H, LAT_W, TOKENS, dit_inputs, make_dit
from workers.models.dit import WanDiT
from workers.models.kv_cache import KVCacheSpec, SessionKVCache, window_mask
from workers.models.sampler import FewStepSampler, FlowSchedule

CHUNK = 2
NUM_CHUNKS = 5
# Float32 throughout; both paths run the same kernels on differently shaped (and ordered) key
# sets, so they agree to rounding, amplified a little by 4 sampling steps.
ATOL = 2e-4


def inputs(seed: int, frames: int = CHUNK * NUM_CHUNKS) -> dict[str, torch.Tensor]:
    return dit_inputs(seed, frames)


def sampler() -> FewStepSampler:
    return FewStepSampler(FlowSchedule.unipc(1000, 10.0).subset((0, 250, 500, 750)))


@torch.no_grad()
def generate_streaming(dit: WanDiT, data: dict[str, torch.Tensor], seed: int) -> torch.Tensor:
    cfg = dit.cfg
    spec = KVCacheSpec(
        num_layers=cfg.num_layers,
        batch=1,
        num_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        tokens_per_frame=TOKENS,
        chunk_frames=CHUNK,
        local_attn_size_frames=cfg.local_attn_size_frames,
        sink_size_frames=cfg.sink_size_frames,
    )
    cache = SessionKVCache(spec, torch.float32, torch.device("cpu"))
    text_kv = dit.text_kv([data["text"]])
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in range(NUM_CHUNKS):
        sl = slice(k * CHUNK, (k + 1) * CHUNK)
        cond, cam = data["cond"][:, :, sl], dit.chunk_camera(data["cam"][:, :, sl])
        start = cache.committed_frames
        assert start == k * CHUNK
        noise = torch.randn(1, 16, CHUNK, LAT_H, LAT_W, generator=gen)

        def velocity(x_t: torch.Tensor, t: torch.Tensor, cond=cond, cam=cam, start=start) -> torch.Tensor:
            return dit(x_t, cond, t, text_kv, cam, start, cache, commit=False)

        x0 = sampler().sample(noise, velocity, gen)
        dit(x0, cond, torch.zeros(1), text_kv, cam, start, cache, commit=True)
        out.append(x0)
    return torch.cat(out, dim=2)


@torch.no_grad()
def generate_full_sequence(dit: WanDiT, data: dict[str, torch.Tensor], seed: int) -> torch.Tensor:
    """Reference: each forward runs over [clean history, current chunk] with the window mask."""
    cfg = dit.cfg
    text_kv = dit.text_kv([data["text"]])
    gen = torch.Generator().manual_seed(seed)
    history = torch.zeros(1, 16, 0, LAT_H, LAT_W)
    for k in range(NUM_CHUNKS):
        frames = (k + 1) * CHUNK
        cond = data["cond"][:, :, :frames]
        cam = dit.chunk_camera(data["cam"][:, :, :frames])
        mask = window_mask(frames, CHUNK, TOKENS, cfg.local_attn_size_frames, cfg.sink_size_frames)
        noise = torch.randn(1, 16, CHUNK, LAT_H, LAT_W, generator=gen)

        def velocity(
            x_t: torch.Tensor, t: torch.Tensor, cond=cond, cam=cam, mask=mask, k=k, history=history
        ) -> torch.Tensor:
            seq = torch.cat([history, x_t], dim=2)
            t_frames = torch.cat([torch.zeros(1, k * CHUNK), t.float().expand(1, CHUNK)], dim=1)
            return dit(seq, cond, t_frames, text_kv, cam, 0, attn_mask=mask)[:, :, -CHUNK:]

        x0 = sampler().sample(noise, velocity, gen)
        history = torch.cat([history, x0], dim=2)
    return history


@pytest.mark.parametrize(
    ("local", "sink"),
    [(-1, 0), (16, 2), (5, 1)],
    ids=["global", "window-no-eviction", "window-evicts"],
)
def test_streaming_matches_full_sequence(local: int, sink: int) -> None:
    dit = make_dit(local, sink)
    data = inputs(seed=1)
    streamed = generate_streaming(dit, data, seed=7)
    reference = generate_full_sequence(dit, data, seed=7)
    assert streamed.shape == (1, 16, CHUNK * NUM_CHUNKS, LAT_H, LAT_W)
    torch.testing.assert_close(streamed, reference, atol=ATOL, rtol=0)


def test_eviction_changes_the_result() -> None:
    """The evicting window really drops history: it differs from global attention."""
    data = inputs(seed=1)
    evicting = generate_streaming(make_dit(5, 1), data, seed=7)
    global_ = generate_streaming(make_dit(-1, 0), data, seed=7)
    # The first chunks see the same history either way; later ones must not.
    torch.testing.assert_close(evicting[:, :, : 2 * CHUNK], global_[:, :, : 2 * CHUNK], atol=ATOL, rtol=0)
    assert (evicting[:, :, -CHUNK:] - global_[:, :, -CHUNK:]).abs().max() > 1e-3


def test_cache_is_bounded_and_keeps_sink() -> None:
    dit = make_dit(5, 1)
    data = inputs(seed=2)
    cfg = dit.cfg
    spec = KVCacheSpec(cfg.num_layers, 1, cfg.num_heads, cfg.head_dim, TOKENS, CHUNK, 5, 1)
    cache = SessionKVCache(spec, torch.float32, torch.device("cpu"))
    text_kv = dit.text_kv([data["text"]])
    nbytes = cache.nbytes()
    sink_k = None
    with torch.no_grad():
        for k in range(NUM_CHUNKS):
            sl = slice(k * CHUNK, (k + 1) * CHUNK)
            x = torch.randn(1, 16, CHUNK, LAT_H, LAT_W)
            dit(
                x,
                data["cond"][:, :, sl],
                torch.zeros(1),
                text_kv,
                dit.chunk_camera(data["cam"][:, :, sl]),
                cache.committed_frames,
                cache,
                commit=True,
            )
            if sink_k is None:
                sink_k = cache.layers[0].k[:, :TOKENS].clone()
    assert cache.committed_frames == NUM_CHUNKS * CHUNK
    assert cache.nbytes() == nbytes  # preallocated, never grows
    assert cache.layers[0].length == 5 * TOKENS  # full window: sink + most recent frames
    torch.testing.assert_close(cache.layers[0].k[:, :TOKENS], sink_k, atol=0, rtol=0)


def test_window_mask_shape_and_rules() -> None:
    mask = window_mask(num_frames=8, chunk_frames=2, tokens_per_frame=1, local_attn_size_frames=5, sink_size_frames=1)
    assert mask.shape == (8, 8)
    # Chunk 3 (frames 6, 7): sees itself, sink frame 0, and the 2 most recent committed frames 4, 5.
    assert mask[6].tolist() == [True, False, False, False, True, True, True, True]
    # Nothing sees the future.
    assert not mask[0, 2:].any()


def test_kv_spec_rejects_window_without_room() -> None:
    with pytest.raises(ValueError, match="window"):
        KVCacheSpec(1, 1, 1, 8, 4, chunk_frames=4, local_attn_size_frames=5, sink_size_frames=1)


def test_bf16_weights_run_with_float32_conditioning() -> None:
    """The GPU precision policy (bf16 weights, float32 residual and modulation) also runs on CPU, close to fp32."""
    data = inputs(seed=3)
    sl = slice(0, CHUNK)
    noisy = torch.randn(1, 16, CHUNK, LAT_H, LAT_W, generator=torch.Generator().manual_seed(4))
    outs = []
    for dtype in (torch.float32, torch.bfloat16):
        dit = make_dit(-1, 0).to(dtype)
        with torch.no_grad():
            text_kv = dit.text_kv([data["text"]])
            cam = dit.chunk_camera(data["cam"][:, :, sl])
            outs.append(dit(noisy, data["cond"][:, :, sl], torch.tensor([500]), text_kv, cam, 0))
    v32, v16 = outs
    assert v16.dtype == torch.float32 and torch.isfinite(v16).all()
    # bf16 keeps ~3 significant digits per op; across 2 blocks the relative error stays a few percent.
    rel = (v16 - v32).norm() / v32.norm()
    assert rel < 0.05, rel
