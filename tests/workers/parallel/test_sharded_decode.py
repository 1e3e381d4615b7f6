"""Height-sharded VAE decode: halo exchange, row gathering, and sharded == unsharded streaming decode.

Tolerance. On CPU every piece of the sharded decode is bit-exact per band except one: torch picks
the CPU backend of a batch-1 3x3 conv2d (the upsamplers' conv) by input size (oneDNN above ~20k
elements, its reference kernel below), so a band can land on the other side of that threshold than
the whole frame and round differently (~1 ulp). Those differences then propagate through the later
layers. Observed max |sharded - unsharded| over 45 frames: 2.8e-6 (2 ranks, 64x64 px; 6 of 553k
uint8 values off by 1) and 2.5e-6 (4 ranks, 128x64 px; 21 of 1.1M off by 1). With one conv2d
backend forced for both paths the results are bit-identical. ATOL (2e-5) leaves headroom for
that; a wrong halo row or cache frame shows up as errors of order 1e-1.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.dist import run_ranks
from workers.images import to_uint8_frames
from workers.models.presets import VAEConfig
from workers.models.vae import WanVAE
from workers.parallel.group import StageGroup
from workers.parallel.halo import SpatialShard, split_rows

ATOL = 2e-5
CHUNKS = [4, 4, 4]  # latent frames per decode_stream call: 13 + 16 + 16 = 45 video frames


def _vae(full_res_kernel_t: int = 3) -> WanVAE:
    torch.manual_seed(0)  # every rank builds the same weights
    return WanVAE(VAEConfig(base_dim=8, decoder_full_res_kernel_t=full_res_kernel_t)).eval()


def _latents(h: int, w: int, frames: int = sum(CHUNKS), seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 16, frames, h, w, generator=g)


def _decode_unsharded(latents: torch.Tensor, kernel_t: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    vae, parts = _vae(kernel_t), []
    state = vae.new_stream_state()
    with torch.inference_mode():
        for part in torch.split(latents, CHUNKS, dim=2):
            parts.append(vae.decode_stream(part, state))
    return torch.cat(parts, dim=2), [t for t in state.decoder_cache if isinstance(t, torch.Tensor)]


# --------------------------------------------------------------------------------------------- rank bodies
# Module-level (spawn pickles them by reference). They return numpy arrays: a tensor sent back
# through the result queue is shared via a file descriptor that dies with the rank's process.


def _halo_body(group: StageGroup) -> dict[str, object]:
    shard = SpatialShard.from_group(group)
    r, n, band = group.rank, group.world_size, 3
    # Global frame [2, 2, 5, H, 4] (5D, like a conv input with time) whose values name their row.
    full = torch.arange(n * band, dtype=torch.float32).view(1, 1, 1, -1, 1) + 1
    full = full.expand(2, 2, 5, n * band, 4) * torch.arange(1, 5).float()
    mine = split_rows(full, r, n).contiguous()
    out: dict[str, object] = {
        "halo1": shard.exchange_halo(mine, 1).numpy(),
        "halo2_4d": shard.exchange_halo(mine[:, :, 0], 2).numpy(),
        "gathered": shard.gather_rows(mine).numpy(),
    }
    to_last = shard.gather_rows_to(mine, n - 1)
    out["gathered_to_last"] = None if to_last is None else to_last.numpy()

    # A rank whose band differs fails with the same ValueError on every rank instead of hanging.
    vae = _vae()
    frames = 2 if r == 0 else 1
    try:
        with torch.inference_mode():
            vae.decode_stream(_latents(2, 2, frames=frames), vae.new_stream_state(), shard)
        out["mismatch"] = "no error"
    except ValueError as e:
        out["mismatch"] = str(e)

    # A stream keeps its shard layout.
    state = vae.new_stream_state()
    with torch.inference_mode():
        vae.decode_stream(_latents(2, 2, frames=1), state, shard)
    try:
        vae.decode_stream(_latents(2, 2, frames=1), state)
        out["layout"] = "no error"
    except ValueError as e:
        out["layout"] = str(e)
    return out


def _decode_body(group: StageGroup, latents: torch.Tensor, gather_to: int | None, kernel_t: int) -> dict[str, object]:
    vae, shard = _vae(kernel_t), SpatialShard.from_group(group)
    band = WanVAE.split_rows(latents, group.rank, group.world_size)
    state = vae.new_stream_state()
    with torch.inference_mode():
        chunks = [vae.decode_stream_sharded(p, state, shard, gather_to=gather_to) for p in torch.split(band, CHUNKS, 2)]
    received = [c for c in chunks if c is not None]
    assert len(received) in (0, len(chunks))
    video = torch.cat(received, dim=2).numpy() if received else None
    return {
        "video": video,
        "cache": [t.numpy() for t in state.decoder_cache if isinstance(t, torch.Tensor)],
        "frames_decoded": state.frames_decoded,
    }


# --------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.processes
def test_halo_exchange_and_gather(world_size: int) -> None:
    results = run_ranks(_halo_body, world_size)
    band = 3
    rows = np.arange(world_size * band, dtype=np.float32).reshape(1, 1, 1, -1, 1) + 1
    full = np.broadcast_to(rows, (2, 2, 5, world_size * band, 4)) * np.arange(1, 5, dtype=np.float32)
    padded = {k: np.pad(full, [(0, 0)] * 3 + [(k, k), (0, 0)]) for k in (1, 2)}  # zeros at the global edges
    for r, res in enumerate(results):
        # Band r plus `rows` rows either side: rank r-1's bottom rows above, rank r+1's top rows below.
        lo = r * band
        np.testing.assert_array_equal(res["halo1"], padded[1][..., lo : lo + band + 2, :])
        np.testing.assert_array_equal(res["halo2_4d"], padded[2][:, :, 0, lo : lo + band + 4, :])
        np.testing.assert_array_equal(res["gathered"], full)
        if r == world_size - 1:
            np.testing.assert_array_equal(res["gathered_to_last"], full)
        else:
            assert res["gathered_to_last"] is None
        assert "ranks disagree on latent band" in str(res["mismatch"]), res["mismatch"]
        assert "shard layout" in str(res["layout"]), res["layout"]
    # Spot-check the edges explicitly: zeros above rank 0 and below the last rank.
    assert not results[0]["halo1"][..., 0, :].any()
    assert not results[-1]["halo1"][..., -1, :].any()
    assert results[1]["halo1"][0, 0, 0, 0, 0] == band  # row band-1 of the frame, value band


@pytest.mark.parametrize(
    ("world_size", "h", "w", "gather_to", "kernel_t"),
    # 4 ranks: 16 latent rows -> bands of 4; kernel_t 1: a per-frame full-resolution stage
    [(2, 8, 8, 0, 3), (4, 16, 8, None, 3), (2, 8, 8, 0, 1)],
)
@pytest.mark.processes
def test_streaming_sharded_decode_matches_unsharded(
    world_size: int, h: int, w: int, gather_to: int | None, kernel_t: int
) -> None:
    latents = _latents(h, w)
    expected, expected_cache = _decode_unsharded(latents, kernel_t)
    results = run_ranks(_decode_body, world_size, latents, gather_to, kernel_t)

    receivers = range(world_size) if gather_to is None else [gather_to]
    for r, res in enumerate(results):
        assert res["frames_decoded"] == expected.shape[2] == 45
        if r not in receivers:
            assert res["video"] is None
            continue
        video = torch.from_numpy(res["video"])
        assert video.shape == expected.shape == (1, 3, 45, 8 * h, 8 * w)
        torch.testing.assert_close(video, expected, atol=ATOL, rtol=0)
        # What the product ships: uint8 frames. Rounding can flip a value sitting on a .5 boundary.
        got = to_uint8_frames(video[0]).astype(np.int16)
        off = np.abs(got - to_uint8_frames(expected[0]).astype(np.int16))
        assert off.max() <= 1
        assert (off > 0).mean() < 1e-3, f"{int((off > 0).sum())} of {off.size} uint8 values differ"

    # Each rank's causal caches hold exactly its band of the unsharded caches.
    for r, res in enumerate(results):
        assert len(res["cache"]) == len(expected_cache)
        for mine, full in zip(res["cache"], expected_cache, strict=True):
            want = split_rows(full, r, world_size)
            torch.testing.assert_close(torch.from_numpy(mine), want, atol=ATOL, rtol=0)


def test_single_rank_shard_equals_unsharded() -> None:
    """world_size 1 runs the sharded code path (zero halos, identity gathers) without any communication."""
    latents = _latents(4, 4, frames=5)
    vae = _vae()
    with torch.inference_mode():
        expected = vae.decode(latents)
        state = vae.new_stream_state()
        shard = SpatialShard(rank=0, world_size=1)
        parts = [vae.decode_stream_sharded(p, state, shard) for p in torch.split(latents, [1, 4], dim=2)]
    assert all(p is not None for p in parts)  # one rank: it is the gather destination
    torch.testing.assert_close(torch.cat([p for p in parts if p is not None], dim=2), expected, atol=ATOL, rtol=0)


def test_split_rows() -> None:
    latents = _latents(8, 4, frames=2)
    bands = [WanVAE.split_rows(latents, r, 4) for r in range(4)]
    assert all(b.shape == (1, 16, 2, 2, 4) for b in bands)
    assert torch.equal(torch.cat(bands, dim=3), latents)
    with pytest.raises(ValueError, match=r"height 8 .*3 equal bands"):
        split_rows(latents, 0, 3)
    with pytest.raises(ValueError, match="outside"):
        split_rows(latents, 2, 2)
    with pytest.raises(ValueError, match="outside"):
        SpatialShard(rank=1, world_size=1)


def test_single_rank_halo_is_zero_padding() -> None:
    x = torch.ones(1, 2, 3, 4)
    y = SpatialShard(0, 1).exchange_halo(x, 1)
    assert y.shape == (1, 2, 5, 4)
    assert torch.equal(y[:, :, 1:4], x) and not y[:, :, 0].any() and not y[:, :, 4].any()
    with pytest.raises(ValueError, match="taller"):
        SpatialShard(0, 1).exchange_halo(x, 4)
