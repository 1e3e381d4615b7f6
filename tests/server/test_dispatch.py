"""The dispatch controller on a fake clock: a simulated pipeline (one DiT, one decode, a pacer per viewer)
runs it for a minute of media time in milliseconds. Steady, slowing, recovering, overloaded, two viewers,
and the chunk-synchronous baseline beside JIT."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from server.__main__ import parse_args
from server.common.settings import Settings
from server.wire.dispatch import (
    Blocked,
    DispatchConfig,
    DispatchController,
    DispatchPolicy,
    StartLater,
    StartNow,
)
from workers.chunk_geometry import chunk_num_frames, latent_span_frames
from workers.stages.decode import part_bounds

FPS = 16
C = 4  # latent frames per chunk: 16 video frames, 1 s
POLL_TICK_S = 0.05  # the engine's scheduler asks at least this often (LOOP_TICK_S)
MARGIN_S = DispatchConfig(DispatchPolicy.JIT, FPS, C).margin_s
StageTime = Callable[[float], float]  # start time -> seconds the stage takes


def fixed(seconds: float) -> StageTime:
    return lambda t: seconds


def step(before: float, after: float, at_s: float) -> StageTime:
    return lambda t: before if t < at_s else after


@dataclass
class Viewer:
    """A session: its controller and a pacer model (one frame per tick, repeats when starved)."""

    controller: DispatchController
    next_chunk: int = 0
    queue: deque[int] = field(default_factory=deque)  # chunk index per queued frame
    next_tick_t: float | None = None
    repeats_after_first_chunk: int = 0
    unique: int = 0
    started_t: dict[int, float] = field(default_factory=dict)
    shown_t: dict[int, float] = field(default_factory=dict)  # chunk -> its first frame on screen
    first_chunk_done: bool = False

    def push(self, chunk: int, num_frames: int, now: float) -> None:
        self.queue.extend([chunk] * num_frames)
        if self.next_tick_t is None:
            self.next_tick_t = now  # the first frame goes out at once
        playout_end = max(self.next_tick_t, now) + len(self.queue) / FPS
        self.controller.pushed(chunk, num_frames, now, playout_end)

    def tick(self) -> None:
        assert self.next_tick_t is not None
        if self.queue:
            chunk = self.queue.popleft()
            self.shown_t.setdefault(chunk, self.next_tick_t)
            self.unique += 1
            if chunk > 0:
                self.first_chunk_done = True
        elif self.first_chunk_done or self.unique >= chunk_num_frames(0, C):
            self.repeats_after_first_chunk += 1
        self.next_tick_t += 1 / FPS


@dataclass
class Result:
    viewers: list[Viewer]
    dit_busy_s: float
    steady_s: float

    @property
    def dit_idle_fraction(self) -> float:
        return 1 - self.dit_busy_s / self.steady_s

    def start_to_screen_s(self, v: int, from_chunk: int = 3) -> list[float]:
        viewer = self.viewers[v]
        return [viewer.shown_t[k] - viewer.started_t[k] for k in viewer.shown_t if k >= from_chunk]

    def start_periods_s(self, v: int, from_chunk: int = 3) -> list[float]:
        starts = [t for k, t in sorted(self.viewers[v].started_t.items()) if k >= from_chunk]
        return [b - a for a, b in itertools.pairwise(starts)]


def simulate(
    dit: StageTime,
    decode: StageTime,
    policy: DispatchPolicy = DispatchPolicy.JIT,
    viewers: int = 1,
    duration_s: float = 60.0,
    handoff_s: float = 0.01,
    join_s: float = 0.3,
) -> Result:
    """Event-driven: one DiT serving viewers round robin (asked when free, at Hold deadlines and every
    POLL_TICK_S, as the engine does), one FIFO decode handing on each latent frame's frames as it
    decodes them (as workers/stages/decode.py does), a pacer per viewer. Viewer i joins at i·join_s."""
    vs = [Viewer(DispatchController(DispatchConfig(policy, FPS, C))) for _ in range(viewers)]
    events: list[tuple[float, int, str, int, int, int]] = []  # (t, seq, kind, viewer, chunk, frames)
    seq = itertools.count()

    def at(t: float, kind: str, viewer: int = -1, chunk: int = -1, frames: int = 0) -> None:
        heapq.heappush(events, (t, next(seq), kind, viewer, chunk, frames))

    for i in range(viewers):
        at(i * join_s, "poll")
    at(0.0, "tick-poll")
    dit_free_t = decode_free_t = 0.0
    dit_busy_s = 0.0
    steady_from = None
    rr = 0
    now = 0.0
    while events:
        now, _, kind, v, chunk, frames = heapq.heappop(events)
        if now > duration_s:
            break
        if kind == "tick":
            vs[v].tick()
            at(vs[v].next_tick_t, "tick", v)  # type: ignore[arg-type]
            continue
        if kind == "dit-done":
            start = max(now, decode_free_t)
            took = decode(start)
            decode_free_t = start + took
            for lo, hi in part_bounds(C, first_in_stream=chunk == 0):
                n = latent_span_frames(lo, hi, first_chunk=chunk == 0)
                at(start + took * hi / C + handoff_s, "arrive", v, chunk, n)
        elif kind == "arrive":
            first_push = vs[v].next_tick_t is None
            vs[v].push(chunk, frames, now)
            if first_push:
                at(now, "tick", v)
            if steady_from is None and chunk >= 1:
                steady_from = now
        elif kind == "tick-poll":
            at(now + POLL_TICK_S, "tick-poll")
        # The scheduler's pass: if the DiT is free, offer it to the viewers round robin.
        if now < dit_free_t:
            continue
        joined = [i for i in range(viewers) if now >= i * join_s]
        for j in range(len(joined)):
            i = joined[(rr + j) % len(joined)]
            viewer = vs[i]
            verdict = viewer.controller.poll(viewer.next_chunk, now)
            if isinstance(verdict, StartLater):
                at(now + verdict.delay_s, "poll")
            elif isinstance(verdict, StartNow):
                viewer.started_t[viewer.next_chunk] = now
                took = dit(now)
                dit_free_t = now + took
                if steady_from is not None:
                    dit_busy_s += took
                at(dit_free_t, "dit-done", i, viewer.next_chunk)
                viewer.next_chunk += 1
                rr = (rr + j + 1) % len(joined)
                break
            else:
                assert isinstance(verdict, Blocked)
    assert steady_from is not None
    return Result(vs, dit_busy_s, now - steady_from)


def test_steady_jit_overlaps_dit_and_decode_and_never_starves() -> None:
    r = simulate(fixed(0.8), fixed(0.5))
    v = r.viewers[0]
    assert v.repeats_after_first_chunk == 0
    assert v.unique >= 0.99 * FPS * 58
    assert r.dit_idle_fraction <= 0.25  # the DiT works 0.8 of every 1 s chunk
    # A chunk's first frame is on screen DiT + a quarter of the decode (its first part) + hand-off +
    # the margin after it starts.
    assert max(r.start_to_screen_s(0)) <= 0.8 + 0.5 / 4 + 0.01 + MARGIN_S + 2 / FPS
    periods = r.start_periods_s(0)
    assert sum(periods) / len(periods) == pytest.approx(1.0, abs=0.01)  # one chunk per second of media


def test_chunk_synchronous_baseline_repeats_what_jit_does_not() -> None:
    baseline = simulate(fixed(0.8), fixed(0.5), DispatchPolicy.CHUNK_SYNCHRONOUS)
    v = baseline.viewers[0]
    # The next chunk waits for the previous one's decode: period DiT + decode > 1 s of media.
    assert v.repeats_after_first_chunk > 0.15 * (v.unique + v.repeats_after_first_chunk)
    assert baseline.dit_idle_fraction > 0.3


def test_a_fast_model_starts_late_for_low_latency() -> None:
    """Like gridworld on a CPU (DiT 0.15 s, decode 0.45 s): chunks start when they must, not early."""
    r = simulate(fixed(0.15), fixed(0.45))
    assert r.viewers[0].repeats_after_first_chunk == 0
    assert max(r.start_to_screen_s(0)) <= 0.15 + 0.45 / 4 + 0.01 + MARGIN_S + 2 / FPS


def test_slowing_stages_are_caught_within_a_chunk() -> None:
    r = simulate(step(0.5, 0.85, at_s=20.0), fixed(0.3))
    v = r.viewers[0]
    # At most the chunk in flight when the DiT slowed arrives late, by the slow-down (0.35 s).
    assert v.repeats_after_first_chunk <= 0.35 * FPS + 1
    late = [k for k in v.shown_t if k > 0 and v.shown_t[k] - v.started_t[k] > 0.85 + 0.3 / 4 + 0.2]
    assert all(20.0 - 1.5 < v.started_t[k] < 20.0 + 1.0 for k in late), late


def test_recovering_stages_bring_latency_back_down() -> None:
    r = simulate(step(0.85, 0.3, at_s=20.0), fixed(0.3))
    v = r.viewers[0]
    # Only at start-up: chunk 1 cannot enter the DiT before chunk 0 leaves it, and 2 × 0.85 + 0.3 s
    # is a little more than chunk 0's latency plus its 13 frames.
    assert v.repeats_after_first_chunk <= 1
    after = [v.shown_t[k] - v.started_t[k] for k in v.shown_t if v.started_t[k] > 20.0 + 10.0]
    assert after and max(after) <= 0.3 + 0.3 / 4 + 0.01 + MARGIN_S + 2 / FPS  # forgotten after 8 chunks


def test_overload_degrades_steadily_instead_of_oscillating() -> None:
    r = simulate(fixed(1.2), fixed(0.5))
    periods = r.start_periods_s(0)
    assert min(periods) == pytest.approx(1.2, abs=0.06) and max(periods) == pytest.approx(1.2, abs=0.06)
    assert r.dit_idle_fraction < 0.05  # the DiT never waits for this viewer
    v = r.viewers[0]
    assert v.unique / (v.unique + v.repeats_after_first_chunk) == pytest.approx(1 / 1.2, abs=0.03)


def test_two_viewers_share_the_engine_without_starving() -> None:
    r = simulate(fixed(0.4), fixed(0.3), viewers=2)
    for v in r.viewers:
        assert v.repeats_after_first_chunk <= 0.02 * (v.unique + v.repeats_after_first_chunk), v
        assert v.unique >= 0.98 * FPS * 55


def test_at_most_two_chunks_in_flight_and_verdicts() -> None:
    c = DispatchController(DispatchConfig(DispatchPolicy.JIT, FPS, C))
    assert isinstance(c.poll(0, 0.0), StartNow)
    assert isinstance(c.poll(1, 0.1), StartNow)  # nothing measured yet: start as soon as allowed
    blocked = c.poll(2, 0.2)
    assert isinstance(blocked, Blocked) and "2 chunks in flight" in blocked.reason
    c.pushed(0, 13, 1.0, playout_end_t=1.0 + 13 / FPS)
    later = c.poll(2, 1.0)
    # Chunk 1 (16 frames) plays after chunk 0's 13: chunk 2 is needed at 1.0 + 29/16 and takes ~1 s.
    assert isinstance(later, StartLater)
    assert later.delay_s == pytest.approx(29 / FPS - 1.0 - MARGIN_S, abs=1e-9)
    stats = c.stats(1.0)
    assert stats.chunks_in_flight == 1 and stats.buffered_s == pytest.approx(13 / FPS)
    assert stats.latency_s == pytest.approx(1.0) and stats.predicted_start_to_display_s == pytest.approx(1 + MARGIN_S)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="fps"):
        DispatchConfig(DispatchPolicy.JIT, 0, C)
    with pytest.raises(ValueError, match="margin_s"):
        DispatchConfig(DispatchPolicy.JIT, FPS, C, margin_s=-1)
    with pytest.raises(ValueError, match="max_chunks_in_flight"):
        DispatchConfig(DispatchPolicy.JIT, FPS, C, max_chunks_in_flight=0)


def test_the_jit_margin_is_a_server_setting_in_milliseconds() -> None:
    overrides = parse_args(["gridworld", "--dispatch-margin-ms", "40"])
    settings = Settings(**{k: v for k, v in overrides.items() if not k.startswith("_")})
    assert settings.dispatch_margin_ms == 40 and Settings().dispatch_margin_ms == MARGIN_S * 1000
    with pytest.raises(ValidationError):
        Settings(dispatch_margin_ms=-1)
