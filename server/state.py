"""The app's state: the engine, its sessions and everything the routes share, one per app.

`create_app` (server/http/app.py) builds it, puts it on `app.state.worldrtc` and starts and stops it with
the app; the routes reach it through a FastAPI dependency (server/http/dependencies.py), and the process
runner (server/http/lifecycle.py) drains and stops it. What belongs to the state is here: whether a new
session may start now and, if so, its admission (rate, slots, start image), the engine's load in
the background, and the shutdown that ends every session.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request

from server.common.errors import (
    BadRequest,
    Busy,
    Draining,
    Loading,
    QueueFull,
    RateLimited,
    Restarting,
    ServerError,
)
from server.common.memory import MemoryReclaimer, freeze_startup_objects
from server.common.metrics import LoopLagMonitor, Metrics
from server.common.phase import Phase
from server.common.rate_limit import PerClientLimiter, client_address
from server.common.settings import Settings
from server.media.recording_store import RecordingStore
from server.peers.ice import host_addresses, keep_local_candidates
from server.session.session import ACTIVE, ServerSession
from server.session.spec import SessionSpec
from server.session.start_image import start_image
from server.snapshots.book import SnapshotBook
from server.snapshots.saves import SavedSnapshots
from server.snapshots.shelf import SnapshotShelf
from server.snapshots.snapshot import MadeWith, ServerSnapshot
from server.startup.memory_fit import MemoryFit, fit_memory
from server.waiting_room.admission import Admission
from server.waiting_room.line import QueueConfig, Ticket, WaitingRoom
from server.wire.protocol import CreateSessionRequest, EndReason
from workers.models.loading import model_events
from workers.models.weights_digest import weights_digest
from workers.runtime.engine import PipelineEngine
from workers.runtime.placement import get_placement
from workers.runtime.snapshot_catalog import SnapshotBudget
from workers.runtime.synthetic import SYNTHETIC, resolve_model

log = logging.getLogger("worldrtc.server")

WORKER_GRACE_S = 10.0  # stopping workers may finish their command this long, then are killed


@dataclass(frozen=True)
class Queued:
    """A create that waits: its ticket, and the ticket's token (shown once, in the 202)."""

    ticket: Ticket
    token: str


class AppState:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.preset, synthetic = resolve_model(
            settings.model, settings.stage_ms, settings.synthetic_geometry, settings.synthetic_state_mib
        )
        placement = get_placement(settings.placement)
        # What runs: the savings asked for, and more where the plan needs them (server/startup/);
        # the synthetic model needs none, and its snapshots are tiny.
        fit = MemoryFit(settings.savings, 0) if synthetic else fit_memory(settings, self.preset, placement)
        self.savings, self.snapshot_plan_bytes = fit.savings, fit.snapshot_plan_bytes
        # Constructing the engine validates the placement against the model: a bad one fails now.
        self.engine = PipelineEngine(
            self.preset,
            placement,
            "pipelined",
            max_sessions=settings.max_sessions,
            checkpoint_dir=settings.checkpoint_dir,
            weights_seed=settings.weights_seed,
            random_weights=settings.random_weights,
            synthetic=synthetic,
            kernels=settings.kernels,
            savings=self.savings,
            snapshot_budget=SnapshotBudget(
                memory_bytes=int(settings.snapshot_budget_gib * 2**30),
                spill_dir=settings.snapshot_spill_dir,
                spill_bytes=int(settings.snapshot_spill_gib * 2**30),
            ),
        )
        self.placement = placement
        self.fps = settings.fps or self.preset.fps  # sessions' default frame rate
        self.metrics = Metrics()
        self.lag = LoopLagMonitor(self.metrics)
        self.sessions: dict[str, ServerSession] = {}
        self.snapshot_book = SnapshotBook(lambda: {s.origin.line for s in self.sessions.values()})
        self.tasks: set[asyncio.Task[None]] = set()  # app-owned background tasks, cancelled at shutdown
        self.ready = False
        self.load_error: str | None = None
        self.ready_s: float | None = None
        self.on_ready: Callable[[], None] | None = None
        self.phase = Phase.SERVING
        # Set by the process runner (server/http/lifecycle.py): stop with this exit status. Without one
        # (an app inside tests) a broken engine only shows in /readyz.
        self.request_exit: Callable[[int], None] | None = None
        self.worker_grace_s = WORKER_GRACE_S

        # Bound to loopback, offers keep only candidates on this host (server/peers/ice.py).
        self.own_addresses = host_addresses() if settings.is_loopback else None
        self.create_limiter = PerClientLimiter(settings.create_rate_per_min / 60, settings.create_burst)
        self._admitting = 0  # creates past the capacity check, still decoding their image
        self.reclaimer = MemoryReclaimer()
        self.recordings = RecordingStore(settings.recordings_dir, int(settings.recordings_quota_mib * 2**20))
        self.saves = (
            None
            if settings.snapshot_dir is None
            else SavedSnapshots(settings.snapshot_dir, int(settings.snapshot_dir_quota_gib * 2**30))
        )
        self.shelf = SnapshotShelf(self.snapshot_book, self.engine, self.saves)
        # What recordings name the weights by (server/media/recording.py); read from the files while loading.
        self.weights_digest = SYNTHETIC if synthetic is not None else ""
        # The world events the weights learned (their model card's `events`: name -> prompt), for the
        # page's chips; read while loading.
        self.events: dict[str, str] = {}
        self._loader: asyncio.Task[None] | None = None
        config = QueueConfig(
            max_waiting=settings.queue_max,
            per_client=settings.queue_per_client,
            silence_s=settings.ticket_silence_s,
            connect_window_s=settings.connect_window_s,
            max_turn_s=settings.max_turn_s,
        )
        self.waiting_room = WaitingRoom(config)
        # Rung when a slot frees or a ticket joins: the usher (server/waiting_room/usher.py) wakes to seat the head.
        self.doorbell = asyncio.Event()

    def start(self) -> None:
        """At app start, on the loop: watch the loop's lag, and load the engine in the background."""
        self.lag.start()
        self._loader = asyncio.create_task(self._load(), name="engine-load")

    async def stop(self) -> None:
        """At app shutdown: every session ends with `server_shutdown`, background work is cancelled,
        the workers stop (killed after `worker_grace_s`) and the recordings close."""
        bye = "the server is shutting down"
        await asyncio.gather(*(s.close(EndReason.SERVER_SHUTDOWN, bye) for s in self.sessions.values()))
        tasks = [task for task in (self._loader, *self.tasks) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(self.engine.shutdown, self.worker_grace_s)
        self.recordings.close()
        await self.lag.stop()

    async def _load(self) -> None:
        """Start the engine's workers and run the warm-up chunks; `ready` after that, or the failure
        recorded (`load_error`) and the process asked to exit."""
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        self.engine.on_fatal = lambda error: loop.call_soon_threadsafe(self.engine_failed, error)
        settings = self.settings
        try:
            if not self.weights_digest:
                self.weights_digest = await asyncio.to_thread(
                    weights_digest, self.preset, settings.checkpoint_dir, settings.weights_seed
                )
                if not settings.random_weights:
                    self.events = await asyncio.to_thread(model_events, self.preset, settings.checkpoint_dir)
            await asyncio.to_thread(self.engine.start)
            await asyncio.to_thread(self.engine.warm_up)
            if self.saves is not None:
                self.shelf.read_saves(await asyncio.to_thread(self.saves.scan))
        except Exception as exc:
            self.load_error = str(exc)
            self.engine_failed(f"it did not start: {self.load_error}")
            return
        freeze_startup_objects()  # before any session: what is alive now lives as long as the process
        self.ready = True
        self.ready_s = time.monotonic() - t0
        if self.on_ready is not None:
            self.on_ready()

    @property
    def made_with(self) -> MadeWith:
        """What this server's snapshots are made with (a branch must run on the same)."""
        return MadeWith.of(self.preset.name, self.weights_digest, self.placement, self.savings)

    def active_sessions(self) -> int:
        return sum(s.state in ACTIVE for s in self.sessions.values())

    def require_ready(self) -> None:
        """Raise unless new sessions can start now."""
        if self.load_error is not None:
            raise ServerError(f"the engine failed to start: {self.load_error}")
        if self.engine.fatal_error is not None:
            raise ServerError(f"the engine failed: {self.engine.fatal_error}")
        if self.phase is not Phase.SERVING:
            raise Draining("the server is shutting down; connect to another instance", retry_after_s=5)
        if not self.ready:
            raise Loading("the model is loading; retry shortly", retry_after_s=2)
        if not self.engine.healthy:
            raise Restarting("a stage worker is restarting after a failure; retry shortly", retry_after_s=2)

    def node_url(self, path: str) -> str:
        """`path` on this node: absolute with WORLDRTC_PUBLIC_URL (behind a balancer), else as is."""
        return f"{self.settings.public_url or ''}{path}"

    def free_slots(self) -> int:
        return max(0, self.settings.max_sessions - self.active_sessions() - self._admitting)

    def engine_failed(self, error: str) -> None:
        """The engine cannot serve any more (on the loop): every session ends, the process exits 1."""
        log.error("the engine failed: %s", error)
        if self.request_exit is not None:
            self.request_exit(1)

    def authorize_snapshot(self, snapshot_id: str, request: Request) -> ServerSnapshot:
        """The snapshot, if the request's bearer may use it (server/snapshots/book.py)."""
        return self.snapshot_book.authorize(snapshot_id, request, self.settings.api_token, self.engine.snapshots)

    async def admit(self, body: CreateSessionRequest, request: Request, *, may_wait: bool) -> ServerSession | Queued:
        """A session in state `created`, waiting for its offer (REST create, or WHEP); or, when every
        slot is taken (or others wait already) and the create may wait, a ticket in the waiting room.
        The request's address counts against the per-client creation rate, and its bearer must open
        the snapshot of a branch. Every refusal comes before any work."""
        self.require_ready()
        settings = self.settings
        client = client_address(request)
        branch_of = None
        if body.snapshot is not None:
            given = body.model_fields_set - {"snapshot", "fps", "max_duration_s", "dispatch", "queue"}
            if given:
                raise BadRequest(
                    f"a branch continues its snapshot's {', '.join(sorted(given))}: send 'snapshot' without them"
                )
            branch_of = self.authorize_snapshot(body.snapshot, request)
            self.shelf.require_compatible(branch_of, self.made_with)
        wait_s = self.create_limiter.take(client, time.monotonic())
        if wait_s is not None:
            self.metrics.sessions_refused.labels("rate_limited").inc()
            rate = f"{settings.create_burst} at once, then {settings.create_rate_per_min:g} a minute"
            raise RateLimited(f"too many sessions created from {client} ({rate})", retry_after_s=wait_s)
        # Nobody passes the people in line: a slot that frees goes to the head ticket (server/waiting_room/usher.py).
        full = self.free_slots() == 0 or len(self.waiting_room) > 0
        waits = full and may_wait and settings.queue and body.queue
        if full and not waits:
            self.metrics.sessions_refused.labels("busy").inc()
            raise Busy(f"all {settings.max_sessions} session slots are in use; retry later", retry_after_s=5)
        if body.fps is not None and 90_000 % body.fps:
            raise BadRequest(
                f"fps {body.fps} does not divide the 90 kHz video clock; use e.g. 10, 12, 15, 16, 20, 24, 25, 30"
            )
        dit = self.preset.dit
        if body.chunk_frames is not None and dit.local_attn_size_frames != -1:
            room = dit.local_attn_size_frames - dit.sink_size_frames - 1
            if body.chunk_frames > room:
                raise BadRequest(
                    f"chunk_frames {body.chunk_frames} does not fit the attention window; use at most {room}"
                )
        if branch_of is not None:
            scene, image = branch_of.origin.scene, branch_of.origin.image
        else:
            # A create that takes a slot holds it while its image decodes off the loop; one that waits
            # decodes it now too, so that a bad image is told now rather than when its turn comes.
            holds = 0 if waits else 1
            self._admitting += holds
            try:
                scene, image = await asyncio.to_thread(start_image, body, self.preset, settings)
            finally:
                self._admitting -= holds
        admission = Admission(body, client, scene, image, branch_of)
        if waits:
            try:
                ticket, token = self.waiting_room.join(admission, client, time.monotonic())
            except QueueFull:
                self.metrics.sessions_refused.labels("queue_full").inc()
                raise
            self.metrics.queue_length.set(len(self.waiting_room))
            self.doorbell.set()
            return Queued(ticket, token)
        return self.open_session(admission)

    async def new_session(self, body: CreateSessionRequest, request: Request) -> ServerSession:
        """A session now, or 429 busy (a WHEP offer: its client cannot hold a ticket)."""
        admitted = await self.admit(body, request, may_wait=False)
        assert isinstance(admitted, ServerSession)  # may_wait=False never queues
        return admitted

    def open_session(self, admission: Admission, offer_timeout_s: float | None = None) -> ServerSession:
        """The admitted session, in state `created`: now, or when a ticket is seated (with the
        ticket's connect window as its offer deadline)."""
        body, settings = admission.body, self.settings
        spec = SessionSpec.resolve(
            self.preset,
            settings,
            admission.image,
            body.prompt,
            body.seed,
            body.max_duration_s,
            body.fps,
            body.chunk_frames,
            admission.scene,
            admission.branch_of,
        )
        session = ServerSession(
            self.engine,
            self.preset,
            settings,
            self.metrics,
            spec,
            dispatch=body.dispatch,
            recordings=self.recordings if settings.record else None,
            weights_digest=self.weights_digest,
            branch_of=admission.branch_of,
            offer_timeout_s=offer_timeout_s,
        )
        self.sessions[session.id] = session
        self.shelf.joined(session.origin.line, session.token)
        self._forget_when_closed(session)
        return session

    async def local_offer(self, sdp: str) -> str:
        """An offer as the server answers it: on loopback, without candidates off this host."""
        if self.own_addresses is not None:
            sdp = keep_local_candidates(sdp, self.own_addresses)
        return sdp

    def spectator_count(self) -> int:
        return sum(len(s.audience) for s in self.sessions.values())

    def _forget_when_closed(self, session: ServerSession) -> None:
        # Owned by the app, not the session: the session cancels its own tasks when it closes.
        async def forget() -> None:
            await session.wait_closed()
            self._own(self.reclaimer.session_closed())
            if session.first_frame_s is not None:  # a turn that was driven: what the estimate learns from
                self.waiting_room.turns.ended(time.monotonic() - session.created_t)
            self.doorbell.set()  # a slot is free: the usher seats the head ticket
            await asyncio.sleep(self.settings.closed_session_keep_s)
            self.sessions.pop(session.id, None)
            self.recordings.remove(session.id)

        self._own(asyncio.get_running_loop().create_task(forget(), name=f"forget-{session.id}"))

    def _own(self, task: asyncio.Task[None] | None) -> None:
        """Keep a background task until it is done (and cancel it at shutdown)."""
        if task is not None:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
