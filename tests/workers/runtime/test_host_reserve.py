"""A CPU stage's host memory for its next snapshot: ready before it is asked for, grown to the
largest state seen, and never handed out twice."""

from __future__ import annotations

import time

import torch

from workers.runtime.host_reserve import HostReserve

WAIT_S = 10.0


def _ready(reserve: HostReserve, nbytes: int) -> torch.Tensor:
    """The buffer the reserve's thread has made, once it holds at least `nbytes` (bounded wait)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready = reserve._ready  # test-only peek at the thread's result
        if ready is not None and ready.numel() >= nbytes:
            return ready
        time.sleep(0.01)
    raise AssertionError(f"no ready buffer of {nbytes} bytes within {WAIT_S} s")


def test_a_capture_takes_the_buffer_made_ahead_and_the_next_is_made() -> None:
    reserve = HostReserve()
    reserve.expect(1 << 20)
    made = _ready(reserve, 1 << 20)
    assert int(made.sum()) == 0  # touched: every byte written
    taken = reserve.take(1000)
    assert taken.data_ptr() == made.data_ptr()
    again = _ready(reserve, 1 << 20)
    assert again.data_ptr() != taken.data_ptr()  # a new buffer, not the one in use


def test_a_larger_capture_gets_fresh_memory_and_the_reserve_grows() -> None:
    reserve = HostReserve()
    reserve.expect(1000)
    small = _ready(reserve, 1000)
    big = reserve.take(4096)
    assert big.numel() >= 4096 and big.data_ptr() != small.data_ptr()
    assert _ready(reserve, 4096).numel() == 4096
    reserve.expect(100)  # a smaller session does not shrink it
    assert reserve.take(4096).numel() == 4096
