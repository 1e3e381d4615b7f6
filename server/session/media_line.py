"""A session's media line: what the engine generates, on its way to the viewers and to the recording.

    engine output (parts of chunks, loop thread)
        ──▶ pacer (one frame per tick) ──▶ fan-out (one encode) ──▶ the driver and every spectator
        ──▶ recorder (server/media/recording.py: the chunk's frames and the control it took)
        ──▶ the dispatch controller (frames pushed, when they will have played out)
        ──▶ a `chunk` message per finished chunk, for the session to broadcast

Frames go into the pacer as they come (no copies, no conversion on the loop). The line measures
what a viewer gets: first frames, the chunk period (arrival to arrival), and control-to-frame latency,
from a control's arrival (kept by the control source) to the moment the pacer sends the first frame
of the first chunk that applied it. Generation is `behind` when the median period of the last
BEHIND_CHUNKS chunks is over BEHIND_RATIO × a chunk's media duration (once BEHIND_MIN_CHUNKS are in:
one slow chunk, a first compile or a hiccup, is not behind).

A stream whose first chunk is the start image alone (one-latent chunks) starts once the second
chunk's frames are in too (`start_frames`). The pacer holds at most two chunks and a little
(dispatch keeps at most two between DiT start and the pacer, and starts one only when the buffer is
about to run out): its bound drops frames only if that breaks. A rewind discards what is queued from
the abandoned future.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from pathlib import Path
from typing import Any

from server.common.metrics import Metrics
from server.media.fanout import VideoFanout
from server.media.pacer import Pacer
from server.media.recording import ChunkEntry, SessionRecording
from server.media.timeline import TIMELINE_CHUNKS, ControlPath, SessionTimeline
from server.session.control_source import ControlSource
from server.wire.protocol import ChunkMsg
from workers.chunk_geometry import chunk_num_frames
from workers.controls import ChunkControl
from workers.runtime.records import ChunkOutput

LATENCY_SAMPLES = 64  # recent control-to-frame samples behind the p50
PERIOD_SAMPLES = 64  # recent chunk periods behind the p50 and the real-time factor
BEHIND_CHUNKS = 8
BEHIND_RATIO = 1.1
BEHIND_MIN_CHUNKS = 3

Part = tuple[int, int, int]  # (first frame, pts of the first frame, frames) of one part of a chunk


def start_frames(chunk_latent_frames: int) -> int:
    """Frames the pacer queues before the first goes out. A first chunk of under half a chunk period
    (one-latent chunks: the start image alone) is on screen for less time than the next chunk takes
    to compute, and would be held there, repeated, until it comes: such a stream starts with the
    first two chunks' frames. Longer first chunks start at once."""
    first, steady = chunk_num_frames(0, chunk_latent_frames), chunk_num_frames(1, chunk_latent_frames)
    return first + steady if 2 * first < steady else 1


class MediaLine:
    def __init__(
        self, fps: int, chunk_latent_frames: int, controls: ControlSource, metrics: Metrics, frames_before: int
    ) -> None:
        self.fps, self._controls, self._metrics = fps, controls, metrics
        chunk_frames = chunk_num_frames(1, chunk_latent_frames)
        self.pacer = Pacer(
            fps,
            max_frames=2 * chunk_frames + 4,
            on_emit=self._on_emit,
            history_frames=TIMELINE_CHUNKS * chunk_frames,
            start_frames=start_frames(chunk_latent_frames),
        )
        self.fanout = VideoFanout(self.pacer, fps)  # encode once for the driver and every spectator
        self.recording: SessionRecording | None = None
        self.timeline: SessionTimeline | None = None
        self._open_perf_t = 0.0  # the engine's clock at the open: stage times count from here
        self._frames_pushed = frames_before  # a branch's video goes on from its snapshot's frame count
        self._parts: dict[int, list[Part]] = {}  # chunk -> its parts so far
        # chunk -> when it took its controls (scheduler thread; popped when its first frames arrive)
        self._taken_t: dict[int, float] = {}
        # chunk -> (arrivals of the controls it shows first, when it took them, when its first frames came)
        self._awaiting_display: dict[int, tuple[list[float], float | None, float]] = {}
        self._control_to_frame: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._last_chunk_t: float | None = None
        self._periods: deque[float] = deque(maxlen=PERIOD_SAMPLES)
        self.chunks = 0
        self.first_frames_t: float | None = None

    def open(self, recording: SessionRecording | None, timeline: SessionTimeline, history: list[ChunkEntry]) -> None:
        """Generation starts; a line that starts from a snapshot records on from its history."""
        self.recording, self.timeline = recording, timeline
        self._open_perf_t = timeline.open_perf_t
        if recording is not None and history:
            recording.rewind(history)

    def control_taken(self, chunk_index: int, control: ChunkControl, reset_pose: bool) -> None:
        """The control source's report (scheduler thread): the recording keeps what each chunk took,
        the latency breakdown when it took it."""
        self._taken_t[chunk_index] = time.monotonic()
        if self.recording is not None:
            self.recording.control_taken(chunk_index, control, reset_pose)

    def push(self, out: ChunkOutput) -> ChunkMsg | None:
        """Part of a chunk's frames (loop thread): into the pacer at once; the chunk's message once
        its last part is in."""
        n = int(out.frames.shape[0])
        first_frame, pacer = self._frames_pushed, self.pacer
        pacer.push(out.frames, out.index, first_frame)
        if self.recording is not None:
            if out.offset == 0 and out.record.prompt_change is not None:
                self.recording.prompt_changed(out.index, out.record.prompt_change)
            self.recording.frames(out.index, out.frames, out.last)
        self._frames_pushed += n
        # The pts this part's first frame will carry: every tick so far (repeats included) plus the
        # frames queued ahead of it. Exact unless the pacer later drops frames before it.
        pts_start = (pacer.sent + pacer.depth - n) * pacer.pts_step
        self._parts.setdefault(out.index, []).append((first_frame, pts_start, n))
        now = time.monotonic()
        next_due = pacer.next_due_s if pacer.started else now
        assert next_due is not None
        self._controls.pushed(out.index, n, now, playout_end_t=max(next_due, now) + pacer.depth / self.fps)
        if out.offset == 0:
            self._arrived(out, now)
        return self._chunk_message(out, self._parts.pop(out.index)) if out.last else None

    def rewind(self, frames: int, history: list[ChunkEntry]) -> int:
        """Back to a snapshot taken after `frames` frames; returns the queued frames discarded."""
        discarded = self.pacer.discard_queued()
        self._parts.clear()
        self._awaiting_display.clear()
        self._taken_t.clear()
        self._frames_pushed = frames
        if self.recording is not None:
            self.recording.rewind(history)
        return discarded

    async def close(self) -> None:
        """The recording's last frames written (off the loop), the encoders and the pacer stopped."""
        if self.recording is not None:
            await asyncio.to_thread(self.recording.close)
        await self.fanout.close()
        self.pacer.close()

    # ---- figures ----

    @property
    def chunk_media_s(self) -> float:
        return self._controls.config.chunk_media_s

    def timeline_report(self, window_s: float | None = None) -> dict[str, Any]:
        """The recent stage timeline (server/media/timeline.py); empty until generation starts."""
        if self.timeline is None:
            return {"fps": self.fps, "now_s": 0.0, "chunks": [], "pacer": None, "controls": []}
        return self.timeline.report(self.pacer.history, self.fps, time.monotonic(), window_s)

    def recording_record(self) -> dict[str, Any] | None:
        """The recording's JSON (server/media/recording.py), None before generation starts."""
        return None if self.recording is None else self.recording.record()

    def video_path(self) -> Path | None:
        return None if self.recording is None else self.recording.video_path

    def figures(self) -> dict[str, Any]:
        periods = sorted(self._periods)
        latencies = sorted(self._control_to_frame)
        return {
            "chunks": self.chunks,
            "chunk_period_p50_s": periods[len(periods) // 2] if periods else None,
            "real_time_factor": self._real_time_factor(periods),
            "control_to_frame_p50_s": latencies[len(latencies) // 2] if latencies else None,
            "frames_sent": self.pacer.sent,
            "frames_dropped": self.pacer.dropped,
            "frames_repeated": self.pacer.repeated,
            "behind": self.behind,
        }

    @property
    def behind(self) -> bool:
        """Generation is slower than playback (over the last BEHIND_CHUNKS chunks)."""
        recent = sorted(list(self._periods)[-BEHIND_CHUNKS:])
        if len(recent) < BEHIND_MIN_CHUNKS:
            return False
        return recent[len(recent) // 2] > BEHIND_RATIO * self.chunk_media_s

    def _real_time_factor(self, sorted_periods: list[float]) -> float | None:
        """p95 chunk period / chunk media duration (< 1: generation is ahead of playback)."""
        if not sorted_periods:
            return None
        p95 = sorted_periods[min(len(sorted_periods) - 1, int(0.95 * len(sorted_periods)))]
        return p95 / self.chunk_media_s

    # ---- events ----

    def _arrived(self, out: ChunkOutput, now: float) -> None:
        """The chunk's first frames are in the pacer."""
        if self.first_frames_t is None:
            self.first_frames_t = now
        if self._last_chunk_t is not None:
            self._periods.append(now - self._last_chunk_t)
            self._metrics.chunk_period.observe(now - self._last_chunk_t)
        self._last_chunk_t = now
        control = out.record.control
        taken_t = self._taken_t.pop(out.index, None)
        arrivals = self._controls.arrivals_applied_by(None if control is None else control.seq)
        if arrivals:
            self._awaiting_display[out.index] = (arrivals, taken_t, now)  # measured when its first frame goes out

    def _on_emit(self, chunk_index: int, frame_index: int, emit_t: float) -> None:
        """The pacer sends a chunk's first frame (loop thread): its controls have reached the screen."""
        for older in [k for k in self._awaiting_display if k < chunk_index]:
            del self._awaiting_display[older]  # its frames were dropped unseen
        arrivals, taken_t, in_pacer_t = self._awaiting_display.pop(chunk_index, ((), None, emit_t))
        for arrived in arrivals:
            latency = max(0.0, emit_t - arrived)
            if self.timeline is not None:
                self.timeline.control_shown(ControlPath(arrived, taken_t, in_pacer_t, emit_t))
            self._control_to_frame.append(latency)
            self._metrics.control_to_frame.observe(latency)

    def _chunk_message(self, out: ChunkOutput, parts: list[Part]) -> ChunkMsg:
        rec = out.record
        self.chunks += 1
        num_frames = sum(p[2] for p in parts)
        if self.timeline is not None:
            self.timeline.chunk_done(rec, num_frames)
        for stage, tm in rec.stages.items():
            self._metrics.chunk_compute.labels(stage.value).observe(tm.busy_s)
        timings: dict[str, float | None] = {f"{s.value}_s": tm.busy_s for s, tm in rec.stages.items()}
        timings["queue_s"] = sum((tm.queue_wait_s or 0.0) for tm in rec.stages.values())
        timings["start_to_pacer_s"] = self._controls.latency_of(out.index)
        _, last_pts, last_n = parts[-1]
        return ChunkMsg(
            index=out.index,
            first_frame=parts[0][0],
            num_frames=num_frames,
            pts_start=parts[0][1],
            pts_end=last_pts + (last_n - 1) * self.pacer.pts_step,
            # Each part as the pacer got it: exact pts even if it repeated a frame between two parts.
            parts=parts,
            applied_seq=rec.control.seq if rec.control is not None else None,
            applied_keys=sorted(rec.control.keys) if rec.control is not None else [],
            model_input=rec.model_input,
            prompt=rec.prompt,
            timings=timings,
            stages={
                s.value: (tm.dispatch_t - self._open_perf_t, tm.done_t - self._open_perf_t)
                for s, tm in rec.stages.items()
                if tm.dispatch_t is not None and tm.done_t is not None
            },
        )
