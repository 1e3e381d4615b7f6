"""One driver's session: a small enum state machine that owns the parts it is made of and wires them.

    created ──offer──▶ connecting ──first frames in the pacer──▶ streaming ──▶ closing ──▶ closed
        │                  │  (generation starts when the driver is ready)          ▲
        └── no offer in offer_timeout_s / the driver gone / could not generate ─────┴──▶ failed

The parts, each with one job (and data flowing one way through them):

    DriverPeer (server/peers/driver_peer.py)      the driver's connection, control channel and liveness
      ──raw messages──▶ Inbox (server/session/inbox.py)          rate, parse, abuse
      ──controls──▶ ControlSource (server/session/control_source.py)   what the engine's scheduler samples
    engine (scheduler thread) ──chunks, handed to the loop──▶ MediaLine (server/session/media_line.py)
                                                      pacer → fan-out → viewers; recorder; figures
    Audience (server/session/audience.py)           spectators and the watch token

The session decides every transition: a part reports (the driver is ready, the driver is gone,
messages abuse the protocol) and the session acts. Snapshots and rewinds are transitions too: both
only from `streaming`; a rewind replaces the engine session under the same connection, pacer and
fan-out, and frames of an engine session that is not the current one are ignored. Every wait has a
timeout (the deadlines: server/session/timers.py), every task is owned here and cancelled on close,
and `close()` is idempotent, tearing down in reverse order of setup (spectators, engine session,
media line, peer); its `EndReason` goes to the driver in `done`, and to its spectators as
driver_left.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from enum import StrEnum
from typing import Any, Literal

from server.common.errors import AlreadyConnected, BadRequest, SessionClosed
from server.common.metrics import Metrics
from server.common.owned_tasks import OwnedTasks
from server.common.settings import Settings
from server.media.recording import SessionRecording
from server.media.recording_store import RecordingStore
from server.media.timeline import SessionTimeline
from server.peers.driver_peer import DriverPeer
from server.peers.offer import OfferError
from server.peers.spectator import Spectator
from server.session.audience import Audience
from server.session.control_source import ControlSource
from server.session.engine_link import EngineLink
from server.session.inbox import Inbox
from server.session.media_line import MediaLine
from server.session.spec import SessionSpec
from server.session.stats import PacerCounters, stats_message
from server.session.timers import SessionTimers
from server.snapshots.snapshot import MadeWith, ServerSnapshot
from server.wire.dispatch import DispatchConfig, DispatchPolicy
from server.wire.protocol import (
    DoneMsg,
    EndReason,
    ErrorMsg,
    Parent,
    PingMsg,
    PongMsg,
    PromptMsg,
    ReadyMsg,
    RewoundMsg,
    ServerMessage,
    StopMsg,
    TurnEndingMsg,
)
from workers.families.registry import family_for
from workers.models.presets import ModelPreset
from workers.runtime.engine import PipelineEngine
from workers.runtime.messages import RAISED
from workers.runtime.records import ChunkOutput
from workers.runtime.snapshot_catalog import SnapshotGone
from workers.runtime.supervisor import EngineError

log = logging.getLogger("worldrtc.session")


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
        spec: SessionSpec,
        dispatch: DispatchPolicy | None = None,
        recordings: RecordingStore | None = None,
        weights_digest: str = "",
        branch_of: ServerSnapshot | None = None,
        offer_timeout_s: float | None = None,
    ) -> None:
        self.id = secrets.token_hex(8)
        self.token = secrets.token_urlsafe(24)
        self.preset, self.settings, self.metrics, self.spec = preset, settings, metrics, spec
        self.origin = spec.origin(line=self.id) if branch_of is None else branch_of.origin
        self._start_from = branch_of  # the snapshot the engine session opens from (a rewind changes it)
        self.parent: Parent | None = None if branch_of is None else branch_of.as_parent()
        self.state = SessionState.CREATED
        self.created_t = time.monotonic()
        self.error: str | None = None
        self.ended: EndReason | None = None
        self.first_frame_s: float | None = None
        self._recordings, self._weights_digest = recordings, weights_digest
        policy = dispatch or settings.dispatch
        config = DispatchConfig(policy, spec.fps, spec.chunk_latent_frames, settings.dispatch_margin_ms / 1000)
        self.controls = ControlSource(
            config, on_taken=lambda i, control, reset: self.line.control_taken(i, control, reset)
        )
        frames_before = 0 if branch_of is None else branch_of.frames
        self.line = MediaLine(spec.fps, spec.chunk_latent_frames, self.controls, metrics, frames_before)
        self.audience = Audience(self.id, self.line.fanout, settings, metrics)
        self.peer = DriverPeer(
            self.id, settings, metrics, self.line.fanout, self._start_streaming, self._on_message, self._end
        )
        self.inbox = Inbox(
            settings,
            metrics,
            time.monotonic(),
            send_error=self._send_error,
            on_abuse=lambda why: self._end(EndReason.PROTOCOL_ABUSE, why),
        )
        self.engine = engine
        self.link = EngineLink(engine, self.controls.sample, self._on_chunk, self._on_engine_failed)
        self._tasks = OwnedTasks(f"session-{self.id}")
        self._closed = asyncio.Event()
        self.timers = SessionTimers(self._tasks, self.close)
        offer_within_s = settings.offer_timeout_s if offer_timeout_s is None else offer_timeout_s
        self.timers.expect_offer(offer_within_s, lambda: self.state is SessionState.CREATED)

    # ---- what it tells ----

    def timeline_report(self, window_s: float | None = None) -> dict[str, Any]:
        """The recent stage timeline (server/media/timeline.py); empty until generation starts."""
        return {"session_id": self.id, "state": self.state.value} | self.line.timeline_report(window_s)

    def ready_message(self, role: Literal["driver", "spectator"]) -> ReadyMsg:
        policy = self.controls.config.policy
        return self.spec.ready_message(self.id, self.preset, self.settings, policy, role, self.parent)

    # ---- transitions ----

    async def accept_offer(self, sdp: str) -> str:
        if self.state in (SessionState.CONNECTING, SessionState.STREAMING):
            raise AlreadyConnected(f"session {self.id} already has a connection; create a new session to connect again")
        if self.state is not SessionState.CREATED:
            raise SessionClosed(f"session {self.id} is {self.state.value}; create a new session")
        self.state = SessionState.CONNECTING
        try:
            return await self.peer.answer(sdp)
        except OfferError as exc:
            await self.close(EndReason.BAD_OFFER, f"bad offer: {exc}")
            raise BadRequest(str(exc)) from None

    def _start_streaming(self) -> None:
        """The driver is ready (its control channel open, or ICE for a watch-only viewer): generate."""
        if self.state is not SessionState.CONNECTING or self.link.current is not None:
            return
        self.peer.send(self.ready_message("driver"))
        self._open_t = time.monotonic()
        timeline = SessionTimeline(self._open_t, time.perf_counter())  # the engine's clock: stage times
        recipe = self.spec.recipe(self.preset, self.engine.placement, self._weights_digest, self.engine.savings)
        recording = None if self._recordings is None else SessionRecording(self.id, recipe, self._recordings)
        self.line.open(recording, timeline, [] if self._start_from is None else self._start_from.history or [])
        if not self._open_engine_session():
            return
        counters, settings = PacerCounters(self.line.pacer, self.metrics), self.settings
        self.timers.streaming(
            settings.idle_timeout_s,
            lambda: self.controls.last_control_t,
            self.spec.max_duration_s,
            settings.stats_interval_s,
            lambda: self._broadcast(self._stats(counters.count() / settings.stats_interval_s)),
        )

    def _open_engine_session(self) -> bool:
        """Generate from the start image or from `_start_from`; False (and closing) if it cannot."""
        s, start = self.spec, self._start_from
        try:
            self.link.open(
                s.image, s.prompt, s.seed, s.chunk_latent_frames, None if start is None else start.snapshot_id
            )
        except (EngineError, ValueError, SnapshotGone) as exc:
            self._end(EndReason.GENERATION_FAILED, f"could not start generating: {exc}")
            return False
        return True

    async def snapshot(self, wait_s: float) -> ServerSnapshot:
        """The generation state saved at the next chunk boundary, with the recording up to it."""
        self._require_streaming("saved")
        entry = await self.link.save(wait_s)
        recording = self.line.recording
        history = None if recording is None else await asyncio.to_thread(recording.history, entry.chunk_index)
        made_with = MadeWith.of(self.preset.name, self._weights_digest, self.engine.placement, self.engine.savings)
        return ServerSnapshot.of(entry, self.id, self.origin, self.parent, history, made_with)

    async def restore(self, snapshot: ServerSnapshot) -> None:
        """Rewind to `snapshot` in place: the same connection goes on, showing frames from it."""
        self._require_streaming("rewound")
        self.engine.snapshots.use(snapshot.snapshot_id)  # SnapshotGone before anything is torn down
        self.link.close()
        discarded = self.line.rewind(snapshot.frames, snapshot.history or [])
        self.controls.restart_dispatch()
        self._start_from, self.parent = snapshot, snapshot.as_parent()
        log.info(
            "session %s rewound to snapshot %s (chunk %d); %d queued frames discarded",
            self.id,
            snapshot.snapshot_id,
            snapshot.chunk_index,
            discarded,
            extra={"session_id": self.id},
        )
        self.peer.send(RewoundMsg(parent=self.parent))
        self._open_engine_session()

    def turn_ending(self, seconds_left: float) -> None:
        """Someone waits for this slot: tell the driver when its turn ends (the usher then closes it)."""
        self.peer.send(TurnEndingMsg(seconds_left=round(seconds_left, 1)))

    def _require_streaming(self, verb: str) -> None:
        if self.state is not SessionState.STREAMING or self.link.current is None:
            raise SessionClosed(f"session {self.id} is {self.state.value}: only a streaming session can be {verb}")

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
            self.peer.send(ErrorMsg(code="session_failed", message=reason))
        self.peer.send(DoneMsg(code=code, reason=reason))
        watchers_code = EndReason.SERVER_SHUTDOWN if code is EndReason.SERVER_SHUTDOWN else EndReason.DRIVER_LEFT
        await self.audience.close_all(watchers_code, f"the session ended ({code.value})")
        self.link.close()
        # A closed session stays listed for closed_session_keep_s with its figures, not its media:
        # its encoders, pacer and connection go now.
        await self.line.close()
        await self._tasks.cancel_all()
        await self.peer.close()
        self.state = SessionState.FAILED if failed else SessionState.CLOSED
        why = detail or reason
        log.info(
            "session %s %s: %s",
            self.id,
            self.state.value,
            why,
            extra={"session_id": self.id, "state": self.state.value, "reason": why},
        )
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # ---- spectators (the audience; the session says whether there is anything to watch) ----

    async def add_spectator(self, sdp: str, token: str) -> tuple[Spectator, str]:
        """A spectator watching with `token` (checked by the caller), and its SDP answer."""
        self._require_active()
        return await self.audience.add(sdp, token, self.ready_message("spectator"))

    async def new_watch_token(self) -> str:
        """Revoke the current watch token (its spectators end) and issue another."""
        await self.audience.revoke()
        self._require_active()
        return self.audience.issue_token()

    def _require_active(self) -> None:
        if self.state not in ACTIVE:
            raise SessionClosed(f"session {self.id} is {self.state.value}: there is nothing to watch")

    # ---- what the parts report ----

    def _end(self, code: EndReason, reason: str, detail: str | None = None) -> None:
        self._tasks.spawn(self.close(code, reason, detail), "close")

    def _on_message(self, data: str | bytes) -> None:
        if self.state not in ACTIVE:
            return
        now = time.monotonic()
        msg = self.inbox.receive(data, now)
        if msg is None:
            return
        if isinstance(msg, PingMsg):
            self.peer.send(PongMsg(seq=msg.seq, t=msg.t, server_t=time.time() * 1000))
        elif isinstance(msg, StopMsg):
            self._end(EndReason.STOPPED, "stopped by the client")
        elif isinstance(msg, PromptMsg):
            if family_for(self.preset).live_prompts:  # from the DiT's next chunk (the chunk receipts say which)
                self.link.set_prompt(msg.text, msg.transition_chunks)
            else:
                self.metrics.errors.labels("not_supported").inc()
                self._send_error("not_supported", f"{self.preset.name} takes no text: its prompt cannot change")
        else:
            self.controls.apply(msg, now)

    def _send_error(self, code: str, message: str) -> None:
        self.peer.send(ErrorMsg(code=code, message=message))

    def _on_chunk(self, out: ChunkOutput) -> None:
        """Part of a chunk's frames (loop thread)."""
        if self.state not in (SessionState.CONNECTING, SessionState.STREAMING):
            return
        chunk = self.line.push(out)
        if self.state is SessionState.CONNECTING and self.line.first_frames_t is not None:
            self.state = SessionState.STREAMING
            self.first_frame_s = self.line.first_frames_t - self._open_t
        if chunk is not None:
            self._broadcast(chunk, chunk=True)

    def _on_engine_failed(self, error: str) -> None:
        if self.state in ACTIVE:
            self._end(EndReason.GENERATION_FAILED, generation_failed_reason(error), f"generation failed: {error}")

    def _stats(self, repeats_per_s: float) -> ServerMessage:
        dispatch = self.controls.stats(time.monotonic())
        accepted, refused = self.inbox.counts["accepted"], self.inbox.refused
        return stats_message(self.line, dispatch, repeats_per_s, accepted, refused, len(self.audience))

    def _broadcast(self, message: ServerMessage, *, chunk: bool = False) -> None:
        """To the driver and every spectator, serialized once."""
        text = message.to_json()
        self.peer.send_text(text)
        self.audience.send_text(text, chunk=chunk)


def generation_failed_reason(error: str) -> str:
    """What a viewer reads when the engine fails its session: which stage, and what to do. A stage's
    exception (after RAISED) is for the operator: the log and the REST record's `error`."""
    stage, raised, _ = error.partition(RAISED)
    return f"generation failed: {stage + ' stopped with an error' if raised else error}; start a new session"
