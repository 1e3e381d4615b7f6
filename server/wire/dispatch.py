"""When a viewer's next chunk starts: a per-session dispatch policy, pure (clock readings in, verdicts out).

The engine asks a session whether its next chunk may enter the DiT whenever the DiT could take it;
the session asks this controller. Starting a chunk is also when its controls are sampled, so a chunk
that starts earlier than it must only adds glass-to-glass latency, and one that starts later makes
the pacer repeat frames.

Policies (`DispatchPolicy`):

- `jit` (default): start chunk k at the latest moment at which its first frame is still predicted to
  reach the pacer before the video already pushed or in flight runs out:

      start_t = need_t − (latency + lateness + margin_s)
      need_t  = max(playout_end_t, now) + frames in flight / fps

  `playout_end_t` is when the pacer will have played everything pushed so far (reported by the
  session at each push; a chunk's frames arrive in parts as they are decoded); the frames in flight
  are those of started chunks not pushed yet; `latency` is a high quantile of this session's measured
  start → first frames at the pacer over recent chunks (DiT, a wait for decode, the first part's
  decode, hand-off), raised at once when a chunk in flight has already taken longer; `lateness` is
  a high quantile of how late, past the start time it wanted, a chunk actually got the DiT (another
  viewer's chunk in the DiT, the scheduler's wake-up), so a shared engine is anticipated. At most
  `max_chunks_in_flight` (2) chunks are between DiT start and the pacer: chunk k+1 may be in the DiT
  while chunk k decodes. Before anything is measured, a chunk starts as soon as that limit allows.
  When the pipeline cannot keep up (its bottleneck exceeds a chunk's media time) need_t is always
  past: chunks start as soon as allowed, the DiT never waits for this viewer, and the session
  degrades steadily at the pipeline's own rate.
- `chunk-synchronous` (the A/B baseline): start only once the previous chunk is all in the pacer and
  less than one chunk of video is buffered for this viewer, so the chunk period is DiT + the whole
  decode + hand-off.

All times are in the caller's clock (seconds); the controller never reads a clock itself.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from workers.chunk_geometry import chunk_num_frames


class DispatchPolicy(StrEnum):
    JIT = "jit"
    CHUNK_SYNCHRONOUS = "chunk-synchronous"


@dataclass(frozen=True)
class DispatchConfig:
    policy: DispatchPolicy
    fps: int
    chunk_latent_frames: int
    margin_s: float = 0.1  # slack between a chunk's predicted arrival and the moment the pacer needs it
    latency_quantile: float = 0.9  # of the recent samples (with 8 samples: their maximum)
    history_chunks: int = 8  # samples kept per measure: a slow spell is forgotten after this many chunks
    max_chunks_in_flight: int = 2

    def __post_init__(self) -> None:
        if self.fps < 1 or self.chunk_latent_frames < 1:
            raise ValueError("fps and chunk_latent_frames must be at least 1")
        if self.margin_s < 0 or not 0 < self.latency_quantile <= 1 or self.history_chunks < 1:
            raise ValueError("margin_s must be >= 0, latency_quantile in (0, 1], history_chunks >= 1")
        if self.max_chunks_in_flight < 1:
            raise ValueError("max_chunks_in_flight must be at least 1")

    @property
    def chunk_media_s(self) -> float:
        return chunk_num_frames(1, self.chunk_latent_frames) / self.fps


@dataclass(frozen=True)
class StartNow:
    """Start the chunk now (the controller has counted it as started)."""


@dataclass(frozen=True)
class StartLater:
    """Not yet: ask again in `delay_s`."""

    delay_s: float


@dataclass(frozen=True)
class Blocked:
    """Not while `reason` holds (chunks in flight, or the baseline's full buffer); ask again on the next pass."""

    reason: str


Verdict = StartNow | StartLater | Blocked


@dataclass(frozen=True)
class DispatchStats:
    policy: str
    chunks_in_flight: int
    buffered_s: float  # video pushed to the pacer and not yet played
    latency_s: float | None  # predicted start → pacer, the quantile in use (None before a measurement)
    lateness_s: float  # predicted wait for the DiT past the wanted start
    measured_latency_p50_s: float | None  # start → pacer over recent chunks
    predicted_start_to_display_s: float | None  # latency + lateness + margin: a chunk's first frame on screen


def _high_quantile(samples: deque[float], q: float) -> float:
    """Nearest-rank quantile from above (q = 0.9 of 8 samples is their maximum)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class DispatchController:
    """One viewer's chunk dispatch (see the module docstring). Not thread-safe: the session locks it."""

    def __init__(self, config: DispatchConfig) -> None:
        self.config = config
        self._started_t: dict[int, float] = {}  # chunks between DiT start and the pacer -> start time
        self._unpushed: dict[int, int] = {}  # started chunks -> frames not yet pushed to the pacer
        # Chunks started before any measurement, as soon as allowed: at start-up chunk 1 queues behind
        # chunk 0's decode, a wait no timed chunk has, so its latency would only mislead.
        self._unmeasured: set[int] = set()
        self._planned_t: dict[int, float] = {}  # the start time a held chunk was last told to wait for
        self._latency: deque[float] = deque(maxlen=config.history_chunks)
        self._latency_by_chunk: dict[int, float] = {}
        self._lateness: deque[float] = deque(maxlen=config.history_chunks)
        self._playout_end_t: float | None = None  # None until the first push

    # ---- the engine's question ----

    def poll(self, chunk_index: int, now: float) -> Verdict:
        """May chunk `chunk_index` start now? On StartNow the chunk counts as started at `now`."""
        cfg = self.config
        if chunk_index > 0 and len(self._started_t) >= cfg.max_chunks_in_flight:
            return Blocked(f"{len(self._started_t)} chunks in flight")
        if chunk_index == 0:
            return self._start(chunk_index, now, None)
        if cfg.policy is DispatchPolicy.CHUNK_SYNCHRONOUS:
            if self._unpushed:
                return Blocked("the previous chunk is not all in the pacer yet")
            if self.buffered_s(now) * cfg.fps >= chunk_num_frames(chunk_index, cfg.chunk_latent_frames):
                return Blocked("a chunk of video is buffered")
            return self._start(chunk_index, now, None)
        start_t = self._jit_start_t(now)
        if start_t is None:
            self._unmeasured.add(chunk_index)
        if start_t is None or start_t <= now:
            return self._start(chunk_index, now, start_t)
        self._planned_t[chunk_index] = start_t
        return StartLater(start_t - now)

    # ---- what the session reports ----

    def pushed(self, chunk_index: int, num_frames: int, now: float, playout_end_t: float) -> None:
        """`num_frames` of chunk `chunk_index` reached the pacer at `now` (its first push: the chunk
        has arrived); the pacer will have played all it holds at `playout_end_t`."""
        self._playout_end_t = playout_end_t
        left = self._unpushed.pop(chunk_index, 0) - num_frames
        if left > 0:
            self._unpushed[chunk_index] = left
        started = self._started_t.pop(chunk_index, None)
        if started is not None:
            self._latency_by_chunk[chunk_index] = now - started
            self._latency_by_chunk.pop(chunk_index - self.config.history_chunks, None)
            if not (chunk_index in self._unmeasured and self._latency):
                self._latency.append(now - started)
        self._unmeasured.discard(chunk_index)

    def latency_of(self, chunk_index: int) -> float | None:
        """Chunk `chunk_index`'s measured start → pacer time (kept for the last few chunks)."""
        return self._latency_by_chunk.get(chunk_index)

    def buffered_s(self, now: float) -> float:
        return 0.0 if self._playout_end_t is None else max(0.0, self._playout_end_t - now)

    def stats(self, now: float) -> DispatchStats:
        latency = self._predicted_latency(now)
        lateness = self._predicted_lateness()
        return DispatchStats(
            policy=self.config.policy.value,
            chunks_in_flight=len(self._started_t),
            buffered_s=self.buffered_s(now),
            latency_s=latency,
            lateness_s=lateness,
            measured_latency_p50_s=sorted(self._latency)[len(self._latency) // 2] if self._latency else None,
            predicted_start_to_display_s=None if latency is None else latency + lateness + self.config.margin_s,
        )

    # ---- internals ----

    def _start(self, chunk_index: int, now: float, wanted_t: float | None) -> StartNow:
        planned = self._planned_t.pop(chunk_index, None)
        wanted = planned if planned is not None else wanted_t
        if wanted is not None and self.config.policy is DispatchPolicy.JIT:
            # Capped at a chunk's media time: an overloaded pipeline is always "late", and that must
            # not make the controller start chunks ever earlier once it recovers.
            self._lateness.append(min(max(0.0, now - wanted), self.config.chunk_media_s))
        self._started_t[chunk_index] = now
        self._unpushed[chunk_index] = chunk_num_frames(chunk_index, self.config.chunk_latent_frames)
        return StartNow()

    def _frames_in_flight(self) -> int:
        return sum(self._unpushed.values())

    def _predicted_latency(self, now: float) -> float | None:
        measured = _high_quantile(self._latency, self.config.latency_quantile) if self._latency else None
        # A chunk in flight that has already taken longer than that says the stages slowed down.
        overdue = max((now - t for t in self._started_t.values()), default=None)
        if measured is None:
            return None
        return measured if overdue is None else max(measured, overdue)

    def _predicted_lateness(self) -> float:
        return _high_quantile(self._lateness, self.config.latency_quantile) if self._lateness else 0.0

    def _jit_start_t(self, now: float) -> float | None:
        """The latest start that still meets the pacer; None while nothing has been measured."""
        latency = self._predicted_latency(now)
        if latency is None or self._playout_end_t is None:
            return None
        need_t = max(self._playout_end_t, now) + self._frames_in_flight() / self.config.fps
        return need_t - (latency + self._predicted_lateness() + self.config.margin_s)
