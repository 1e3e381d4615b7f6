"""A session's control source: what the engine's scheduler reads when the DiT could start this viewer's
next chunk, and what the driver's controls fold into until then.

    driver's control messages ──apply (loop)──▶ held controls ──sample (scheduler thread)──▶ chunk
    pacer pushes (loop) ──pushed──▶ dispatch controller ──poll (scheduler thread)──▶ now / later / not yet

The dispatch controller (`server/wire/dispatch.py`) decides when a chunk starts; a chunk that starts takes
the controls held at that moment (`ControlState.sample` consumes look deltas and the pose reset),
and the recording is told which control each chunk took. The loop and the scheduler thread meet
here only, under one lock held for a few dictionary operations.

It also remembers when each control arrived (the last PENDING_CONTROLS, oldest dropped), so that the
media line can measure control-to-frame latency from a control's arrival to the first frame of the
first chunk that applied it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from server.wire.dispatch import DispatchConfig, DispatchController, DispatchStats, StartLater, StartNow
from workers.controls import ChunkControl, ControlMessage, ControlState
from workers.runtime.scheduled_session import Hold

PENDING_CONTROLS = 512  # control arrival times kept for control-to-frame latency (oldest dropped)

# Told, on the scheduler thread, which control a chunk took and whether it reset the pose.
ControlTaken = Callable[[int, ChunkControl, bool], None]


class ControlSource:
    def __init__(self, config: DispatchConfig, on_taken: ControlTaken) -> None:
        self._lock = threading.Lock()
        self._held = ControlState()
        self._dispatch = DispatchController(config)
        self._on_taken = on_taken
        self._arrivals: deque[tuple[int, float]] = deque(maxlen=PENDING_CONTROLS)  # (seq, arrival)
        self.last_control_t = time.monotonic()  # idle time counts from the session's create

    @property
    def config(self) -> DispatchConfig:
        return self._dispatch.config

    def apply(self, msg: ControlMessage, now: float) -> None:
        """A driver's control (loop thread), validated by the protocol's parser."""
        self.last_control_t = now
        with self._lock:
            self._held.apply(msg)
        if msg.seq is not None:
            self._arrivals.append((msg.seq, now))

    def sample(self, chunk_index: int) -> tuple[ChunkControl, bool] | Hold | None:
        """The engine's question (scheduler thread): the control to start `chunk_index` with now, a
        `Hold` to ask again after, or None to ask on the scheduler's next pass."""
        with self._lock:
            verdict = self._dispatch.poll(chunk_index, time.monotonic())
            if isinstance(verdict, StartNow):
                control, reset = self._held.sample()
                self._on_taken(chunk_index, control, reset)
                return control, reset
        return Hold(verdict.delay_s) if isinstance(verdict, StartLater) else None

    def pushed(self, chunk_index: int, num_frames: int, now: float, playout_end_t: float) -> None:
        """A chunk's frames reached the pacer: the dispatch controller's measurement."""
        with self._lock:
            self._dispatch.pushed(chunk_index, num_frames, now, playout_end_t)

    def latency_of(self, chunk_index: int) -> float | None:
        """That chunk's DiT start → pacer time, once its last frames are in."""
        with self._lock:
            return self._dispatch.latency_of(chunk_index)

    def stats(self, now: float) -> DispatchStats:
        with self._lock:
            return self._dispatch.stats(now)

    def arrivals_applied_by(self, seq: int | None) -> list[float]:
        """Arrival times of the controls up to `seq` not yet claimed: a chunk that applied `seq`
        is the first to show them."""
        arrivals: list[float] = []
        while seq is not None and self._arrivals and self._arrivals[0][0] <= seq:
            arrivals.append(self._arrivals.popleft()[1])
        return arrivals

    def restart_dispatch(self) -> None:
        """A rewind: the chunks in flight belong to an abandoned future; measurements start again."""
        with self._lock:
            self._dispatch = DispatchController(self._dispatch.config)
