"""A live session's stage timeline: `GET /v1/sessions/{id}/timeline`.

What the recent past of one session looked like, in the same shape as a `benchmarks.replay` RUN.json
(so `python -m benchmarks.timeline` draws either): per chunk, each stage's compute span (and each
rank's, for stages on several ranks), when its frames reached the pacer and which controls it applied;
per emitted frame, the pacer's buffer level and whether the tick repeated a frame; per control, when
it arrived, when the chunk that applied it first took its controls, when that chunk's first frames
reached the pacer and when the first of them went out: where its control-to-frame latency went
(waiting for the sample, compute, the pacer's queue).

Times are seconds since the session's peer connected (when the engine session opened). Bounded: the
last TIMELINE_CHUNKS chunks and TIMELINE_CONTROLS controls (drop-oldest); the pacer keeps the frames
(server/media/pacer.py `history_frames`). Everything here runs on the event loop.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from workers.runtime.records import ChunkRecord

TIMELINE_CHUNKS = 64  # about a minute at 16 FPS and 17-frame chunks
TIMELINE_CONTROLS = 256


@dataclass(frozen=True)
class ControlPath:
    """One control's way to the screen, on the loop's clock (time.monotonic)."""

    arrived_t: float
    sampled_t: float | None  # the chunk that applied it took its controls (None: not seen, e.g. a branch's first)
    in_pacer_t: float  # that chunk's first frames reached the pacer
    shown_t: float  # the first of them went out


class SessionTimeline:
    def __init__(self, open_t: float, open_perf_t: float) -> None:
        # The pacer and the loop count on time.monotonic, the engine on perf_counter: one origin each,
        # taken at the same moment.
        self.open_t, self.open_perf_t = open_t, open_perf_t
        self.chunks: deque[dict[str, Any]] = deque(maxlen=TIMELINE_CHUNKS)
        self.controls: deque[ControlPath] = deque(maxlen=TIMELINE_CONTROLS)

    def chunk_done(self, rec: ChunkRecord, num_frames: int) -> None:
        origin = self.open_perf_t
        row: dict[str, Any] = {
            "index": rec.index,
            "num_frames": num_frames,
            "keys": sorted(rec.control.keys) if rec.control is not None else [],
            "applied_seq": rec.control.seq if rec.control is not None else None,
            "frames_ready_s": None if rec.frames_ready_t is None else rec.frames_ready_t - origin,
            "stage_spans_s": rec.stage_spans_s(origin),
        }
        if ranks := rec.rank_spans_s(origin):
            row["rank_spans_s"] = ranks
        self.chunks.append(row)

    def control_shown(self, path: ControlPath) -> None:
        """A control reached the screen."""
        self.controls.append(path)

    def report(
        self, pacer_history: deque[tuple[float, int, bool]], fps: int, now_t: float, window_s: float | None = None
    ) -> dict[str, Any]:
        """All that is kept, or the last `window_s` seconds of it (the HUD's strip asks for a few)."""
        now_s = now_t - self.open_t
        since = -math.inf if window_s is None else now_s - window_s
        history = [(t - self.open_t, depth, rep) for t, depth, rep in pacer_history if t - self.open_t >= since]
        return {
            "fps": fps,
            "now_s": now_s,
            "chunks": [c for c in self.chunks if max(end for _, end in c["stage_spans_s"].values()) >= since],
            "pacer": {
                "t_s": [t for t, _, _ in history],
                "buffered_frames": [depth for _, depth, _ in history],
                "repeated": [rep for _, _, rep in history],
            },
            "controls": [self._control_row(c) for c in self.controls if c.shown_t - self.open_t >= since],
        }

    def _control_row(self, c: ControlPath) -> dict[str, float | None]:
        def rel(t: float | None) -> float | None:
            return None if t is None else t - self.open_t

        return {
            "arrived_s": rel(c.arrived_t),
            "sampled_s": rel(c.sampled_t),
            "in_pacer_s": rel(c.in_pacer_t),
            "shown_s": rel(c.shown_t),
        }
