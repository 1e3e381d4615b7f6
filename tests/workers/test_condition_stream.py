"""The image-condition stream's fixed point: once the encoder's caches hold nothing but black frames,
every later condition is the previous one; the stream stops encoding and lets its caches go, and
every condition equals what encoding each chunk would give. Before it, on the CPU, the encoder's
layers whose inputs repeat are skipped, and that changes no bit either."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.images import to_model_range
from workers.models.components import load_vae
from workers.models.presets import TINY
from workers.stages.condition import ImageConditionStream

CPU = torch.device("cpu")
CHUNKS = 12  # the tiny VAE reaches its fixed point at chunk 9


def _encoded_every_chunk(vae, image: torch.Tensor, chunk: int) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """The reference: each chunk encoded, no shortcut."""
    state = vae.new_stream_state()
    out = []
    for k in range(CHUNKS):
        frames = 4 * chunk - 3 if k == 0 else 4 * chunk
        video = torch.zeros(1, 3, frames, *image.shape[1:])
        if k == 0:
            video[0, :, 0] = image
        latent = vae.encode_stream(video, state)
        mask = torch.zeros(1, 4, chunk, *latent.shape[-2:])
        if k == 0:
            mask[:, :, 0] = 1.0
        out.append(torch.cat([mask, latent], dim=1))
    return out


@pytest.mark.heavy
def test_the_fixed_point_is_exact_and_lets_the_caches_go() -> None:
    vae = load_vae(TINY, CPU, None)
    rgb = np.random.default_rng(0).integers(0, 256, (TINY.height_px, TINY.width_px, 3), np.uint8)
    image = to_model_range(rgb)
    chunk = TINY.chunk_latent_frames
    with torch.no_grad():
        reference = _encoded_every_chunk(vae, image, chunk)
        stream = ImageConditionStream(vae, image, TINY, chunk)
        got = []
        reached = None
        skipped = 0
        for k in range(CHUNKS):
            got.append(stream.next_chunk())
            if stream.state is not None and stream.state.encoder_memo is not None:
                skipped = stream.state.encoder_memo.hits
            if stream.fixed_point and reached is None:
                reached = k
    assert all(torch.equal(a, b) for a, b in zip(got, reference, strict=True))
    assert skipped > 0, "no encoder layer was skipped before the fixed point"
    assert reached is not None and reached < CHUNKS - 1, "the stream never reached its fixed point"
    assert stream.state is None  # the encoder's caches and their snapshot are released
