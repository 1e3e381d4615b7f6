"""Frames that say which frame they are, readable after lossy video coding.

The synthetic timing model's decode stage draws each frame's global index into the frame as a row
of black and white blocks (24 bits of index, then an 8-bit CRC), aligned to the codec's 16×16
macroblocks on wide frames (8×8 on narrow ones), over a background that scrolls with the index, so
the picture also visibly moves. A client reads the index back from the decoded luma plane: exact
uniqueness, order and repeats for every received frame, through H.264 or VP8 at ordinary bitrates.

    stamp_frames(frames, first_index)        # frames [T, H, W, 3] uint8, in place
    read_stamp(luma)                         # luma [H, W] uint8 (Y plane) or RGB [H, W, 3] -> int | None

numpy only: the server, the workers and clients all import it.
"""

from __future__ import annotations

import numpy as np

INDEX_BITS = 24
CRC_BITS = 8
NUM_BITS = INDEX_BITS + CRC_BITS
MAX_INDEX = (1 << INDEX_BITS) - 1  # 12 days of video at 16 FPS
BLACK, WHITE = 0, 255  # full contrast; decoded luma lands near 16 and 235
THRESHOLD = 125  # midway between video-range black (16) and white (235) luma
STRIPE_PERIOD_PX = 96


def _crc8(value: int) -> int:
    """CRC-8 (polynomial 0x07, initial value 0xFF, so all-black and all-white blocks are not valid stamps)."""
    crc = 0xFF
    for byte in value.to_bytes(3, "big"):
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _layout(height_px: int, width_px: int) -> tuple[int, int]:
    """(block side, blocks per row): 16 px blocks (one macroblock each) in as many rows as it takes,
    8 px blocks where those would not fit in the top half; ValueError if neither does."""
    for b in (16, 8):
        per_row = width_px // b
        if per_row and -(-NUM_BITS // per_row) * b <= height_px // 2:
            return b, per_row
    raise ValueError(f"a {width_px}x{height_px} frame is too small for a {NUM_BITS}-bit frame stamp")


def _bits(index: int) -> list[int]:
    word = (index << CRC_BITS) | _crc8(index)
    return [(word >> (NUM_BITS - 1 - i)) & 1 for i in range(NUM_BITS)]


def stamp_frames(frames: np.ndarray, first_index: int) -> None:
    """Draw frame indices first_index, first_index + 1, … into `frames` [T, H, W, 3] uint8 (in place)."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {tuple(frames.shape)}")
    t, h, w, _ = frames.shape
    if first_index < 0 or first_index + t - 1 > MAX_INDEX:
        raise ValueError(f"frame indices must lie in [0, {MAX_INDEX}]")
    b, per_row = _layout(h, w)
    # Background: diagonal mid-grey stripes that scroll 6 px per frame (cut from one wider pattern).
    stripes = (64 + (np.arange(w + STRIPE_PERIOD_PX)[None, :] + np.arange(h)[:, None]) % STRIPE_PERIOD_PX).astype(
        np.uint8
    )
    for i in range(t):
        index = first_index + i
        shift = (6 * index) % STRIPE_PERIOD_PX
        frames[i] = stripes[:, shift : shift + w, None]
        for bit_no, bit in enumerate(_bits(index)):
            r, c = divmod(bit_no, per_row)
            frames[i, r * b : (r + 1) * b, c * b : (c + 1) * b] = WHITE if bit else BLACK


def read_stamp(image: np.ndarray) -> int | None:
    """The index stamped into a decoded frame (its Y plane, or RGB), or None if there is no valid stamp."""
    luma = image.mean(axis=2) if image.ndim == 3 else image
    h, w = luma.shape
    try:
        b, per_row = _layout(h, w)
    except ValueError:
        return None
    q = b // 4  # sample each block's centre, away from edges the codec smears
    word = 0
    for bit_no in range(NUM_BITS):
        r, c = divmod(bit_no, per_row)
        centre = luma[r * b + q : (r + 1) * b - q, c * b + q : (c + 1) * b - q]
        word = (word << 1) | int(centre.mean() > THRESHOLD)
    index, crc = word >> CRC_BITS, word & ((1 << CRC_BITS) - 1)
    return index if _crc8(index) == crc else None
