"""Ulysses sequence parallelism: 2 gloo ranks reproduce the single-rank DiT, streaming with the KV cache."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.dist import run_ranks
from tests.support.tiny_dit import LAT_H, LAT_W, TOKENS, dit_inputs
from tests.support.tiny_dit import make_dit as make_test_dit
from workers.models.dit import WanDiT
from workers.models.kv_cache import KVCacheSpec, SessionKVCache, window_mask
from workers.models.sampler import FewStepSampler, FlowSchedule
from workers.parallel.group import StageGroup
from workers.parallel.ulysses import SequenceParallel

pytestmark = pytest.mark.processes

WORLD = 2
# 16 tokens per frame: 8 per rank
HEADS = 4
HEAD_DIM = 16
CHUNK = 2
NUM_CHUNKS = 4
LOCAL, SINK = 5, 1  # a 5-frame window: from the third chunk on, old frames are evicted
# Float32 throughout. The split runs the same math on different GEMM and attention shapes (8 vs 16
# tokens per frame, 2 vs 4 heads per call). Each output element still reduces over the same operands
# in the same order here (single-threaded CPU kernels: observed max difference 0.0), but a BLAS may
# block differently per shape, which changes float32 rounding: ~1e-6 for one forward of values
# O(1..5), growing through 4 sampling steps and cached history. Hence a tolerance, not equality.
FORWARD_ATOL = 2e-5
LATENT_ATOL = 1e-4


def make_dit() -> WanDiT:
    return make_test_dit(LOCAL, SINK)  # dim 64 = 4 heads × 16


def inputs(seed: int) -> dict[str, torch.Tensor]:
    return dit_inputs(seed, CHUNK * NUM_CHUNKS)


def new_cache(heads: int) -> SessionKVCache:
    spec = KVCacheSpec(2, 1, heads, HEAD_DIM, TOKENS, CHUNK, LOCAL, SINK)
    return SessionKVCache(spec, torch.float32, torch.device("cpu"))


@torch.no_grad()
def run_model(sp: SequenceParallel | None) -> dict[str, Any]:
    """Everything the tests compare, as numpy arrays (tensors do not survive the rank queue)."""
    dit, data = make_dit(), inputs(seed=1)
    heads = HEADS if sp is None else HEADS // sp.world_size
    text_kv = dit.text_kv([data["text"]])
    result: dict[str, Any] = {}

    # One cached forward on a fresh session, committing its K/V.
    cache = new_cache(heads)
    first = slice(0, CHUNK)
    cam = dit.chunk_camera(data["cam"][:, :, first], sp=sp)
    out = dit(
        data["x"][:, :, first],
        data["cond"][:, :, first],
        torch.tensor([500.0]),
        text_kv,
        cam,
        0,
        cache,
        commit=True,
        sp=sp,
    )
    result["forward"] = out.numpy()
    result["cache_k"] = np.stack([layer.k.numpy() for layer in cache.layers])
    result["cache_v"] = np.stack([layer.v.numpy() for layer in cache.layers])

    # One masked forward over the whole sequence (the tests' reference path) also splits cleanly.
    frames = CHUNK * NUM_CHUNKS
    mask = window_mask(frames, CHUNK, TOKENS, LOCAL, SINK)
    cam = dit.chunk_camera(data["cam"], sp=sp)
    result["masked"] = dit(
        data["x"], data["cond"], torch.tensor([300.0]), text_kv, cam, 0, attn_mask=mask, sp=sp
    ).numpy()

    # A streamed session: few-step sampling per chunk, then the commit forward, window evicting.
    cache = new_cache(heads)
    sampler = FewStepSampler(FlowSchedule.unipc(1000, 10.0).subset((0, 250, 500, 750)))
    gen = torch.Generator().manual_seed(7)
    latents = []
    for k in range(NUM_CHUNKS):
        sl = slice(k * CHUNK, (k + 1) * CHUNK)
        cond, cam = data["cond"][:, :, sl], dit.chunk_camera(data["cam"][:, :, sl], sp=sp)
        start = cache.committed_frames
        noise = torch.randn(1, 16, CHUNK, LAT_H, LAT_W, generator=gen)

        def velocity(x_t: torch.Tensor, t: torch.Tensor, cond=cond, cam=cam, start=start) -> torch.Tensor:
            return dit(x_t, cond, t, text_kv, cam, start, cache, commit=False, sp=sp)

        x0 = sampler.sample(noise, velocity, gen)
        dit(x0, cond, torch.zeros(1), text_kv, cam, start, cache, commit=True, sp=sp)
        latents.append(x0)
    result["latents"] = torch.cat(latents, dim=2).numpy()
    result["stream_k_shape"] = tuple(cache.layers[0].k.shape)
    result["stream_length"] = cache.layers[0].length
    return result


def _rank(group: StageGroup) -> dict[str, Any]:
    return run_model(SequenceParallel(group))


@pytest.fixture(scope="module")
def results() -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(single-rank reference, [rank 0, rank 1]); the ranks are spawned once for the whole module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the ranks; 2-core runners oversubscribe otherwise
    try:
        reference = run_model(None)
    finally:
        torch.set_num_threads(threads)
    yield reference, run_ranks(_rank, WORLD)


def test_single_forward_matches_one_rank(results) -> None:
    reference, ranks = results
    for r in ranks:
        assert r["forward"].shape == (1, 16, CHUNK, LAT_H, LAT_W)
        np.testing.assert_allclose(r["forward"], reference["forward"], atol=FORWARD_ATOL, rtol=0)
        np.testing.assert_allclose(r["masked"], reference["masked"], atol=FORWARD_ATOL, rtol=0)


def test_each_rank_caches_its_own_heads(results) -> None:
    reference, ranks = results
    per_rank = HEADS // WORLD
    for rank, r in enumerate(ranks):
        # [layers, B, window tokens, heads on this rank, head_dim]
        assert r["cache_k"].shape == (2, 1, LOCAL * TOKENS, per_rank, HEAD_DIM)
        assert r["stream_k_shape"] == (1, LOCAL * TOKENS, per_rank, HEAD_DIM)
        heads = slice(rank * per_rank, (rank + 1) * per_rank)
        for name in ("cache_k", "cache_v"):
            np.testing.assert_allclose(r[name], reference[name][..., heads, :], atol=FORWARD_ATOL, rtol=0)
    assert ranks[0]["stream_length"] == reference["stream_length"] == LOCAL * TOKENS  # the window filled


def test_streamed_latents_match_one_rank(results) -> None:
    reference, ranks = results
    for r in ranks:
        assert r["latents"].shape == (1, 16, CHUNK * NUM_CHUNKS, LAT_H, LAT_W)
        np.testing.assert_allclose(r["latents"], reference["latents"], atol=LATENT_ATOL, rtol=0)


def test_ranks_agree_bitwise(results) -> None:
    """Every rank returns the same gathered velocity, so identically seeded samplers stay in lockstep."""
    _, (r0, r1) = results
    for name in ("forward", "masked", "latents"):
        np.testing.assert_array_equal(r0[name], r1[name])


@pytest.mark.parametrize(
    ("world_size", "message"),
    [(3, "tokens per frame divisible by 3; got 16 tokens per frame"), (8, "heads divisible by 8; got 4 heads")],
    ids=["tokens", "heads"],
)
def test_uneven_split_is_rejected(world_size: int, message: str) -> None:
    """Checked before any collective, so no process group is needed."""
    dit, data = make_dit(), inputs(seed=1)
    sp = SequenceParallel(StageGroup(rank=0, world_size=world_size))
    frames = slice(0, CHUNK)
    with pytest.raises(ValueError, match=message):
        dit.chunk_camera(data["cam"][:, :, frames], sp=sp)
    text_kv = dit.text_kv([data["text"]])
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        dit(data["x"][:, :, frames], data["cond"][:, :, frames], torch.tensor([500.0]), text_kv, None, 0, sp=sp)


def test_one_rank_group_is_the_single_rank_path(results, single_thread_torch) -> None:
    reference, _ = results
    one = run_model(SequenceParallel(StageGroup(rank=0, world_size=1)))
    for name in ("forward", "masked", "cache_k", "latents"):
        np.testing.assert_array_equal(one[name], reference[name])
