"""Every parity case runs in float32 on one intra-op thread (README "Correctness"); each test
module marks itself `parity` (`make test-parity`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workers.determinism import intra_op_threads


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with intra_op_threads(1):
        yield
