"""RepeatMemo (workers/models/repeat_memo.py): a layer whose inputs repeat bit for bit returns its kept
output without running; anything else runs; the kept tensors stay within the budget; a snapshot of a
stream does not carry them."""

from __future__ import annotations

import pickle

import torch

from workers.models.repeat_memo import RepeatMemo


class CountingLayer:
    """Test double for a layer: doubles its input and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 2


def test_an_equal_input_returns_the_kept_output_and_anything_else_runs() -> None:
    memo, layer = RepeatMemo(max_bytes=1 << 20), CountingLayer()
    first = memo.run(1, (torch.ones(4), torch.zeros(2)), lambda: layer(torch.ones(4)))
    again = memo.run(1, (torch.ones(4), torch.zeros(2)), lambda: layer(torch.ones(4)))  # equal, not the same objects
    assert again is first and layer.calls == 1 and (memo.hits, memo.misses) == (1, 1)
    other_cache = memo.run(1, (torch.ones(4), torch.ones(2)), lambda: layer(torch.ones(4)))
    assert other_cache is not first and layer.calls == 2  # one differing input is enough to run
    memo.run(2, (torch.ones(4), torch.ones(2)), lambda: layer(torch.ones(4)))
    assert layer.calls == 3  # keys are separate layers


def test_past_its_budget_a_call_is_not_kept_and_runs_every_time() -> None:
    x = torch.ones(1000)  # 4000 bytes; a call keeps its input and its output
    memo, layer = RepeatMemo(max_bytes=10_000), CountingLayer()
    for _ in range(3):
        memo.run(1, (x,), lambda: layer(x))
        memo.run(2, (x,), lambda: layer(x))  # 8000 more bytes: over the budget beside key 1's
    assert layer.calls == 1 + 3 and memo.hits == 2
    assert sum(t.numel() * t.element_size() for t in memo.kept()) <= 10_000


def test_a_pickled_memo_keeps_its_budget_and_none_of_its_tensors() -> None:
    memo = RepeatMemo(max_bytes=1 << 20)
    memo.run(1, (torch.ones(4),), lambda: torch.ones(4))
    restored = pickle.loads(pickle.dumps(memo))
    assert restored.max_bytes == 1 << 20 and restored.kept() == []
