"""Every parity case runs in float32 on one intra-op thread (docs/correctness.md); each test
module marks itself `parity` (`make test-parity`)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from workers.determinism import intra_op_threads


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with intra_op_threads(1):
        yield


@pytest.fixture(autouse=True)
def _quiet_reference_autocast() -> Iterator[None]:
    # The references open `torch.amp.autocast("cuda", …)` regions, which warn once per call on a
    # machine without CUDA and are no-ops there; the comparison is float32 either way.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="CUDA is not available", category=UserWarning)
        yield
