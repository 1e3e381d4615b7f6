"""Wan2.1 causal VAE: checkpoint layout, shapes, and bit-exact streaming versus one-shot."""

from __future__ import annotations

import pytest
import torch

from workers.models.presets import VAEConfig
from workers.models.vae import (
    FIRST_CALL,
    CausalConv3d,
    VAEStreamState,
    WanVAE,
    count_cache_slots,
)

SIZE = 32  # pixels; 4x4 latents with the 8x spatial stride


@pytest.fixture(scope="module")
def vae() -> WanVAE:
    torch.manual_seed(0)
    return WanVAE(VAEConfig(base_dim=8)).eval()


def _video(frames: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, frames, SIZE, SIZE, generator=g) * 2 - 1


def _latents(frames: int, batch: int = 1, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 16, frames, SIZE // 8, SIZE // 8, generator=g)


def _split(x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    assert sum(sizes) == x.shape[2]
    return list(torch.split(x, sizes, dim=2))


def test_full_size_checkpoint_layout() -> None:
    with torch.device("meta"):
        model = WanVAE(VAEConfig())
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = {
        "encoder.conv1.weight": (96, 3, 3, 3, 3),
        "encoder.downsamples.0.residual.0.gamma": (96, 1, 1, 1),
        "encoder.downsamples.0.residual.2.weight": (96, 96, 3, 3, 3),
        "encoder.downsamples.3.shortcut.weight": (192, 96, 1, 1, 1),
        "encoder.downsamples.5.time_conv.weight": (192, 192, 3, 1, 1),
        "encoder.middle.1.norm.gamma": (384, 1, 1),
        "encoder.middle.1.to_qkv.weight": (1152, 384, 1, 1),
        "encoder.head.2.weight": (32, 384, 3, 3, 3),
        "conv1.weight": (32, 32, 1, 1, 1),
        "conv2.weight": (16, 16, 1, 1, 1),
        "decoder.conv1.weight": (384, 16, 3, 3, 3),
        "decoder.upsamples.3.time_conv.weight": (768, 384, 3, 1, 1),
        "decoder.upsamples.3.resample.1.weight": (192, 384, 3, 3),
        "decoder.upsamples.4.residual.2.weight": (384, 192, 3, 3, 3),
        "decoder.upsamples.14.residual.6.weight": (96, 96, 3, 3, 3),
        "decoder.head.2.weight": (3, 96, 3, 3, 3),
    }
    for key, shape in expected.items():
        assert shapes[key] == shape, key
    # Only the 2D-only stages lack a time_conv: encoder stage 0, decoder stage 2.
    assert "encoder.downsamples.2.time_conv.weight" not in shapes
    assert "decoder.upsamples.11.time_conv.weight" not in shapes
    assert len(shapes) == 194
    total = sum(v.numel() for v in model.state_dict().values())
    assert abs(total - 127e6) / 127e6 < 0.01, total


def test_cache_slots_counted_from_modules(vae: WanVAE) -> None:
    temporal = [m for m in vae.encoder.modules() if isinstance(m, CausalConv3d) and m.kernel_size[0] > 1]
    assert vae.encoder.num_cache_slots == count_cache_slots(vae.encoder) == len(temporal)
    assert sorted(m.cache_slot for m in temporal) == list(range(len(temporal)))
    state = vae.new_stream_state()
    assert len(state.encoder_cache) == vae.encoder.num_cache_slots
    assert len(state.decoder_cache) == vae.decoder.num_cache_slots


@pytest.mark.parametrize(("n", "batch"), [(0, 1), (1, 2), (2, 1)])
def test_shapes_round_trip(vae: WanVAE, n: int, batch: int) -> None:
    with torch.inference_mode():
        z = vae.encode(_video(4 * n + 1, batch))
        assert z.shape == (batch, 16, n + 1, SIZE // 8, SIZE // 8)
        assert z.dtype == torch.float32
        video = vae.decode(z)
    assert video.shape == (batch, 3, 4 * n + 1, SIZE, SIZE)
    assert video.abs().max() <= 1.0


@pytest.mark.parametrize("chunks", [[4, 4], [1] * 8, [3, 3, 2]])
def test_streaming_decode_equals_one_shot(vae: WanVAE, chunks: list[int]) -> None:
    latents = _latents(8)
    with torch.inference_mode():
        expected = vae.decode(latents)
        state = vae.new_stream_state()
        parts = [vae.decode_stream(part, state) for part in _split(latents, chunks)]
    # One-shot decoding is the same per-latent-frame loop, so the results are bit-identical.
    assert torch.equal(torch.cat(parts, dim=2), expected)
    assert [p.shape[2] for p in parts] == [4 * c - (3 if i == 0 else 0) for i, c in enumerate(chunks)]
    assert state.latents_decoded == 8 and state.frames_decoded == 29
    assert all(isinstance(slot, torch.Tensor) for slot in state.decoder_cache)


def test_interleaved_decode_sessions_do_not_interfere(vae: WanVAE) -> None:
    a, b = _latents(3, seed=3), _latents(3, seed=4)
    with torch.inference_mode():
        expected_a, expected_b = vae.decode(a), vae.decode(b)
        sa, sb = vae.new_stream_state(), vae.new_stream_state()
        out_a, out_b = [], []
        for i in range(3):
            out_a.append(vae.decode_stream(a[:, :, i : i + 1], sa))
            out_b.append(vae.decode_stream(b[:, :, i : i + 1], sb))
    assert torch.equal(torch.cat(out_a, dim=2), expected_a)
    assert torch.equal(torch.cat(out_b, dim=2), expected_b)


def test_first_decode_call_marks_temporal_upsamplers(vae: WanVAE) -> None:
    state = vae.new_stream_state()
    with torch.inference_mode():
        out = vae.decode_stream(_latents(1), state)
    assert out.shape[2] == 1
    assert sum(slot is FIRST_CALL for slot in state.decoder_cache) == sum(vae.config.temporal_downsample)


@pytest.mark.parametrize("chunks", [[5, 12], [1, 4, 4, 4, 4], [9, 8]])
def test_streaming_encode_equals_one_shot(vae: WanVAE, chunks: list[int]) -> None:
    video = _video(17)
    with torch.inference_mode():
        expected = vae.encode(video)
        state = vae.new_stream_state()
        parts = [vae.encode_stream(part, state) for part in _split(video, chunks)]
    # One-shot encoding runs frame 0 then groups of 4 exactly as the chunked calls do: bit-identical.
    assert torch.equal(torch.cat(parts, dim=2), expected)
    assert expected.shape[2] == 5
    assert state.frames_encoded == 17 and state.latents_encoded == 5
    assert all(isinstance(slot, torch.Tensor) for slot in state.encoder_cache)


def test_reset_restarts_the_stream(vae: WanVAE) -> None:
    video = _video(5)
    with torch.inference_mode():
        expected = vae.encode(video)
        state = vae.new_stream_state()
        vae.encode_stream(_video(5, seed=9), state)
        state.reset()
        assert state.frames_encoded == 0 and all(slot is None for slot in state.encoder_cache)
        assert torch.equal(vae.encode_stream(video, state), expected)


@pytest.mark.parametrize("frames", [0, 2, 4, 8])
def test_bad_first_encode_chunk_raises(vae: WanVAE, frames: int) -> None:
    state = vae.new_stream_state()
    with pytest.raises(ValueError, match="4n\\+1"):
        vae.encode_stream(_video(frames), state)
    assert state.frames_encoded == 0 and all(slot is None for slot in state.encoder_cache)


@pytest.mark.parametrize("frames", [0, 1, 3, 5])
def test_bad_later_encode_chunk_raises(vae: WanVAE, frames: int) -> None:
    state = vae.new_stream_state()
    with torch.inference_mode():
        vae.encode_stream(_video(1), state)
        with pytest.raises(ValueError, match="multiple of 4"):
            vae.encode_stream(_video(frames), state)
    assert state.frames_encoded == 1


def test_bad_inputs_raise(vae: WanVAE) -> None:
    state = vae.new_stream_state()
    with torch.inference_mode():
        with pytest.raises(ValueError, match="frame size"):
            vae.encode(torch.zeros(1, 3, 1, 20, 32))
        with pytest.raises(ValueError, match=r"\[B, 3, T, H, W\]"):
            vae.encode(torch.zeros(1, 4, 1, 32, 32))
        with pytest.raises(ValueError, match="at least one frame"):
            vae.decode_stream(_latents(0), state)
        with pytest.raises(ValueError, match="latents must be"):
            vae.decode_stream(torch.zeros(1, 8, 1, 4, 4), state)
        vae.decode_stream(_latents(1), state)
        with pytest.raises(ValueError, match="geometry"):
            vae.decode_stream(_latents(1, batch=2), state)
    with pytest.raises(ValueError, match="slots"):
        vae.encode_stream(_video(1), VAEStreamState(1, 1))


def test_a_per_frame_full_resolution_stage_keeps_no_history_there() -> None:
    torch.manual_seed(0)
    per_frame = WanVAE(VAEConfig(base_dim=8, decoder_full_res_kernel_t=1)).eval()
    last_stage = [*per_frame.decoder.upsamples[-3:].modules(), *per_frame.decoder.head.modules()]
    convs = [m for m in last_stage if isinstance(m, CausalConv3d) and m.kernel_size[1] == 3]
    assert len(convs) == 7 and all(m.kernel_size == (1, 3, 3) and m.cache_slot is None for m in convs)
    torch.manual_seed(0)
    assert per_frame.decoder.num_cache_slots == WanVAE(VAEConfig(base_dim=8)).decoder.num_cache_slots - 7
    latents = _latents(8)
    with torch.inference_mode():
        expected = per_frame.decode(latents)
        state = per_frame.new_stream_state()
        parts = [per_frame.decode_stream(part, state) for part in _split(latents, [1, 4, 3])]
    assert torch.equal(torch.cat(parts, dim=2), expected)
    assert expected.shape == (1, 3, 29, SIZE, SIZE)


def test_a_latent_frames_first_video_frames_come_apart_and_first() -> None:
    torch.manual_seed(0)
    vae = WanVAE(VAEConfig(base_dim=8)).eval()
    latents = _latents(3)
    head_calls = []
    hook = vae.decoder.head[-1].register_forward_hook(lambda m, i, o: head_calls.append(o.shape[2]))
    with torch.inference_mode():
        expected = vae.decode(latents)
        del head_calls[:]
        state = vae.new_stream_state()
        # The stream's first latent frame is one video frame: nothing to split.
        ((first, whole),) = vae.decode_stream_parts(latents[:, :, :1], state, first_frames=2)
        assert whole and first.shape[2] == 1
        pieces = vae.decode_stream_parts(latents[:, :, 1:], state, first_frames=2)
        head_calls.clear()
        early, whole = next(pieces)
        assert early.shape[2] == 2 and not whole and head_calls == [2]  # nothing after it has run yet
        rest = list(pieces)
    hook.remove()
    assert [(v.shape[2], w) for v, w in rest] == [(6, True)] and head_calls == [2, 2, 4]
    video = torch.cat([first, early, rest[0][0]], dim=2)
    # The full-resolution layers ran on 2 frames at a time instead of 4: float rounding apart.
    torch.testing.assert_close(video, expected, rtol=0, atol=1e-5)
    assert state.latents_decoded == 3 and state.frames_decoded == 9


def test_first_frames_apart_needs_one_unbanded_pass() -> None:
    torch.manual_seed(0)
    vae = WanVAE(VAEConfig(base_dim=8)).eval()
    vae.set_bands(2, SIZE)
    with pytest.raises(ValueError, match="unbanded"):
        next(vae.decode_stream_parts(_latents(1), vae.new_stream_state(), first_frames=2))
