"""Chunk geometry of the Wan causal VAE, in video frames (no torch here: the server, the runtime and
clients share it).

The VAE's time stride is 4 and its first latent frame stands for a single video frame, so a chunk of
C latent frames decodes to 4C video frames, except the session's first chunk, which decodes to 4C − 3.
"""

from __future__ import annotations

VAE_TIME_STRIDE = 4


def video_frames(chunk_latent_frames: int, first_chunk: bool) -> int:
    """Video frames a chunk of C latent frames decodes to: 4C, or 4C − 3 for the session's first."""
    full = VAE_TIME_STRIDE * chunk_latent_frames
    return full - (VAE_TIME_STRIDE - 1) if first_chunk else full


def chunk_num_frames(chunk_index: int, chunk_latent_frames: int) -> int:
    """Video frames in chunk `chunk_index` of a session."""
    return video_frames(chunk_latent_frames, first_chunk=chunk_index == 0)


def chunk_first_frame(chunk_index: int, chunk_latent_frames: int) -> int:
    """Index, in the session's video, of chunk `chunk_index`'s first frame."""
    if chunk_index == 0:
        return 0
    return chunk_num_frames(0, chunk_latent_frames) + (chunk_index - 1) * chunk_num_frames(1, chunk_latent_frames)


def latent_span_frames(lo: int, hi: int, first_chunk: bool) -> int:
    """Video frames decoded from latent frames [lo, hi) of a chunk (the session's very first latent
    frame, frame 0 of the first chunk, is a single video frame)."""
    frames = VAE_TIME_STRIDE * (hi - lo)
    return frames - (VAE_TIME_STRIDE - 1) if first_chunk and lo == 0 and hi > 0 else frames
