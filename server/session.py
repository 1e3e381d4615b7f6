"""One driver's session: an enum state machine owning a peer connection, its data channel, the
pacer, the video fan-out (one encode for the driver and every spectator), the session's spectators
and its watch token, and the engine session that generates its frames.

    created ──offer──▶ connecting ──control channel open──▶ streaming ──▶ closing ──▶ closed
        │                  │     (ICE connected, watch-only)                  ▲
        └── no offer in offer_timeout_s / ICE not connected in ice_timeout_s ┴──▶ failed

Every wait has a timeout, every task is owned here and cancelled on close, and `close()` is
idempotent, tearing down in reverse order of setup (spectators, engine session, fan-out, peer
connection); its `EndReason` goes to the client in `done`, and to its spectators as driver_left.
Liveness comes from the connection: its state, the control channel's close, and the RTCP receiver
reports the viewer sends for the video it gets.
Engine callbacks arrive on the scheduler thread and are handed to the event loop; the loop only
enqueues frames (no copies, no conversion) and sends small JSON messages.

A session may start from a snapshot (a branch) and may be rewound to one (`restore`): either way
its engine session opens from the snapshot's state, and a rewind replaces the engine session under
the same connection, pacer and fan-out (the frames queued from the abandoned future are discarded).
Frames of an engine session that is not the current one are ignored.

When the engine could start this viewer's next chunk it asks `_sample_control` (scheduler thread);
the session's dispatch controller (`server/dispatch.py`) answers start now, later, or not yet, and a
chunk that starts takes the controls held at that moment. Control-to-frame latency is measured from
a control's arrival to the moment the pacer sends the first frame of the first chunk that applied it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import threading
import time
from collections import deque
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import numpy as np
from aiortc import RTCPeerConnection, RTCRtpSender

from server.dispatch import DispatchConfig, DispatchController, DispatchPolicy, StartLater, StartNow
from server.errors import AlreadyConnected, BadRequest, Busy, SessionClosed, Unavailable
from server.fanout import VideoFanout, ViewerTrack
from server.metrics import Metrics
from server.offer import OfferError, validate_offer
from server.owned_tasks import OwnedTasks
from server.pacer import Pacer
from server.protocol import (
    ChunkMsg,
    DoneMsg,
    EndReason,
    ErrorMsg,
    Parent,
    PingMsg,
    PongMsg,
    PromptMsg,
    ProtocolError,
    ReadyMsg,
    RewoundMsg,
    ServerMessage,
    StatsMsg,
    StopMsg,
    VideoStartMsg,
    parse_client_message,
)
from server.rate_limit import TokenBucket
from server.recording import Recipe, SessionRecording
from server.recording_store import RecordingStore
from server.settings import Settings
from server.snapshot import Origin, ServerSnapshot, snapshot_error
from server.spectator import Spectator
from server.timeline import TIMELINE_CHUNKS, SessionTimeline
from server.viewer_peer import answer_viewer, close_peer_connection, new_peer_connection, send_on, wait_until_silent
from workers.chunk_geometry import chunk_num_frames
from workers.controls import ChunkControl, ControlState, client_contract
from workers.models.presets import ModelPreset
from workers.runtime.engine import PipelineEngine
from workers.runtime.messages import RAISED
from workers.runtime.records import ChunkOutput
from workers.runtime.scheduler import Hold
from workers.runtime.snapshot_catalog import SnapshotEntry, SnapshotGone
from workers.runtime.supervisor import EngineError

log = logging.getLogger("worldrtc.session")

PENDING_CONTROLS = 512  # control arrival times kept for control-to-frame latency (oldest dropped)
LATENCY_SAMPLES = 64  # recent control-to-frame samples behind the stats' p50
# A spectator joins with frames of the last chunks still queued ahead of it: their `chunk` messages
# (sent before it came) are sent again as it connects, so it can place every frame it receives.
CATCH_UP_CHUNKS = 3
REVOKED_TOKENS_KEPT = 64  # revoked watch tokens remembered (to answer 403 "revoked" rather than 401)
RATE_NOTICE_S = 1.0  # at most one `rate_limited` error a second: a flood must not be answered in kind
BEHIND_CHUNKS = 8  # the recent chunks whose median period decides whether generation is behind
BEHIND_RATIO = 1.1  # behind: that median period is over this × a chunk's media duration
BEHIND_MIN_CHUNKS = 3  # periods needed before it is said: one slow chunk (a first compile, a hiccup) is not behind


class SessionState(StrEnum):
    CREATED = "created"
    CONNECTING = "connecting"
    STREAMING = "streaming"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


ACTIVE = (SessionState.CREATED, SessionState.CONNECTING, SessionState.STREAMING)


class ServerSession:
    def __init__(
        self,
        engine: PipelineEngine,
        preset: ModelPreset,
        settings: Settings,
        metrics: Metrics,
        image: np.ndarray,
        prompt: str,
        seed: int,
        max_duration_s: float | None,
        fps: int | None = None,
        chunk_latent_frames: int | None = None,
        dispatch: DispatchPolicy | None = None,
        scene: str | None = None,
        recordings: RecordingStore | None = None,
        weights_digest: str = "",
        branch_of: ServerSnapshot | None = None,
    ) -> None:
        self.id = secrets.token_hex(8)
        self.token = secrets.token_urlsafe(24)
        self.engine, self.preset, self.settings, self.metrics = engine, preset, settings, metrics
        if branch_of is not None:  # a branch goes on with its line's start image, prompt, seed, rate, chunk size
            o = branch_of.origin
            image, prompt, seed, scene = o.image, o.prompt, o.seed, o.scene
            fps, chunk_latent_frames = o.fps, o.chunk_latent_frames
        self.image, self.prompt, self.seed, self.scene = image, prompt, seed, scene
        # The client may ask for less time than the server allows, never more.
        limits = [t for t in (max_duration_s, settings.session_limit_s) if t]
        self.max_duration_s = min(limits) if limits else None
        self.fps = fps or settings.fps or preset.fps
        self.chunk_latent_frames = chunk_latent_frames or preset.chunk_latent_frames
        self.origin = (
            branch_of.origin
            if branch_of is not None
            else Origin(image, prompt, seed, self.fps, self.chunk_latent_frames, scene, line=self.id)
        )
        self._start_from = branch_of  # the snapshot the engine session opens from (a rewind changes it)
        self.parent: Parent | None = None if branch_of is None else branch_of.as_parent()
        self.state = SessionState.CREATED
        self.created_t = time.monotonic()
        self.error: str | None = None
        self.loop = asyncio.get_running_loop()
        self.pc: RTCPeerConnection | None = None
        self.channel: Any = None
        chunk_frames = chunk_num_frames(1, self.chunk_latent_frames)
        # Dispatch (server/dispatch.py) keeps at most two chunks between DiT start and the pacer, and
        # starts one only when the buffer is about to run out: the bound only drops frames if that breaks.
        self.pacer = Pacer(
            self.fps,
            max_frames=2 * chunk_frames + 4,
            on_emit=self._on_emit,
            history_frames=TIMELINE_CHUNKS * chunk_frames,
        )
        self.timeline: SessionTimeline | None = None  # from the engine session's open
        self.dispatch = DispatchController(
            DispatchConfig(dispatch or settings.dispatch, self.fps, self.chunk_latent_frames)
        )
        # Encode once for the driver and every spectator (server/fanout.py).
        self.fanout = VideoFanout(self.pacer, self.fps)
        self.track: ViewerTrack | None = None
        self.watch_token: str | None = secrets.token_urlsafe(24)  # lets its holder watch, never steer
        self.revoked_watch_tokens: deque[str] = deque(maxlen=REVOKED_TOKENS_KEPT)
        self.spectators: dict[str, Spectator] = {}
        self.spectators_joined = 0
        self._recent_chunks: deque[str] = deque(maxlen=CATCH_UP_CHUNKS)  # the last `chunk` messages, as sent
        self.engine_session: str | None = None
        self._controls = ControlState()
        # The engine asks for controls and dispatch verdicts on its scheduler thread; the loop feeds both.
        self._lock = threading.Lock()
        self._control_times: deque[tuple[int, float]] = deque(maxlen=PENDING_CONTROLS)  # (seq, arrival)
        self._awaiting_display: dict[int, list[float]] = {}  # chunk -> arrivals of controls it applied first
        self._chunk_parts: dict[int, list[tuple[int, int, int]]] = {}  # chunk -> (first_frame, pts_start, n) per part
        self._control_to_frame: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._tasks = OwnedTasks(f"session-{self.id}")
        self._last_control_t = time.monotonic()  # idle time counts from the create
        self._watch_only = False
        self.video_sender: RTCRtpSender | None = None
        self.ended: EndReason | None = None
        rate = settings.control_rate_per_s
        self._bucket = TokenBucket.full(rate, burst=rate, now=time.monotonic())  # client messages
        self._rate_notice_t = -math.inf
        self._invalid_t: deque[float] = deque()  # arrival times of invalid messages within abuse_window_s
        self.controls = {"accepted": 0, "rate_limited": 0, "invalid": 0}
        self._last_chunk_t: float | None = None
        self._periods: deque[float] = deque(maxlen=64)
        self.chunks = 0
        self._frames_pushed = 0 if branch_of is None else branch_of.frames
        self.first_frame_s: float | None = None
        self._recordings, self._weights_digest = recordings, weights_digest
        self.recording: SessionRecording | None = None  # from the engine session's open
        self._closed = asyncio.Event()
        self._tasks.spawn(self._expire_if_no_offer(), "offer-timeout")

    # ---- public ----

    def info(self) -> dict[str, Any]:
        p = self.preset
        periods = sorted(self._periods)
        return {
            "session_id": self.id,
            "state": self.state.value,
            "created_s": time.monotonic() - self.created_t,
            "model": p.name,
            "scene": self.scene,
            "width": p.width_px,
            "height": p.height_px,
            "fps": self.fps,
            "chunk_frames": chunk_num_frames(1, self.chunk_latent_frames),
            "parent": None if self.parent is None else self.parent.model_dump(),
            "error": self.error,
            "ended": None if self.ended is None else self.ended.value,
            "metrics": {
                "dispatch": self.dispatch.config.policy.value,
                "chunks": self.chunks,
                "first_frame_s": self.first_frame_s,
                "chunk_period_p50_s": periods[len(periods) // 2] if periods else None,
                "real_time_factor": self._real_time_factor(periods),
                "control_to_frame_p50_s": _median(self._control_to_frame),
                "frames_sent": self.pacer.sent,
                "frames_dropped": self.pacer.dropped,
                "frames_repeated": self.pacer.repeated,
                "behind": self.behind,
                "controls": dict(self.controls),
                "spectators": len(self.spectators),
                "spectators_joined": self.spectators_joined,
            },
        }

    def recording_record(self) -> dict[str, Any] | None:
        """The recording's JSON (server/recording.py), None before generation starts."""
        return None if self.recording is None else self.recording.record()

    def video_path(self) -> Path | None:
        return None if self.recording is None else self.recording.video_path

    def timeline_report(self, window_s: float | None = None) -> dict[str, Any]:
        """The recent stage timeline (server/timeline.py); empty until generation starts."""
        body: dict[str, Any] = {"session_id": self.id, "state": self.state.value}
        if self.timeline is None:
            return body | {"fps": self.fps, "now_s": 0.0, "chunks": [], "pacer": None, "controls": []}
        return body | self.timeline.report(self.pacer.history, self.fps, time.monotonic(), window_s)

    def ready_message(self, role: Literal["driver", "spectator"]) -> ReadyMsg:
        p = self.preset
        return ReadyMsg(
            session_id=self.id,
            model=p.name,
            weights=p.weights_note,
            width=p.width_px,
            height=p.height_px,
            fps=self.fps,
            chunk_frames=chunk_num_frames(1, self.chunk_latent_frames),
            dispatch=self.dispatch.config.policy.value,
            controls=client_contract(),
            idle_timeout_s=self.settings.idle_timeout_s,
            max_duration_s=self.max_duration_s,
            role=role,
            parent=self.parent,
        )

    # ---- snapshots ----

    async def snapshot(self, wait_s: float) -> SnapshotEntry:
        """Save the generation state at the next chunk boundary (server/snapshots.py)."""
        if self.state is not SessionState.STREAMING or self.engine_session is None:
            raise SessionClosed(f"session {self.id} is {self.state.value}: only a streaming session can be saved")
        done: asyncio.Future[SnapshotEntry] = self.loop.create_future()

        def on_done(entry: SnapshotEntry | None, error: str | None) -> None:  # scheduler thread
            def settle() -> None:
                if done.done():
                    return
                if entry is None:
                    done.set_exception(snapshot_error(error or "unknown"))
                else:
                    done.set_result(entry)

            self.loop.call_soon_threadsafe(settle)

        self.engine.take_snapshot(self.engine_session, on_done)
        try:
            return await asyncio.wait_for(done, wait_s)
        except TimeoutError:
            raise Unavailable(f"the snapshot did not complete in {wait_s:g} s", retry_after_s=2) from None

    async def restore(self, snapshot: ServerSnapshot) -> None:
        """Rewind to `snapshot` in place: the same connection goes on, showing frames from it."""
        if self.state is not SessionState.STREAMING or self.engine_session is None:
            raise SessionClosed(f"session {self.id} is {self.state.value}: only a streaming session can be rewound")
        self.engine.snapshots.use(snapshot.snapshot_id)  # SnapshotGone before anything is torn down
        old, self.engine_session = self.engine_session, None
        self.engine.close_session(old)
        discarded = self.pacer.discard_queued()
        with self._lock:
            self.dispatch = DispatchController(self.dispatch.config)
        self._chunk_parts.clear()
        self._awaiting_display.clear()
        self._frames_pushed = snapshot.frames
        self._start_from, self.parent = snapshot, snapshot.as_parent()
        if self.recording is not None:
            self.recording.rewind(snapshot.history or [])
        log.info(
            "session %s rewound to snapshot %s (chunk %d); %d queued frames discarded",
            self.id,
            snapshot.snapshot_id,
            snapshot.chunk_index,
            discarded,
            extra={"session_id": self.id},
        )
        self._send(RewoundMsg(parent=self.parent))
        self._open_engine_session()

    # ---- spectators ----

    async def add_spectator(self, sdp: str, token: str) -> tuple[Spectator, str]:
        """A spectator watching with `token` (checked by the caller), and its SDP answer."""
        if self.state not in ACTIVE:
            raise SessionClosed(f"session {self.id} is {self.state.value}: there is nothing to watch")
        limit = self.settings.max_spectators_per_session
        if len(self.spectators) >= limit:
            self.metrics.watch_refused.labels("full").inc()
            raise Busy(f"session {self.id} has {limit} spectators, the most it takes; retry later", retry_after_s=5)
        spectator = Spectator(
            self.id,
            token,
            self.fanout,
            self.ready_message("spectator"),
            lambda: list(self._recent_chunks),
            self.settings,
            self.metrics,
            on_closed=self._spectator_left,
        )
        self.spectators[spectator.id] = spectator
        answer = await spectator.accept_offer(sdp)  # closes itself (and leaves the table) on a bad offer
        self.spectators_joined += 1
        self.metrics.spectator_joins.inc()
        return spectator, answer

    def _spectator_left(self, spectator: Spectator) -> None:
        self.spectators.pop(spectator.id, None)

    async def new_watch_token(self) -> str:
        """Revoke the current watch token (its spectators end) and issue another."""
        await self.revoke_watch_token()
        if self.state not in ACTIVE:
            raise SessionClosed(f"session {self.id} is {self.state.value}: there is nothing to watch")
        self.watch_token = secrets.token_urlsafe(24)
        return self.watch_token

    async def revoke_watch_token(self) -> int:
        """No watching with the current token any more; its spectators end. Returns how many ended."""
        token, self.watch_token = self.watch_token, None
        if token is None:
            return 0
        self.revoked_watch_tokens.append(token)
        holders = [s for s in self.spectators.values() if s.token == token]
        await asyncio.gather(*(s.close(EndReason.REVOKED, "the driver revoked the watch link") for s in holders))
        return len(holders)

    @property
    def behind(self) -> bool:
        """Generation is slower than playback (over the last BEHIND_CHUNKS chunks)."""
        recent = sorted(list(self._periods)[-BEHIND_CHUNKS:])
        if len(recent) < BEHIND_MIN_CHUNKS:
            return False
        return recent[len(recent) // 2] > BEHIND_RATIO * self.dispatch.config.chunk_media_s

    async def accept_offer(self, sdp: str) -> str:
        if self.state in (SessionState.CONNECTING, SessionState.STREAMING):
            raise AlreadyConnected(f"session {self.id} already has a connection; create a new session to connect again")
        if self.state is not SessionState.CREATED:
            raise SessionClosed(f"session {self.id} is {self.state.value}; create a new session")
        try:
            validate_offer(sdp)
        except OfferError as exc:
            await self.close(EndReason.BAD_OFFER, f"bad offer: {exc}")
            raise BadRequest(str(exc)) from None
        # A viewer that opens no control channel only watches: it streams once ICE connects.
        self._watch_only = "m=application" not in sdp
        self.pc = pc = new_peer_connection(self.settings.ice_servers)
        self.metrics.peer_connections.inc()
        self.state = SessionState.CONNECTING
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_connection_state)
        try:
            await self._answer(pc, sdp)
        except OfferError as exc:
            await self.close(EndReason.BAD_OFFER, f"bad offer: {exc}")
            raise BadRequest(str(exc)) from None
        except Exception as exc:  # aiortc raises ValueError, AssertionError, … for offers it cannot use
            log.info("offer refused: %s: %s", type(exc).__name__, exc, extra={"session_id": self.id})
            why = "the SDP offer cannot be answered (its media sections do not fit a recvonly viewer)"
            await self.close(EndReason.BAD_OFFER, f"bad offer: {why}")
            raise BadRequest(why) from None
        self._tasks.spawn(self._fail_if_not_connected(), "ice-timeout")
        return pc.localDescription.sdp

    async def _answer(self, pc: RTCPeerConnection, sdp: str) -> None:
        self.track = self.fanout.add(on_start=lambda pts: self._send(VideoStartMsg(pts=pts)))
        self.video_sender, codec = await answer_viewer(pc, sdp, self.track, ("H264", "VP8"))
        self.fanout.bind(self.track, codec)
        self.fanout.rtcp_hook(self.video_sender, driver=True)

    async def close(self, code: EndReason, reason: str, detail: str | None = None) -> None:
        """Idempotent; tears down in reverse order of setup. `code` says why, `reason` in words for
        the viewer; `detail` (the log and the REST record's `error`) where the operator needs more."""
        if self.state in (SessionState.CLOSING, SessionState.CLOSED, SessionState.FAILED):
            await self._closed.wait()
            return
        self.state = SessionState.CLOSING
        self.ended = code
        failed = code.failed
        if failed:
            self.error = detail or reason
            self._send(ErrorMsg(code="session_failed", message=reason))
        self._send(DoneMsg(code=code, reason=reason))
        watchers_code = EndReason.SERVER_SHUTDOWN if code is EndReason.SERVER_SHUTDOWN else EndReason.DRIVER_LEFT
        await asyncio.gather(
            *(s.close(watchers_code, f"the session ended ({code.value})") for s in list(self.spectators.values()))
        )
        if self.engine_session is not None:
            self.engine.close_session(self.engine_session)
        if self.recording is not None:
            await asyncio.to_thread(self.recording.close)  # the video's last frames, off the loop
        await self.fanout.close()
        await self._tasks.cancel_all()
        if self.pc is not None:
            await close_peer_connection(self.pc, self.metrics)
        self.pacer.close()
        # A closed session stays listed for closed_session_keep_s with its figures, not its media:
        # the connection, its encoder and the track go now.
        self.pc, self.track, self.video_sender, self.channel = None, None, None, None
        self.state = SessionState.FAILED if failed else SessionState.CLOSED
        log.info(
            "session %s %s: %s",
            self.id,
            self.state.value,
            detail or reason,
            extra={"session_id": self.id, "state": self.state.value, "reason": detail or reason},
        )
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # ---- peer connection and data channel ----

    def _on_connection_state(self) -> None:
        if self.pc is None:
            return  # closed: the session has let go of it
        state = self.pc.connectionState
        if state == "connected" and self._watch_only:
            self._start_streaming()
        elif state == "failed":
            self._tasks.spawn(self.close(EndReason.PEER_GONE, "connection failed"), "close")
        elif state == "closed":
            self._tasks.spawn(self.close(EndReason.CONNECTION_CLOSED, "connection closed"), "close")
        elif state == "disconnected":
            self._tasks.spawn(self._close_unless_reconnected(), "disconnect-grace")

    async def _close_unless_reconnected(self) -> None:
        await asyncio.sleep(self.settings.disconnected_grace_s)
        if self.pc is not None and self.pc.connectionState == "disconnected":
            await self.close(EndReason.PEER_GONE, "connection lost")

    def _on_datachannel(self, channel: Any) -> None:
        if channel.label != "control" or self.channel is not None:
            channel.close()
            return
        self.channel = channel
        channel.on("message", self._on_message)
        closed = EndReason.CONNECTION_CLOSED
        channel.on("close", lambda: self._tasks.spawn(self.close(closed, "control channel closed"), "close"))
        if channel.readyState == "open":
            self._start_streaming()
        else:
            channel.on("open", self._start_streaming)

    def _start_streaming(self) -> None:
        """The viewer is connected (its control channel open, or ICE for a watch-only viewer): generate."""
        if self.state is not SessionState.CONNECTING or self.engine_session is not None:
            return
        self._send(self.ready_message("driver"))
        self._open_t = time.monotonic()
        self._open_perf_t = time.perf_counter()  # the engine's clock: chunk stage times count from here
        if self._recordings is not None:
            self.recording = SessionRecording(self.id, self._recipe(), self._recordings)
        self.timeline = SessionTimeline(self._open_t, self._open_perf_t)
        if self.recording is not None and self._start_from is not None:
            self.recording.rewind(self._start_from.history or [])
        if not self._open_engine_session():
            return
        self._tasks.spawn(self._watch_peer(), "peer")
        if self.settings.idle_timeout_s:
            self._tasks.spawn(self._expire_when_idle(self.settings.idle_timeout_s), "idle")
        self._tasks.spawn(self._send_stats(), "stats")
        if self.max_duration_s:
            self._tasks.spawn(self._expire(self.max_duration_s), "max-duration")

    def _open_engine_session(self) -> bool:
        """Start generating, from the start image or from `_start_from`; False if it could not."""
        start = self._start_from
        try:
            self.engine_session = self.engine.open_session(
                self.image,
                self.prompt,
                self.seed,
                self._sample_control,
                self._chunk_from_engine,
                self._end_from_engine,
                chunk_latent_frames=self.chunk_latent_frames,
                snapshot=None if start is None else start.snapshot_id,
            )
        except (EngineError, ValueError, SnapshotGone) as exc:
            self._tasks.spawn(self.close(EndReason.GENERATION_FAILED, f"could not start generating: {exc}"), "close")
            return False
        return True

    def _recipe(self) -> Recipe:
        placement = self.engine.placement
        return Recipe(
            model=self.preset.name,
            weights=self._weights_digest,
            placement=placement.name,
            placement_stages=placement.stage_record(),
            intra_op_threads=placement.cpu_threads_per_worker,
            seed=self.seed,
            prompt=self.prompt,
            fps=self.fps,
            chunk_latent_frames=self.chunk_latent_frames,
            image=self.image,
        )

    def _on_message(self, data: str | bytes) -> None:
        if self.state not in ACTIVE:
            return
        now = time.monotonic()
        if not self._bucket.take(now):
            self._count("rate_limited")
            if now - self._rate_notice_t >= RATE_NOTICE_S:
                self._rate_notice_t = now
                self._send_error(
                    "rate_limited", f"more than {self.settings.control_rate_per_s:g} messages/s; slow down"
                )
            return
        try:
            msg = parse_client_message(data)
        except ProtocolError as exc:
            self._count("invalid")
            self._send_error(exc.code, str(exc))
            self._note_invalid(now)
            return
        self._count("accepted")
        if isinstance(msg, PingMsg):
            self._send(PongMsg(seq=msg.seq, t=msg.t, server_t=time.time() * 1000))
        elif isinstance(msg, StopMsg):
            self._tasks.spawn(self.close(EndReason.STOPPED, "stopped by the client"), "close")
        elif isinstance(msg, PromptMsg):
            self.prompt = msg.text  # the conditioning of a running session is fixed; used by the next one
        else:
            self._last_control_t = now
            with self._lock:
                self._controls.apply(msg)  # validated once, by parse_client_message
            if msg.seq is not None:
                self._control_times.append((msg.seq, now))

    def _sample_control(self, chunk_index: int) -> tuple[ChunkControl, bool] | Hold | None:
        """Called by the engine when the DiT could start this viewer's next chunk (scheduler thread)."""
        with self._lock:
            verdict = self.dispatch.poll(chunk_index, time.monotonic())
            if isinstance(verdict, StartNow):
                control, reset = self._controls.sample()
                if self.recording is not None:
                    self.recording.control_taken(chunk_index, control, reset)
                return control, reset
        return Hold(verdict.delay_s) if isinstance(verdict, StartLater) else None

    # ---- engine events (on the loop) ----

    def _on_chunk(self, out: ChunkOutput) -> None:
        """Part of a chunk's frames (loop thread): into the pacer at once, and reported to the dispatch
        controller; the last part completes the `chunk` message."""
        if self.state not in (SessionState.CONNECTING, SessionState.STREAMING) or out.session_id != self.engine_session:
            return  # over, or the engine session a rewind replaced
        n = int(out.frames.shape[0])
        first_frame = self._frames_pushed
        pacer = self.pacer
        pacer.push(out.frames, out.index, first_frame)
        if self.recording is not None:
            self.recording.frames(out.index, out.frames, out.last)
        self._frames_pushed += n
        # The pts this part's first frame will carry: every tick so far (repeats included) plus the
        # frames queued ahead of it. Exact unless the pacer later drops frames before it.
        pts_start = (pacer.sent + pacer.depth - n) * pacer.pts_step
        parts = self._chunk_parts.setdefault(out.index, [])
        parts.append((first_frame, pts_start, n))
        now = time.monotonic()
        next_due = pacer.next_due_s if pacer.started else now
        assert next_due is not None
        with self._lock:
            self.dispatch.pushed(out.index, n, now, playout_end_t=max(next_due, now) + pacer.depth / self.fps)
        if out.offset == 0:
            self._on_chunk_arrived(out, now)
        if out.last:
            self._on_chunk_done(out, self._chunk_parts.pop(out.index))

    def _on_chunk_arrived(self, out: ChunkOutput, now: float) -> None:
        """The chunk's first frames are in the pacer."""
        if self.state is SessionState.CONNECTING:
            self.state = SessionState.STREAMING
            self.first_frame_s = now - self._open_t
        if self._last_chunk_t is not None:
            self._periods.append(now - self._last_chunk_t)
            self.metrics.chunk_period.observe(now - self._last_chunk_t)
        self._last_chunk_t = now
        control = out.record.control
        applied = control.seq if control is not None else None
        arrivals = []
        while applied is not None and self._control_times and self._control_times[0][0] <= applied:
            arrivals.append(self._control_times.popleft()[1])
        if arrivals:
            self._awaiting_display[out.index] = arrivals  # measured when its first frame goes out

    def _on_chunk_done(self, out: ChunkOutput, parts: list[tuple[int, int, int]]) -> None:
        rec = out.record
        self.chunks += 1
        if self.timeline is not None:
            self.timeline.chunk_done(rec, sum(p[2] for p in parts))
        for stage, tm in rec.stages.items():
            self.metrics.chunk_compute.labels(stage.value).observe(tm.busy_s)
        with self._lock:
            start_to_pacer = self.dispatch.latency_of(out.index)
        step = self.pacer.pts_step
        _, last_pts, last_n = parts[-1]
        timings: dict[str, float | None] = {f"{s.value}_s": tm.busy_s for s, tm in rec.stages.items()}
        timings["queue_s"] = sum((tm.queue_wait_s or 0.0) for tm in rec.stages.values())
        timings["start_to_pacer_s"] = start_to_pacer
        self._recent_chunks.append(
            self._broadcast(
                ChunkMsg(
                    index=out.index,
                    first_frame=parts[0][0],
                    num_frames=sum(p[2] for p in parts),
                    pts_start=parts[0][1],
                    pts_end=last_pts + (last_n - 1) * step,
                    # Each part as the pacer got it: exact pts even if it repeated a frame between two parts.
                    parts=parts,
                    applied_seq=rec.control.seq if rec.control is not None else None,
                    applied_keys=sorted(rec.control.keys) if rec.control is not None else [],
                    model_input=rec.model_input,
                    timings=timings,
                    stages={
                        s.value: (tm.dispatch_t - self._open_perf_t, tm.done_t - self._open_perf_t)
                        for s, tm in rec.stages.items()
                        if tm.dispatch_t is not None and tm.done_t is not None
                    },
                )
            )
        )

    def _on_emit(self, chunk_index: int, frame_index: int, emit_t: float) -> None:
        """The pacer sends a chunk's first frame (loop thread): its controls have reached the screen."""
        for older in [k for k in self._awaiting_display if k < chunk_index]:
            del self._awaiting_display[older]  # its frames were dropped unseen
        for arrived in self._awaiting_display.pop(chunk_index, ()):
            latency = max(0.0, emit_t - arrived)
            if self.timeline is not None:
                self.timeline.control_shown(arrived, emit_t)
            self._control_to_frame.append(latency)
            self.metrics.control_to_frame.observe(latency)

    # Engine callbacks come on its scheduler thread: hand them to the loop.

    def _chunk_from_engine(self, out: ChunkOutput) -> None:
        self.loop.call_soon_threadsafe(self._on_chunk, out)

    def _end_from_engine(self, session_id: str, error: str | None) -> None:
        self.loop.call_soon_threadsafe(self._on_engine_end, session_id, error)

    def _on_engine_end(self, session_id: str, error: str | None) -> None:
        if error is not None and self.state in ACTIVE and session_id == self.engine_session:
            why, detail = generation_failed_reason(error), f"generation failed: {error}"
            self._tasks.spawn(self.close(EndReason.GENERATION_FAILED, why, detail=detail), "close")

    def _count(self, result: str) -> None:
        self.controls[result] += 1
        self.metrics.control_messages.labels(result).inc()

    def _note_invalid(self, now: float) -> None:
        """Invalid messages are answered one by one; too many in the window close the session."""
        window = self._invalid_t
        window.append(now)
        while window and window[0] < now - self.settings.abuse_window_s:
            window.popleft()
        if len(window) >= self.settings.abuse_limit:
            why = f"{len(window)} invalid messages in {self.settings.abuse_window_s:g} s"
            self._tasks.spawn(self.close(EndReason.PROTOCOL_ABUSE, why), "close")

    # ---- timers ----

    async def _expire_if_no_offer(self) -> None:
        await asyncio.sleep(self.settings.offer_timeout_s)
        if self.state is SessionState.CREATED:
            await self.close(EndReason.NO_OFFER, f"no offer within {self.settings.offer_timeout_s:g} s")

    async def _fail_if_not_connected(self) -> None:
        await asyncio.sleep(self.settings.ice_timeout_s)
        if self.state is SessionState.CONNECTING and (self.pc is None or self.pc.connectionState != "connected"):
            await self.close(EndReason.ICE_TIMEOUT, f"ICE did not connect within {self.settings.ice_timeout_s:g} s")

    async def _watch_peer(self) -> None:
        """Liveness from the connection: once video flows, the viewer's RTCP receiver reports must
        keep coming (any WebRTC client sends them about every second). No application heartbeat."""
        timeout = self.settings.peer_timeout_s
        track, sender = self.track, self.video_sender
        assert track is not None and sender is not None
        await wait_until_silent(sender, lambda: track.delivered > 0, timeout)
        await self.close(EndReason.PEER_GONE, f"the viewer sent no RTCP receiver report for {timeout:g} s")

    async def _expire_when_idle(self, idle_s: float) -> None:
        while True:
            left = self._last_control_t + idle_s - time.monotonic()
            if left <= 0:
                await self.close(EndReason.IDLE, f"no control for {idle_s:g} s")
                return
            await asyncio.sleep(left)

    async def _send_stats(self) -> None:
        sent = dropped = repeated = 0
        interval = self.settings.stats_interval_s
        while True:
            await asyncio.sleep(interval)
            p = self.pacer
            self.metrics.frames_sent.inc(p.sent - sent)
            self.metrics.frames_dropped.inc(p.dropped - dropped)
            self.metrics.frames_repeated.inc(p.repeated - repeated)
            repeats_per_s = (p.repeated - repeated) / interval
            sent, dropped, repeated = p.sent, p.dropped, p.repeated
            info = self.info()["metrics"]
            with self._lock:
                d = self.dispatch.stats(time.monotonic())
            chunk_media_s = self.dispatch.config.chunk_media_s
            self._broadcast(
                StatsMsg(
                    fps=self.fps,
                    dispatch=d.policy,
                    frames_sent=p.sent,
                    frames_dropped=p.dropped,
                    frames_repeated=p.repeated,
                    repeats_per_s=repeats_per_s,
                    chunk_period_p50_s=info["chunk_period_p50_s"],
                    real_time_factor=info["real_time_factor"],
                    buffered_ms=1000 * d.buffered_s,
                    chunks_in_flight=d.chunks_in_flight,
                    predicted_latency_s=d.predicted_start_to_display_s,
                    # A control waits for the next chunk start: half a chunk period on average.
                    predicted_control_to_frame_s=None
                    if d.predicted_start_to_display_s is None
                    else chunk_media_s / 2 + d.predicted_start_to_display_s,
                    control_to_frame_p50_s=info["control_to_frame_p50_s"],
                    start_to_pacer_quantile_s=d.latency_s,
                    start_to_pacer_p50_s=d.measured_latency_p50_s,
                    dispatch_lateness_s=d.lateness_s,
                    behind=self.behind,
                    controls_accepted=self.controls["accepted"],
                    controls_refused=self.controls["rate_limited"] + self.controls["invalid"],
                    spectators=len(self.spectators),
                )
            )

    async def _expire(self, after_s: float) -> None:
        await asyncio.sleep(after_s)
        await self.close(EndReason.MAX_DURATION, f"the session reached its maximum duration of {after_s:g} s")

    # ---- helpers ----

    def _real_time_factor(self, sorted_periods: list[float]) -> float | None:
        """p95 chunk period / chunk media duration (< 1: generation is ahead of playback)."""
        if not sorted_periods:
            return None
        p95 = sorted_periods[min(len(sorted_periods) - 1, int(0.95 * len(sorted_periods)))]
        return p95 / self.dispatch.config.chunk_media_s

    def _send(self, message: ServerMessage) -> None:
        self._send_text(message.to_json())

    def _send_text(self, text: str) -> None:
        send_on(self.channel, text)

    def _broadcast(self, message: ServerMessage) -> str:
        """To the driver and every spectator, serialized once; returns the text sent."""
        text = message.to_json()
        self._send_text(text)
        for spectator in self.spectators.values():
            spectator.send_text(text)
        return text

    def _send_error(self, code: str, message: str) -> None:
        self.metrics.errors.labels(code).inc()
        self._send(ErrorMsg(code=code, message=message))


def generation_failed_reason(error: str) -> str:
    """What a viewer reads when the engine fails its session: which stage, and what to do. A stage's
    exception (after RAISED) is for the operator: the log and the REST record's `error`."""
    stage, raised, _ = error.partition(RAISED)
    return f"generation failed: {stage + ' stopped with an error' if raised else error}; start a new session"


def _median(samples: deque[float]) -> float | None:
    return sorted(samples)[len(samples) // 2] if samples else None
