"""Height bands on one device: the geometry alone, then banded streams against one pass."""

from __future__ import annotations

import pytest
import torch

from workers.models.presets import get_preset
from workers.models.vae import WanVAE
from workers.models.vae_bands import RowKind, RowStep, plan_bands


def test_bands_own_every_output_row_once_with_the_halo_their_convs_read() -> None:
    steps = [RowStep(RowKind.SAME, 1), RowStep(RowKind.SAME, 2), RowStep(RowKind.DOWN), RowStep(RowKind.SAME, 2)]
    bands = plan_bands(steps, 64, 4)
    assert [(b.out_lo, b.out_hi) for b in bands] == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert bands[0].in_lo == 0 and bands[-1].in_hi == 64
    for b in bands:
        assert b.in_lo % 2 == 0  # on the stride-2 grid
        assert b.keep_hi - b.keep_lo == b.out_hi - b.out_lo
    # Band 1 owns rows 8..16: 6..18 before the last conv, 12..37 before the downsample, 9..40 at the
    # input, widened to the stride-2 grid.
    assert (bands[1].in_lo, bands[1].in_hi) == (8, 40)
    up = plan_bands([RowStep(RowKind.UP, 1), RowStep(RowKind.SAME, 1)], 16, 2)
    assert [(b.in_lo, b.in_hi, b.out_lo, b.out_hi) for b in up] == [(0, 9, 0, 16), (7, 16, 16, 32)]


def test_more_bands_than_rows_is_refused_with_the_limit() -> None:
    with pytest.raises(ValueError, match="at most 4"):
        plan_bands([RowStep(RowKind.DOWN), RowStep(RowKind.DOWN)], 16, 5)
    vae = WanVAE(get_preset("tiny").vae)
    most = vae.max_bands(64)
    with pytest.raises(ValueError, match=f"allow 1 to {most} bands"):
        vae.set_bands(most + 1, 64)


@pytest.mark.heavy
@pytest.mark.parametrize("bands", [2, 3])
def test_a_banded_stream_encodes_and_decodes_what_one_pass_does(bands: int) -> None:
    preset = get_preset("gridworld")
    torch.manual_seed(0)
    vae = WanVAE(preset.vae).eval()
    for p in vae.parameters():
        torch.nn.init.normal_(p, std=0.05)
    h, w = preset.height_px, preset.width_px
    video = [torch.rand(1, 3, 5, h, w) * 2 - 1, torch.rand(1, 3, 8, h, w) * 2 - 1]

    def stream(n: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        vae.set_bands(n, h)
        state = vae.new_stream_state()
        with torch.no_grad():
            latents = torch.cat([vae.encode_stream(v, state) for v in video], dim=2)
            frames = torch.cat([vae.decode_stream(latents[:, :, i : i + 1], state) for i in range(latents.shape[2])], 2)
        return latents, frames, len(state.decoder_band_caches)

    one_latents, one_frames, none = stream(1)
    latents, frames, caches = stream(bands)
    assert none == 0 and caches == bands
    # Same arithmetic on fewer rows: equal to float rounding (on one CPU, bit for bit).
    torch.testing.assert_close(latents, one_latents, rtol=0, atol=1e-5)
    torch.testing.assert_close(frames, one_frames, rtol=0, atol=1e-5)
    state = vae.new_stream_state()
    vae.set_bands(1, h)
    with pytest.raises(ValueError, match="band"):
        vae.encode_stream(video[0], state)  # a stream keeps the bands it was made with
