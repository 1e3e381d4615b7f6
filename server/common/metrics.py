"""Prometheus metrics (served at /metrics) and the event-loop lag monitor.

Each app gets its own registry, so tests can build several apps in one process.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PERIOD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0)
QUEUE_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)
LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("worldrtc_sessions", "Sessions by state", ["state"], registry=r)
        self.chunk_compute = Histogram(
            "worldrtc_chunk_compute_seconds", "Stage compute per chunk", ["stage"], buckets=PERIOD_BUCKETS, registry=r
        )
        self.chunk_period = Histogram(
            "worldrtc_chunk_period_seconds",
            "Time between a session's chunk outputs",
            buckets=PERIOD_BUCKETS,
            registry=r,
        )
        self.control_to_frame = Histogram(
            "worldrtc_control_to_frame_seconds",
            "Control arrival to the first frame generated with it being ready (server side)",
            buckets=PERIOD_BUCKETS,
            registry=r,
        )
        self.frames_sent = Counter("worldrtc_frames_sent_total", "Video frames sent", registry=r)
        self.frames_dropped = Counter("worldrtc_frames_dropped_total", "Frames dropped by the pacer", registry=r)
        self.frames_repeated = Counter("worldrtc_frames_repeated_total", "Frames repeated (starved)", registry=r)
        self.worker_restarts = Gauge("worldrtc_worker_restarts", "Stage worker restarts so far", registry=r)
        self.loop_lag = Histogram("worldrtc_event_loop_lag_seconds", "Event-loop lag", buckets=LAG_BUCKETS, registry=r)
        self.errors = Counter("worldrtc_client_errors_total", "Errors sent to clients", ["code"], registry=r)
        self.control_messages = Counter(
            "worldrtc_control_messages_total",
            "Data-channel messages from clients, by result (accepted, rate_limited, invalid)",
            ["result"],
            registry=r,
        )
        self.peer_connections = Gauge("worldrtc_peer_connections", "Open WebRTC peer connections", registry=r)
        self.spectators = Gauge("worldrtc_spectators", "Spectators watching now, all sessions", registry=r)
        self.spectator_joins = Counter("worldrtc_spectator_joins_total", "Spectators admitted", registry=r)
        self.watch_refused = Counter(
            "worldrtc_watch_refused_total",
            "Watch requests refused, by reason (missing, wrong, driver_token, other_session, revoked, "
            "ended, full, node_full)",
            ["reason"],
            registry=r,
        )
        self.spectator_frames_skipped = Counter(
            "worldrtc_spectator_frames_skipped_total",
            "Frames a spectator did not get because its own queue overflowed or it waited for a keyframe",
            registry=r,
        )
        self.sessions_refused = Counter(
            "worldrtc_sessions_refused_total", "Session creations refused, by reason", ["reason"], registry=r
        )
        self.queue_length = Gauge("worldrtc_queue_length", "Tickets waiting for a session slot", registry=r)
        self.queue_wait = Histogram(
            "worldrtc_queue_wait_seconds",
            "A ticket's wait from its create to its session (ready)",
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.queue_dropped = Counter(
            "worldrtc_queue_dropped_total",
            "Tickets dropped, by reason (silent, left, no_show, server_shutdown, failed)",
            ["reason"],
            registry=r,
        )
        self.turns_over = Counter(
            "worldrtc_turns_over_total", "Sessions ended at their turn's end for someone waiting", registry=r
        )


class LoopLagMonitor:
    """Measures how late the event loop runs a timer: a direct reading of blocking work on the loop."""

    def __init__(self, metrics: Metrics, interval_s: float = 0.1, window: int = 6000) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self.samples: deque[float] = deque(maxlen=window)  # bounded: the last ~10 minutes
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, time.perf_counter() - t0 - self.interval_s)
            self.samples.append(lag)
            self.metrics.loop_lag.observe(lag)

    def p99_s(self) -> float | None:
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
