"""The reliability suite's rows (benchmarks/reliability), one test each, at the short size: the same
real servers, worker processes and aiortc peers as `python -m benchmarks.reliability`, with fewer
messages, cycles and seconds. The rows that stream for a quarter of a minute or more at the short
size are marked `long` (CI runs them after `make test`: `make test-long`); the full-size fuzz and
soak run on purpose: `pytest -m slow`.

A failing row prints its checks (each figure and its bound) and where the servers' logs are.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.reliability import cases  # noqa: F401  (registers the rows)
from benchmarks.reliability.harness import CASES, Lab, Size, run_case

pytestmark = pytest.mark.processes

# Rows whose short size takes 11 s or more on two cores (streams, waits, servers of their own).
LONG_ROWS = frozenset(
    {2, 4, 5, 7, 8, 9, 10, 12, 13, 14, 15, 16, 20, 21, 22, 23, 24, 27, 28, 29, 30, 31, 33, 34, 35, 36, 37, 38, 39, 40}
)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = Lab(Size.SHORT, tmp_path_factory.mktemp("reliability-logs"))
    try:
        yield lab
    finally:
        lab.close()


def _check(number: int, lab: Lab) -> None:
    result = run_case(CASES[number], lab)
    assert result.checks or result.error, "a row must check something"
    assert result.passed, f"{result.report()}\nserver logs: {lab.log_dir}"


ROWS = range(1, 41)


def test_every_row_of_the_table_has_a_case() -> None:
    assert sorted(CASES) == list(ROWS)


def _row(n: int) -> object:
    return pytest.param(n, marks=pytest.mark.long) if n in LONG_ROWS else n


@pytest.mark.parametrize("number", [_row(n) for n in ROWS])
def test_row(number: int, lab: Lab) -> None:
    _check(number, lab)


@pytest.mark.slow
@pytest.mark.parametrize("number", [4, 5, 21])
def test_row_at_full_size(number: int, tmp_path: Path) -> None:
    lab = Lab(Size.FULL, tmp_path)
    try:
        _check(number, lab)
    finally:
        lab.close()
