"""Pacer schedule, starvation, stall and overflow policies, on a fake clock (no real sleeping)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from server.media.pacer import VIDEO_CLOCK_HZ, PacedFrame, Pacer, PacerClosed
from tests.support.clock import FakeClock

FPS = 16
DT = 1 / FPS


def chunk(first: int, n: int = 16, h: int = 4, w: int = 6) -> np.ndarray:
    """[n, h, w, 3] uint8 whose frame t is filled with (first + t) % 256, so frames are identifiable."""
    values = (np.arange(first, first + n) % 256).astype(np.uint8)
    return np.broadcast_to(values[:, None, None, None], (n, h, w, 3)).copy()


def make(clock: FakeClock, max_frames: int = 20, **kw) -> Pacer:
    return Pacer(FPS, max_frames, clock, sleep=clock.sleep, **kw)


async def pull(p: Pacer, n: int) -> list[PacedFrame]:
    return [await p.wait_next() for _ in range(n)]


async def test_steady_output_at_fps_when_fed_faster_than_real_time() -> None:
    clock = FakeClock()
    p = make(clock)
    p.push(chunk(0), chunk_index=0, first_frame_index=0)
    out: list[PacedFrame] = []
    next_chunk = 1
    while len(out) < 64:
        if p.depth <= 3:  # the engine is ahead of playback: the next chunk lands well before it is needed
            p.push(chunk(16 * next_chunk), chunk_index=next_chunk, first_frame_index=16 * next_chunk)
            next_chunk += 1
        out.append(await p.wait_next())

    t0 = out[0].due_s
    assert t0 == 100.0  # anchored when the first frame went out
    for n, f in enumerate(out):
        assert f.due_s == pytest.approx(t0 + n * DT, abs=1e-9)
        assert f.emit_s == pytest.approx(f.due_s, abs=1e-9)
        assert f.pts == n * (VIDEO_CLOCK_HZ // FPS)
        assert f.frame_index == n and not f.repeated
        assert f.chunk_index == n // 16
        assert int(f.frame[0, 0, 0]) == n % 256
    assert np.diff([f.pts for f in out]).tolist() == [5625] * 63
    assert p.stats().sent == 64
    assert (p.dropped, p.repeated, p.reanchors) == (0, 0, 0)
    assert p.max_depth_seen <= 20


async def test_repeats_last_frame_when_starved_and_keeps_the_clock() -> None:
    clock = FakeClock()
    p = make(clock)
    p.push(chunk(0, n=4), chunk_index=0, first_frame_index=0)
    out = await pull(p, 10)

    assert [f.frame_index for f in out] == [0, 1, 2, 3] + [None] * 6
    assert [f.repeated for f in out] == [False] * 4 + [True] * 6
    assert all(f.frame is out[3].frame and f.chunk_index == 0 for f in out[4:])  # the last frame, no copy
    assert p.repeated == 6 and p.sent == 10
    assert np.diff([f.due_s for f in out]) == pytest.approx([DT] * 9)
    assert np.diff([f.pts for f in out]).tolist() == [5625] * 9

    # The next chunk continues on the same clock: no re-anchor, no catch-up burst.
    p.push(chunk(4, n=4), chunk_index=1, first_frame_index=4)
    more = await pull(p, 4)
    assert [f.frame_index for f in more] == [4, 5, 6, 7]
    assert more[0].due_s == pytest.approx(out[0].due_s + 10 * DT)
    assert np.diff([f.emit_s for f in out + more]) == pytest.approx([DT] * 13)
    assert p.reanchors == 0


async def test_engine_stall_of_3s_is_covered_by_repeats_then_resumes_at_fps() -> None:
    clock = FakeClock()
    p = make(clock)
    p.push(chunk(0), chunk_index=0, first_frame_index=0)
    first = await pull(p, 16)
    stall_ticks = 3 * FPS
    stalled = await pull(p, stall_ticks)  # the engine delivers nothing for 3 s
    assert all(f.repeated for f in stalled) and p.repeated == stall_ticks
    p.push(chunk(16), chunk_index=1, first_frame_index=16)
    resumed = await pull(p, 8)
    assert [f.frame_index for f in resumed] == list(range(16, 24))
    emits = [f.emit_s for f in first + stalled + resumed]
    assert np.diff(emits) == pytest.approx([DT] * (len(emits) - 1))


async def test_consumer_stall_reanchors_instead_of_bursting() -> None:
    clock = FakeClock()
    p = make(clock)
    p.push(chunk(0), chunk_index=0, first_frame_index=0)
    before = await pull(p, 3)
    clock.t += 3.0  # nobody pulled for 3 s (loop or RTP sender stalled)
    p.push(chunk(16), chunk_index=1, first_frame_index=16)
    after = await pull(p, 8)

    assert p.reanchors == 1
    assert after[0].emit_s == pytest.approx(before[-1].emit_s + 3.0)  # served at once, re-anchored there
    assert after[0].due_s == after[0].emit_s
    # No burst: 48 ticks were "missed" but the next frames are still 1/fps apart.
    assert np.diff([f.emit_s for f in after]) == pytest.approx([DT] * 7)
    assert np.diff([f.pts for f in before + after]).tolist() == [5625] * 10
    # The backlog was bounded by drop-oldest, and what is left comes out in order.
    assert p.dropped == 16 + 16 - 3 - 20
    assert [f.frame_index for f in after] == list(range(12, 20))


async def test_small_lateness_is_caught_up_without_reanchor() -> None:
    clock = FakeClock()
    p = make(clock)
    p.push(chunk(0), chunk_index=0, first_frame_index=0)
    await pull(p, 2)
    clock.t += 2.5 * DT  # a hiccup: ticks 2 and 3 are overdue by 1.5 and 0.5 intervals (< max_lateness_frames=2)
    late = await pull(p, 3)
    assert p.reanchors == 0
    assert late[0].emit_s > late[0].due_s and late[1].emit_s == late[0].emit_s  # two overdue ticks served at once
    assert late[2].emit_s == pytest.approx(late[2].due_s)  # back on the original schedule
    assert late[2].due_s == pytest.approx(100.0 + 4 * DT)


def test_bounded_depth_drops_oldest() -> None:
    clock = FakeClock()
    p = make(clock, max_frames=20)
    p.push(chunk(0), chunk_index=0, first_frame_index=0)
    p.push(chunk(16), chunk_index=1, first_frame_index=16)
    assert (p.depth, p.dropped, p.max_depth_seen) == (20, 12, 20)
    first = p.next_frame()
    assert first is not None and first.frame_index == 12 and first.chunk_index == 0

    q = make(FakeClock(), max_frames=16)
    q.push(chunk(0, n=40), chunk_index=0, first_frame_index=0)  # one push bigger than the bound
    assert (q.depth, q.dropped) == (16, 24)
    assert [q.next_frame().frame_index for _ in range(3)] == [24, 25, 26]  # type: ignore[union-attr]


async def test_nothing_before_first_frame_then_anchor_on_arrival() -> None:
    clock = FakeClock()
    p = make(clock)
    assert p.next_frame() is None and p.next_due_s is None and not p.started
    waiter = asyncio.create_task(p.wait_next())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()
    clock.t += 7.0
    p.push(chunk(0, n=2), chunk_index=0, first_frame_index=0)
    f = await asyncio.wait_for(waiter, 1.0)
    assert (f.frame_index, f.pts, f.emit_s, f.due_s) == (0, 0, 107.0, 107.0)
    assert p.started and p.next_due_s == pytest.approx(107.0 + DT) and p.reanchors == 0


async def test_a_start_of_start_frames_waits_for_them_then_plays_without_a_repeat() -> None:
    clock = FakeClock()
    p = make(clock, start_frames=5, start_wait_s=1.0)
    p.push(chunk(0, n=1), chunk_index=0, first_frame_index=0)  # a first chunk of one frame
    waiter = asyncio.create_task(p.wait_next())
    while clock.t < 100.3:  # the second chunk computes for 0.3 s; the start waits for it
        await asyncio.sleep(0)
        assert not waiter.done()
    p.push(chunk(1, n=4), chunk_index=1, first_frame_index=1)
    first = await asyncio.wait_for(waiter, 1.0)
    out = [first, *await pull(p, 4)]
    assert [f.frame_index for f in out] == [0, 1, 2, 3, 4] and p.repeated == 0
    assert 100.3 <= first.due_s < 100.3 + 0.01  # anchored when it went out, within one poll of the push


async def test_a_start_waits_at_most_start_wait_s() -> None:
    clock = FakeClock()
    p = make(clock, start_frames=5, start_wait_s=0.5)
    p.push(chunk(0, n=1), chunk_index=0, first_frame_index=0)
    first = await p.wait_next()  # nothing else comes: the lone frame goes out after the wait
    assert first.frame_index == 0 and 100.5 <= first.emit_s < 100.51
    assert (await p.wait_next()).repeated  # from then on the clock runs as ever
    with pytest.raises(ValueError, match="start_frames"):
        make(clock, start_frames=21)  # more than the queue holds


async def test_on_emit_reports_generated_frames_only() -> None:
    clock = FakeClock()
    emitted: list[tuple[int, int, float]] = []
    p = make(clock, on_emit=lambda c, i, t: emitted.append((c, i, t)))
    p.push(chunk(0, n=2), chunk_index=0, first_frame_index=0)
    await pull(p, 3)  # 2 generated + 1 repeat
    p.push(chunk(2, n=2), chunk_index=1, first_frame_index=2)
    await pull(p, 1)
    assert emitted == [(0, 0, 100.0), (0, 1, 100.0 + DT), (1, 2, pytest.approx(100.0 + 3 * DT))]


async def test_history_keeps_the_buffer_level_and_repeats_of_the_last_ticks() -> None:
    clock = FakeClock()
    p = make(clock, history_frames=10)
    assert not make(clock).history.maxlen  # off unless asked for
    p.push(chunk(0, n=4), chunk_index=0, first_frame_index=0)
    out = await pull(p, 6)  # 4 frames, then 2 repeats
    assert [(t, depth, rep) for t, depth, rep in p.history] == [
        (f.emit_s, max(0, 3 - n), f.repeated) for n, f in enumerate(out)
    ]
    assert [rep for _, _, rep in p.history] == [False] * 4 + [True] * 2
    await pull(p, 10)
    assert len(p.history) == 10  # bounded: the oldest ticks go


async def test_close_wakes_waiters_and_ignores_late_chunks() -> None:
    clock = FakeClock()
    p = make(clock)
    waiter = asyncio.create_task(p.wait_next())
    await asyncio.sleep(0)
    p.close()
    with pytest.raises(PacerClosed):
        await asyncio.wait_for(waiter, 1.0)
    p.push(chunk(0), chunk_index=0, first_frame_index=0)
    assert p.depth == 0
    p.close()  # idempotent
    with pytest.raises(PacerClosed):
        await p.wait_next()


def test_validation_and_pts_step() -> None:
    with pytest.raises(ValueError, match="divides 90000"):
        Pacer(7, 16)
    with pytest.raises(ValueError, match="max_frames"):
        Pacer(16, 0)
    p = Pacer(30, 16)
    assert p.pts_step == 3000
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 3\]"):
        p.push(np.zeros((2, 4, 4, 3), np.float32), 0, 0)
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 3\]"):
        p.push(np.zeros((4, 4, 3), np.uint8), 0, 0)


async def test_real_clock_smoke() -> None:
    """The default clock and asyncio.sleep drive the schedule (the only real sleep: ~0.2 s).

    Only the lower bound is a property: ticks can be late on a loaded machine, never early.
    """
    p = Pacer(50, 20)
    p.push(chunk(0, n=11), chunk_index=0, first_frame_index=0)
    start = time.monotonic()
    out = await pull(p, 11)
    assert time.monotonic() - start >= 10 / 50 - 1e-3
    assert [f.pts for f in out] == [i * 1800 for i in range(11)]
    assert all(f.emit_s >= f.due_s - 1e-3 for f in out)  # asyncio may wake within its clock resolution
