"""The multi-rank test harness itself: ranks run, collectives work, failures surface."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.support.dist import run_ranks
from workers.parallel.group import StageGroup

pytestmark = pytest.mark.processes


def _sum_ranks(group: StageGroup) -> float:
    t = torch.tensor([float(group.rank + 1)])
    dist.all_reduce(t)
    return t.item()


def _fail_on_rank_one(group: StageGroup) -> int:
    assert group.rank != 1, "rank one refuses"
    return group.rank


def test_all_reduce_over_two_ranks() -> None:
    assert run_ranks(_sum_ranks, 2) == [3.0, 3.0]


def test_rank_failure_is_reported() -> None:
    with pytest.raises(AssertionError, match="rank one refuses"):
        run_ranks(_fail_on_rank_one, 2, timeout_s=60)
