"""The pipeline engine: stage worker processes and the thread that feeds them (no model code here).

Stages encode → DiT → decode run in their own processes (`supervisor.py`; ranks of a stage run in
lockstep: every command goes to every rank, and the stage is done when all have replied). Every
decision — which command goes where and when, epochs, bounds, close ordering, slot bookkeeping —
is the scheduler's (`scheduler.py`), which this façade feeds with replies and clock readings and
whose effects it carries out: sending commands, handing slots back, copying frames out of the
frame ring for a session's callback, ending sessions.

One scheduler thread owns all of it; the public methods are thread-safe and only enqueue requests,
so an asyncio server can call them without blocking its loop. The thread wakes on a worker reply, a
worker's death (process sentinel), a request, a control source's Hold or a command's deadline, or
LOOP_TICK_S.

`warm_up` runs two chunks through every stage so no viewer pays first-call costs. A stage that dies,
fails fatally or hangs past its command deadline fails every session, is killed and restarted at
once, and the engine warms up again; `healthy` is False until then, and sessions opened meanwhile
end with an error. A stage that dies takes its parts of every snapshot with it, so every snapshot is
lost then (workers/runtime/snapshot_catalog.py). If a restart fails the engine is broken for good:
`fatal_error` says why and `on_fatal` is called (the server exits non-zero, so whatever supervises
it can start it afresh).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.controls import ChunkControl
from workers.models.checkpoint_files import require_checkpoint
from workers.models.kernels import DEFAULT_KERNELS, KernelConfig
from workers.models.presets import ModelPreset, get_preset
from workers.models.savings import NO_SAVINGS, Savings
from workers.runtime.channel import ChannelConsumer
from workers.runtime.chunk_rules import Schedule
from workers.runtime.effects import Deliver, Effect, Ended, ReleaseSlots, Send, SnapshotDone, StageLost
from workers.runtime.lanes import Deadlines
from workers.runtime.messages import (
    STAGES,
    DropSnapshot,
    KeepSnapshot,
    QueryStats,
    Release,
    Reply,
    Shutdown,
    SnapshotKept,
    SpillSnapshot,
    Stage,
    StageStats,
)
from workers.runtime.placement import Placement
from workers.runtime.records import ChunkOutput
from workers.runtime.savings_plan import check_savings
from workers.runtime.scheduled_session import ControlSource, SessionSpec
from workers.runtime.scheduler import Scheduler
from workers.runtime.snapshot_catalog import (
    Move,
    SnapshotBudget,
    SnapshotCatalog,
    SnapshotEntry,
    SnapshotGone,
    new_entry,
)
from workers.runtime.spec import FaultSpec, WorkerSpec
from workers.runtime.supervisor import EngineError, WorkerSupervisor
from workers.runtime.synthetic import SyntheticModel

log = logging.getLogger(__name__)
LOOP_TICK_S = 0.05  # how often the scheduler thread wakes with nothing to do (deaths ride on sentinels)
DEFAULT_SNAPSHOT_BUDGET = SnapshotBudget(memory_bytes=4 * 2**30)


@dataclass
class _Keeping:
    """A snapshot being written to disk: the ranks that have not replied yet, and what went wrong."""

    directory: Path
    waiting: set[tuple[Stage, int]]
    errors: list[str]
    on_done: Callable[[str | None], None]


# (the entry, or None and why not): called once per snapshot asked for, on the scheduler thread.
SnapshotCallback = Callable[[SnapshotEntry | None, str | None], None]


class PipelineEngine:
    def __init__(
        self,
        preset: str | ModelPreset,
        placement: Placement,
        schedule: str = "pipelined",
        max_sessions: int = 4,
        checkpoint_dir: str | Path | None = None,
        weights_seed: int = 0,
        prefetch_chunks: int = 2,
        edge_capacity: int = 2,
        synthetic: SyntheticModel | None = None,
        faults: dict[Stage, FaultSpec] | None = None,
        start_timeout_s: float = 300.0,
        deadlines: Deadlines | None = None,
        kernels: KernelConfig = DEFAULT_KERNELS,
        random_weights: bool = False,
        snapshot_budget: SnapshotBudget = DEFAULT_SNAPSHOT_BUDGET,
        savings: Savings = NO_SAVINGS,
    ) -> None:
        """`random_weights`: seeded random weights for a preset that runs on released ones, for timing
        and memory on a machine without its checkpoint (the frames are noise)."""
        try:
            plan = Schedule(schedule)
        except ValueError:
            raise ValueError(f"schedule must be 'pipelined' or 'serial', got {schedule!r}") from None
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.preset = get_preset(preset) if isinstance(preset, str) else preset
        placement.validate_for(self.preset)
        if random_weights and checkpoint_dir is not None:
            raise ValueError("random_weights and a checkpoint directory exclude each other")
        if synthetic is None and not random_weights:
            require_checkpoint(self.preset, checkpoint_dir)  # before any worker builds anything
        for device in placement.stage_devices(Stage.DIT.value):
            kernels.check(device)  # a kernel the DiT's device cannot run fails here, not in a worker
        check_savings(savings, self.preset, placement)
        self.kernels = kernels
        self.savings = savings
        self.placement = placement
        self.max_sessions = max_sessions
        devices = {s: placement.stage_devices(s.value) for s in STAGES}
        self.scheduler = Scheduler(
            {s: len(d) for s, d in devices.items()}, plan, prefetch_chunks, edge_capacity, deadlines=deadlines
        )
        self.supervisor = WorkerSupervisor(
            {
                s: tuple(
                    WorkerSpec(
                        stage=s,
                        rank=rank,
                        world_size=len(devices[s]),
                        device=str(device),
                        preset=self.preset.name,
                        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
                        weights_seed=weights_seed,
                        parent_pid=os.getpid(),
                        cpu_threads=placement.cpu_threads_per_worker,
                        output_shards=len(devices[Stage.DECODE]) if s is Stage.DIT else 1,
                        kernels=kernels,
                        savings=savings,
                        synthetic=synthetic,
                        fault=(faults or {}).get(s),
                    )
                    for rank, device in enumerate(devices[s])
                )
                for s in STAGES
            },
            start_timeout_s,
        )
        self.consumer = ChannelConsumer(torch.device("cpu"))  # frames arrive in host shared memory
        self._requests: queue.Queue[Callable[[], None]] = queue.Queue()
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stats_waiters: list[tuple[threading.Event, dict[str, Any]]] = []
        self.start_s: float | None = None
        self.fatal_error: str | None = None
        self.on_fatal: Callable[[str], object] | None = None  # called once, on the scheduler thread
        # Sessions counted against max_sessions, from open_session until close_session or their end
        # (the scheduler thread learns of either a little later).
        self._admitted: set[str] = set()
        self._admitted_lock = threading.Lock()
        self._warmed = False  # warm_up ran: restarted stages are warmed up again before `healthy`
        self._warming = False
        self.snapshots = SnapshotCatalog(snapshot_budget)
        self._snapshot_waiters: dict[str, SnapshotCallback] = {}  # scheduler thread only
        self._keeping: dict[str, _Keeping] = {}  # snapshots being written to disk (scheduler thread only)

    @property
    def counters(self) -> dict[str, int]:
        return self.scheduler.counters | {"worker_restarts": self.supervisor.restarts}

    @property
    def healthy(self) -> bool:
        """Started, every stage warm, and not broken (a read from any thread)."""
        return (
            self._thread is not None and self.fatal_error is None and not self._warming and self.supervisor.all_alive()
        )

    # ------------------------------------------------------------------ public, thread-safe

    def start(self) -> None:
        """Spawn every stage's workers and wait until all have loaded their models (warm)."""
        t0 = time.perf_counter()
        self.supervisor.start()
        now = time.perf_counter()
        self.start_s = now - t0
        self.scheduler.origin_t = now
        for stage in STAGES:
            self.scheduler.stage_up(stage, now)
        self._thread = threading.Thread(target=self._loop, name="pipeline-scheduler", daemon=True)
        self._thread.start()

    def warm_up(self, timeout_s: float = 600.0) -> None:
        """One chunk through every stage (first-call costs, and each command kind's deadline history)."""
        done: queue.Queue[str | None] = queue.Queue()
        self._submit(lambda: self._warm(lambda error: done.put(error)))
        try:
            error = done.get(timeout=timeout_s)
        except queue.Empty:
            raise EngineError(f"warm-up did not finish in {timeout_s:g} s") from None
        if error is not None:
            raise EngineError(f"warm-up failed: {error}")
        self._warmed = True

    def open_session(
        self,
        image: np.ndarray,
        prompt: str,
        seed: int,
        control_source: ControlSource,
        on_chunk: Callable[[ChunkOutput], None],
        on_end: Callable[[str, str | None], None],
        chunk_latent_frames: int | None = None,
        max_chunks: int | None = None,
        snapshot: str | None = None,
    ) -> str:
        """Start a session; its chunks' frames stream to `on_chunk` in parts (on the scheduler thread).

        From a `snapshot`, the session continues where the one it was taken from stood (its state,
        seed, prompt and chunk size): `image`, `prompt`, `seed` and `chunk_latent_frames` are not
        used, and its first chunk is the snapshot's `chunk_index`. SnapshotGone if it is not kept."""
        if self._thread is None:
            raise EngineError("engine not started")
        p = self.preset
        first_chunk, snapshot_dir = 0, None
        if snapshot is not None:
            entry = self.snapshots.use(snapshot)
            chunk_latent_frames, first_chunk = entry.chunk_latent_frames, entry.chunk_index
            snapshot_dir = None if entry.saved_dir is None else str(entry.saved_dir)
        chunk = chunk_latent_frames or p.chunk_latent_frames
        if image.shape != (p.height_px, p.width_px, 3) or image.dtype != np.uint8:
            raise ValueError(f"image must be {p.height_px}x{p.width_px}x3 uint8 (fit it to the model first)")
        if p.dit.local_attn_size_frames != -1 and chunk + p.dit.sink_size_frames >= p.dit.local_attn_size_frames:
            raise ValueError(f"chunk of {chunk} latent frames does not fit the attention window")
        session_id = uuid.uuid4().hex[:12]
        with self._admitted_lock:
            if len(self._admitted) >= self.max_sessions:
                raise EngineError(f"engine is full ({self.max_sessions} sessions)")
            self._admitted.add(session_id)
        spec = SessionSpec(
            id=session_id,
            epoch=self.scheduler.next_epoch(),
            seed=seed,
            chunk_latent_frames=chunk,
            image=image,
            prompt=prompt,
            control_source=control_source,
            on_chunk=on_chunk,
            on_end=on_end,
            max_chunks=max_chunks,
            snapshot=snapshot,
            snapshot_dir=snapshot_dir,
            first_chunk=first_chunk,
        )
        self._submit(lambda: self._open(spec))
        return spec.id

    def take_snapshot(self, session_id: str, on_done: SnapshotCallback) -> str:
        """Save the session's whole generation state at its next chunk boundary; `on_done` gets the
        catalog's entry once every stage has stored its part (or None and why not)."""
        snapshot_id = uuid.uuid4().hex[:16]

        def request() -> None:
            self._snapshot_waiters[snapshot_id] = on_done
            self._carry_out(self.scheduler.snapshot(session_id, snapshot_id))

        self._submit(request)
        return snapshot_id

    def keep_snapshot(self, snapshot_id: str, directory: Path, on_done: Callable[[str | None], None]) -> None:
        """Write a kept snapshot's parts to `directory`/<snapshot_id>/ and free their memory; `on_done`
        gets None once every worker's files are complete (the snapshot is then SAVED), or the error.
        Called from any thread; `on_done` runs on the scheduler thread."""

        def request() -> None:
            try:
                self.snapshots.get(snapshot_id)
            except SnapshotGone as gone:
                on_done(str(gone))
                return
            ranks = {(stage, rank) for stage, p in self.supervisor.stages.items() for rank in range(len(p.conns))}
            self._keeping[snapshot_id] = _Keeping(directory, ranks, [], on_done)
            cmd = KeepSnapshot(snapshot_id, str(directory))
            for p in self.supervisor.stages.values():
                for conn in p.conns:
                    with contextlib.suppress(OSError, BrokenPipeError):
                        conn.send(cmd)

        self._submit(request)

    def adopt_saved_snapshot(self, entry: SnapshotEntry) -> None:
        """A snapshot an earlier run saved (its files checked by the caller): sessions may open from it."""
        self.snapshots.add_saved(entry)

    def drop_snapshot(self, snapshot_id: str) -> None:
        """Forget a snapshot (SnapshotGone if it is not kept); its parts are freed in the workers."""
        moves = self.snapshots.remove(snapshot_id)
        self._submit(lambda: self._move(moves))

    def set_prompt(self, session_id: str, text: str, transition_chunks: int = 1, at_chunk: int | None = None) -> None:
        """The session's prompt from the DiT's next chunk once encoded (or, replaying a recording,
        from chunk `at_chunk` exactly), reached over `transition_chunks` chunks (a family with
        `live_prompts`; the caller checks)."""

        def request() -> None:
            try:
                effects = self.scheduler.set_prompt(session_id, text, transition_chunks, at_chunk)
            except ValueError as exc:  # a replay's change for a chunk already started: that session only
                effects = self.scheduler.close(session_id, error=str(exc))
            self._carry_out(effects)

        self._submit(request)

    def close_session(self, session_id: str) -> None:
        with self._admitted_lock:
            self._admitted.discard(session_id)
        self._submit(lambda: self._carry_out(self.scheduler.close(session_id)))

    def stats(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Engine counters plus each stage's channel stats (asks the workers)."""
        done = threading.Event()
        box: dict[str, Any] = {}
        self._submit(lambda: self._query_stats(done, box))
        if not done.wait(timeout_s):
            raise EngineError("stats timed out")
        return box

    def stage_report(self) -> dict[str, Any]:
        """Busy and idle seconds per stage (scheduler-side view), for benchmarks."""
        return self.scheduler.report(time.perf_counter())

    def worker_pids(self) -> dict[str, list[int]]:
        return self.supervisor.pids()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """End every session, stop the workers, release everything. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._thread is not None:
            self._wake()
            self._thread.join(timeout_s)
        for p in self.supervisor.stages.values():
            for conn in p.conns:
                with contextlib.suppress(OSError, BrokenPipeError):
                    conn.send(Shutdown())
        self.supervisor.join(timeout_s)
        self.supervisor.kill_all()
        self._remove_spilled(self.snapshots.lose_all("was lost: the engine shut down"), STAGES)
        self.consumer.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> PipelineEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ scheduler thread

    def _submit(self, fn: Callable[[], None]) -> None:
        self._requests.put(fn)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._wake_w.send_bytes(b"x")

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._step()
            except Exception:
                # A bug here must not hang every client: fail the sessions, keep serving.
                log.exception("scheduler error; failing all sessions")
                self._carry_out(self.scheduler.fail_all("internal scheduler error"))
        self._carry_out(self.scheduler.end_all())

    def _step(self) -> None:
        conn_owner: dict[Connection, tuple[Stage, int]] = {}
        sentinels: dict[int, Stage] = {}
        for stage, p in self.supervisor.stages.items():
            for rank, conn in enumerate(p.conns):
                conn_owner[conn] = (stage, rank)
            for proc in p.procs:
                sentinels[proc.sentinel] = stage
        timeout = min(LOOP_TICK_S, max(0.0, self.scheduler.retry_at - time.perf_counter()))
        for obj in wait([self._wake_r, *conn_owner, *sentinels], timeout=timeout):
            if obj is self._wake_r:
                while self._wake_r.poll():
                    self._wake_r.recv_bytes()
            elif obj in conn_owner:
                stage, rank = conn_owner[obj]
                if self.supervisor.starting(stage):
                    self._on_start_message(stage, rank, obj)
                    continue
                try:
                    while self.supervisor.stages[stage].alive and obj.poll():
                        self._on_reply(stage, rank, obj.recv())
                except (EOFError, OSError):
                    self._carry_out(
                        self.scheduler.stage_down(stage, f"{stage.value} worker rank {rank} exited unexpectedly")
                    )
            else:
                assert isinstance(obj, int)  # a process sentinel
                dead = sentinels[obj]
                if not self.supervisor.starting(dead):  # a start-up death is check_starting's
                    self._carry_out(self.scheduler.stage_down(dead, f"{dead.value} worker died (killed or crashed)"))
        self._check_restarts()
        while True:
            try:
                fn = self._requests.get_nowait()
            except queue.Empty:
                break
            fn()
        self._carry_out(self.scheduler.dispatch(time.perf_counter()))

    def _on_reply(self, stage: Stage, rank: int, msg: Reply) -> None:
        if isinstance(msg, StageStats):
            self._on_stats(stage, rank, msg)
            return
        if isinstance(msg, SnapshotKept):
            self._on_kept(stage, rank, msg)
            return
        self._carry_out(self.scheduler.on_reply(stage, rank, msg, time.perf_counter()))

    # ---- losing and restarting stages ----

    def _on_start_message(self, stage: Stage, rank: int, conn: Connection) -> None:
        try:
            msg = conn.recv()
            if self.supervisor.on_start_message(stage, rank, msg):
                log.info("%s stage restarted", stage.value)
                self.scheduler.stage_up(stage, time.perf_counter())
                if self._warmed and self.supervisor.all_alive():
                    self._warm(self._rewarmed)
        except (EOFError, OSError):
            self._broken(f"{stage.value} worker rank {rank} exited during restart")
        except EngineError as exc:
            self._broken(str(exc))

    def _check_restarts(self) -> None:
        try:
            self.supervisor.check_starting()
        except EngineError as exc:
            self._broken(str(exc))

    def _warm(self, on_done: Callable[[str | None], None]) -> None:
        """Open the warm-up session (scheduler thread)."""
        p = self.preset
        self._warming = True

        def ended(session_id: str, error: str | None) -> None:
            self._warming = False
            on_done(error)

        spec = SessionSpec(
            id=f"warm-up-{uuid.uuid4().hex[:6]}",
            epoch=self.scheduler.next_epoch(),
            seed=0,
            chunk_latent_frames=p.chunk_latent_frames,
            image=np.zeros((p.height_px, p.width_px, 3), np.uint8),
            prompt="",
            control_source=lambda k: (ChunkControl(), False),
            on_chunk=lambda out: None,
            on_end=ended,
            # Two chunks: a steady chunk's parts differ from a stream's first (its first frames come
            # apart), so every shape the frame ring carries gets its slots now, not in a viewer's session.
            max_chunks=2,
        )
        self._carry_out(self.scheduler.open(spec))

    def _rewarmed(self, error: str | None) -> None:
        if error is not None:
            self._broken(f"warm-up after the restart failed: {error}")

    def _broken(self, error: str) -> None:
        """A restart failed: nothing can be served any more."""
        if self.fatal_error is not None:
            return
        self.fatal_error = f"stage restart failed: {error}"
        log.error("%s", self.fatal_error)
        self.supervisor.kill_all()
        self._carry_out(self.scheduler.fail_all(self.fatal_error))
        if self.on_fatal is not None:
            self.on_fatal(self.fatal_error)

    def _open(self, spec: SessionSpec) -> None:
        if not self.healthy:
            down = [s.value for s, p in self.supervisor.stages.items() if not p.alive]
            why = self.fatal_error or f"stage {', '.join(down)} is restarting"
            with self._admitted_lock:
                self._admitted.discard(spec.id)
            spec.on_end(spec.id, f"cannot open a session: {why}")
            return
        self._carry_out(self.scheduler.open(spec))

    def _carry_out(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Send):
                for conn in self.supervisor.stages[effect.stage].conns:
                    conn.send(effect.command)
            elif isinstance(effect, ReleaseSlots):
                p = self.supervisor.stages[effect.producer]
                if p.alive:
                    p.conns[0].send(Release(effect.acks))  # rank 0 owns the stage's output slots
            elif isinstance(effect, Deliver):
                part = effect.part
                frames = self.consumer.get(part.output, copy=True).numpy()  # before the slot is released
                out = ChunkOutput(effect.session.id, part.chunk_index, frames, effect.record, part.offset, effect.last)
                effect.session.on_chunk(out)
            elif isinstance(effect, SnapshotDone):
                self._snapshot_done(effect)
            elif isinstance(effect, StageLost):
                log.warning("%s; restarting the stage", effect.error)
                lost = self.snapshots.lose_all(f"was lost: the {effect.stage.value} stage failed and restarted")
                self._move(lost)
                self._remove_spilled(lost, (effect.stage,))
                if self.fatal_error is None and not self._stopping.is_set():
                    self.supervisor.restart(effect.stage)  # kills what is left first (SIGKILL: it may be hung)
                else:
                    self.supervisor.kill(effect.stage)
            else:
                assert isinstance(effect, Ended)
                with self._admitted_lock:
                    self._admitted.discard(effect.session.id)
                effect.session.on_end(effect.session.id, effect.error)

    # ---- snapshots ----

    def _snapshot_done(self, done: SnapshotDone) -> None:
        on_done = self._snapshot_waiters.pop(done.snapshot_id, None)
        if done.error is not None or done.session is None:
            self._move([Move(done.snapshot_id, None)])  # whatever parts were stored
            if on_done is not None:
                on_done(None, done.error)
            return
        nbytes = sum(done.nbytes.values())
        spec = done.session
        entry = new_entry(done.snapshot_id, spec.id, done.chunk_index, spec.chunk_latent_frames, nbytes)
        self._move(self.snapshots.add(entry))
        try:
            kept = self.snapshots.get(done.snapshot_id)
        except KeyError as gone:
            if on_done is not None:
                on_done(None, str(gone))
            return
        if on_done is not None:
            on_done(kept, None)

    def _on_kept(self, stage: Stage, rank: int, msg: SnapshotKept) -> None:
        keeping = self._keeping.get(msg.snapshot_id)
        if keeping is None:
            return
        keeping.waiting.discard((stage, rank))
        if msg.error is not None:
            keeping.errors.append(msg.error)
        if keeping.waiting:
            return
        del self._keeping[msg.snapshot_id]
        if keeping.errors:
            keeping.on_done("; ".join(keeping.errors))
            return
        try:
            self.snapshots.mark_saved(msg.snapshot_id, keeping.directory)
        except SnapshotGone as gone:  # deleted while it was written
            keeping.on_done(str(gone))
            return
        keeping.on_done(None)

    def _move(self, moves: list[Move]) -> None:
        """Carry out the catalog's decisions on every live worker (scheduler thread)."""
        for move in moves:
            cmd = (
                DropSnapshot(move.snapshot_id)
                if move.directory is None
                else SpillSnapshot(move.snapshot_id, str(move.directory))
            )
            for p in self.supervisor.stages.values():
                if p.alive:
                    for conn in p.conns:
                        with contextlib.suppress(OSError, BrokenPipeError):
                            conn.send(cmd)

    def _remove_spilled(self, moves: list[Move], stages: tuple[Stage, ...]) -> None:
        """Spilled files of workers that are gone (nobody else will remove them)."""
        spill = self.snapshots.budget.spill_dir
        if spill is None:
            return
        for move in moves:
            folder = spill / move.snapshot_id
            for stage in stages:
                for path in folder.glob(f"{stage.value}*"):
                    path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()

    # ---- stats ----

    def _query_stats(self, done: threading.Event, box: dict[str, Any]) -> None:
        box.update(
            {
                "counters": self.counters,
                "sessions": {sid: s.state.value for sid, s in self.scheduler.sessions.items()},
                "outstanding_slots": self.scheduler.outstanding_slots(),
                "workers": self.worker_pids(),
            }
        )
        if not self.supervisor.all_alive():
            done.set()
            return
        self._stats_waiters.append((done, box))
        for p in self.supervisor.stages.values():
            for conn in p.conns:
                conn.send(QueryStats())

    def _on_stats(self, stage: Stage, rank: int, msg: StageStats) -> None:
        ranks = sum(len(p.specs) for p in self.supervisor.stages.values())
        for done, box in self._stats_waiters:
            box.setdefault("stages", {})[f"{stage.value}{rank}"] = {
                "channel": msg.channel,
                "slots_in_use": msg.slots_in_use,
                "sessions": msg.sessions,
                "peak_memory": dataclasses.asdict(msg.peak_memory),
            }
            if len(box["stages"]) == ranks:
                done.set()
        self._stats_waiters = [(d, b) for d, b in self._stats_waiters if not d.is_set()]
