"""A session's `stats` message (every stats_interval_s, to the driver and its spectators) and the
node's frame counters it feeds: what the pacer sent, dropped and repeated since the last one."""

from __future__ import annotations

from server.common.metrics import Metrics
from server.media.pacer import Pacer
from server.session.media_line import MediaLine
from server.wire.dispatch import DispatchStats
from server.wire.protocol import StatsMsg


class PacerCounters:
    """The pacer's totals as increments of `worldrtc_frames_{sent,dropped,repeated}_total`."""

    def __init__(self, pacer: Pacer, metrics: Metrics) -> None:
        self._pacer, self._metrics = pacer, metrics
        self._sent = self._dropped = self._repeated = 0

    def count(self) -> int:
        """Add what happened since the last call to the node's counters; returns the repeats in it."""
        p, m = self._pacer, self._metrics
        m.frames_sent.inc(p.sent - self._sent)
        m.frames_dropped.inc(p.dropped - self._dropped)
        repeats = p.repeated - self._repeated
        m.frames_repeated.inc(repeats)
        self._sent, self._dropped, self._repeated = p.sent, p.dropped, p.repeated
        return repeats


def stats_message(
    line: MediaLine,
    dispatch: DispatchStats,
    repeats_per_s: float,
    controls_accepted: int,
    controls_refused: int,
    spectators: int,
) -> StatsMsg:
    figures, p = line.figures(), line.pacer
    predicted = dispatch.predicted_start_to_display_s
    return StatsMsg(
        fps=line.fps,
        dispatch=dispatch.policy,
        frames_sent=p.sent,
        frames_dropped=p.dropped,
        frames_repeated=p.repeated,
        repeats_per_s=repeats_per_s,
        chunk_period_p50_s=figures["chunk_period_p50_s"],
        real_time_factor=figures["real_time_factor"],
        buffered_ms=1000 * dispatch.buffered_s,
        chunks_in_flight=dispatch.chunks_in_flight,
        predicted_latency_s=predicted,
        # A control waits for the next chunk start: half a chunk period on average.
        predicted_control_to_frame_s=None if predicted is None else line.chunk_media_s / 2 + predicted,
        control_to_frame_p50_s=figures["control_to_frame_p50_s"],
        start_to_pacer_quantile_s=dispatch.latency_s,
        start_to_pacer_p50_s=dispatch.measured_latency_p50_s,
        dispatch_lateness_s=dispatch.lateness_s,
        behind=figures["behind"],
        controls_accepted=controls_accepted,
        controls_refused=controls_refused,
        spectators=spectators,
    )
