"""The decode stage's parts: what a viewer's pacer gets, and in what pieces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.images import to_uint8_frames
from workers.models.presets import VAEConfig
from workers.models.vae import WanVAE
from workers.stages.decode import FIRST_PART_FRAMES, DecodeSession


@pytest.fixture(scope="module")
def vae() -> WanVAE:
    torch.manual_seed(0)
    return WanVAE(VAEConfig(base_dim=8)).eval()


@pytest.fixture(scope="module")
def chunks() -> list[torch.Tensor]:
    """Two chunks of 3 latent frames (32×32-pixel frames)."""
    latents = torch.randn(1, 16, 6, 4, 4, generator=torch.Generator().manual_seed(1))
    return [latents[:, :, :3], latents[:, :, 3:]]


def _decode(vae: WanVAE, chunks: list[torch.Tensor]) -> tuple[np.ndarray, list[list[tuple[int, bool]]]]:
    session = DecodeSession(vae)
    frames, parts = [], []
    for chunk in chunks:
        got = list(session.run_chunk_parts(chunk))
        parts.append([(f.shape[0], last) for f, last in got if f is not None])
        frames += [f for f, _ in got if f is not None]
    return np.concatenate(frames), parts


def test_a_later_chunks_first_frames_are_a_part_of_their_own(vae: WanVAE, chunks: list[torch.Tensor]) -> None:
    frames, parts = _decode(vae, chunks)
    # The stream's first latent frame (one video frame) goes with the next; a later chunk's first
    # latent frame comes in two parts.
    assert FIRST_PART_FRAMES == 2
    assert parts == [[(5, False), (4, True)], [(2, False), (2, False), (4, False), (4, True)]]
    with torch.inference_mode():
        one_pass = to_uint8_frames(vae.decode(torch.cat(chunks, dim=2))[0])
    # Float rounding apart from one pass over the whole stream: an 8-bit level at most.
    assert np.abs(frames.astype(np.int16) - one_pass.astype(np.int16)).max() <= 1
    # And bit for bit what any other decode of the same chunks gives (a recording's regeneration).
    again, _ = _decode(vae, chunks)
    assert np.array_equal(again, frames)


def test_the_first_frames_held_back_are_the_same_frames_in_fewer_parts(vae: WanVAE, chunks: list[torch.Tensor]) -> None:
    early, _ = _decode(vae, chunks)
    session = DecodeSession(vae)
    held = [list(session.run_chunk_parts(c, first_frames_early=False)) for c in chunks]
    assert [[f.shape[0] for f, _ in parts] for parts in held] == [[5, 4], [4, 4, 4]]  # type: ignore[union-attr]
    assert np.array_equal(np.concatenate([f for parts in held for f, _ in parts]), early)  # type: ignore[misc]
