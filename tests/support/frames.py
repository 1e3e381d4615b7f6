"""Frame comparison under the determinism contract (workers/determinism.py): exact, or FRAME_TOLERANCE."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from workers.determinism import FRAME_TOLERANCE, frame_difference


def assert_frames_equal(expected: Sequence[np.ndarray], got: Sequence[np.ndarray], what: str = "frames") -> None:
    """Bit-exact, chunk by chunk: the contract's promise at equal thread counts."""
    assert len(expected) == len(got), f"{what}: {len(got)} chunks, expected {len(expected)}"
    for k, (a, b) in enumerate(zip(expected, got, strict=True)):
        diff = frame_difference(a, b)
        assert diff.exact, f"{what}: chunk {k} differs ({diff})"


def assert_frames_close(expected: Sequence[np.ndarray], got: Sequence[np.ndarray], what: str = "frames") -> None:
    """Within FRAME_TOLERANCE, chunk by chunk: where the contract does not promise bits."""
    assert len(expected) == len(got), f"{what}: {len(got)} chunks, expected {len(expected)}"
    for k, (a, b) in enumerate(zip(expected, got, strict=True)):
        diff = frame_difference(a, b)
        assert diff.within(FRAME_TOLERANCE), f"{what}: chunk {k} is outside {FRAME_TOLERANCE} ({diff})"
