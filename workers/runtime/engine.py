"""The pipeline engine: stage worker processes and the scheduler that feeds them (no model code).

Stages encode → DiT → decode run in their own processes (ranks of a stage run in lockstep; the
scheduler sends each command to every rank and waits for all). One scheduler thread owns all
state; public methods are thread-safe and only enqueue requests, so an asyncio server can call them
without blocking its loop.

Per session, edges are bounded: at most `prefetch_chunks` conditions encoded ahead of the DiT and
at most `edge_capacity` latents waiting for (or in) decode. A chunk's control is sampled from the
session's control source at the moment the DiT starts it, never guessed earlier. Sessions share
the workers, served round-robin at chunk boundaries. With `schedule="serial"` the next chunk is
only started after the previous chunk's frames are out: the A/B baseline, through the same workers.

Every chunk records stage dispatch/done times, worker busy time and queue waits; each stage
records its idle intervals. A session's epoch tags its commands: results that come back after the
session was closed or failed are dropped (counted) and their slots released. Closing releases
per-stage state in reverse pipeline order and then checks that none of the session's slots leaked.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.controls import ChunkControl
from workers.models.presets import ModelPreset, get_preset
from workers.runtime.channel import Ack, ChannelConsumer, SlotRef, remove_segments
from workers.runtime.messages import (
    ChunkDone,
    CloseSession,
    DecodeChunk,
    DenoiseChunk,
    EncodeChunk,
    FramesReady,
    OpenSession,
    QueryStats,
    Release,
    SessionOpened,
    Shutdown,
    Stage,
    StageFailed,
    StageStats,
    TensorRef,
    WorkerReady,
)
from workers.runtime.placement import Placement
from workers.runtime.synthetic import SyntheticModel
from workers.runtime.worker import FaultSpec, WorkerSpec, worker_main

STAGES = (Stage.ENCODE, Stage.DIT, Stage.DECODE)
UPSTREAM = {Stage.DIT: Stage.ENCODE, Stage.DECODE: Stage.DIT}
log = logging.getLogger(__name__)
LOOP_TICK_S = 0.05  # how often the scheduler wakes with nothing to do (death checks ride on sentinels)


class EngineError(RuntimeError):
    """The engine cannot serve a request (not started, full, workers failed to start)."""


class SessionState(Enum):
    OPENING = "opening"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


@dataclass(frozen=True)
class Hold:
    """A control source's "not yet": the scheduler asks again in `retry_in_s` (and wakes for it)."""

    retry_in_s: float


# chunk index -> (control, reset pose) to start the chunk now; Hold to start it later; None to hold
# it back until something changes (the scheduler asks again on its next pass, within LOOP_TICK_S).
# This is the consumer's flow control: it decides when the DiT may start its next chunk.
ControlSource = Callable[[int], tuple[ChunkControl, bool] | Hold | None]


@dataclass
class StageTiming:
    ready_t: float | None = None  # input available for this stage
    dispatch_t: float | None = None
    done_t: float | None = None
    busy_s: float = 0.0

    @property
    def queue_wait_s(self) -> float | None:
        if self.ready_t is None or self.dispatch_t is None:
            return None
        return self.dispatch_t - self.ready_t


@dataclass
class ChunkRecord:
    index: int
    stages: dict[Stage, StageTiming] = field(default_factory=lambda: {s: StageTiming() for s in STAGES})
    control: ChunkControl | None = None
    num_frames: int = 0
    frames_ready_t: float | None = None

    def as_dict(self, t0: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "num_frames": self.num_frames,
            "frames_ready_s": None if self.frames_ready_t is None else self.frames_ready_t - t0,
            "applied_seq": None if self.control is None else self.control.seq,
            "keys": [] if self.control is None else sorted(self.control.keys),
        }
        for stage, tm in self.stages.items():
            out[f"{stage.value}_busy_s"] = tm.busy_s
            out[f"{stage.value}_queue_wait_s"] = tm.queue_wait_s
            out[f"{stage.value}_start_s"] = None if tm.dispatch_t is None else tm.dispatch_t - t0
            out[f"{stage.value}_end_s"] = None if tm.done_t is None else tm.done_t - t0
        return out


@dataclass(frozen=True)
class ChunkOutput:
    """Part of a chunk's frames: a chunk arrives in parts, in order, as the decode stage hands them
    on (`offset`: the chunk's frames before these). The `last` part comes when the chunk is done,
    with its `record` complete."""

    session_id: str
    index: int
    frames: np.ndarray  # [T, H, W, 3] uint8, owned by the receiver
    record: ChunkRecord
    offset: int = 0
    last: bool = True


class ChunkAssembler:
    """For consumers that want whole chunks: gathers a chunk's parts, returns the chunk at its last."""

    def __init__(self) -> None:
        self._parts: dict[int, list[np.ndarray]] = {}

    def add(self, out: ChunkOutput) -> ChunkOutput | None:
        parts = self._parts.setdefault(out.index, [])
        assert out.offset == sum(len(p) for p in parts), f"chunk {out.index}: part at {out.offset} out of order"
        parts.append(out.frames)
        if not out.last:
            return None
        frames = np.concatenate(self._parts.pop(out.index))
        return ChunkOutput(out.session_id, out.index, frames, out.record)


@dataclass
class EngineSession:
    id: str
    epoch: int
    seed: int
    chunk_latent_frames: int
    image: np.ndarray
    prompt: str
    control_source: ControlSource
    on_chunk: Callable[[ChunkOutput], None]
    on_end: Callable[[str, str | None], None]  # (session id, error or None)
    max_chunks: int | None
    state: SessionState = SessionState.OPENING
    opened: set[Stage] = field(default_factory=set)
    closed: set[Stage] = field(default_factory=set)
    next_encode: int = 0
    next_dit: int = 0
    chunks_out: int = 0
    encoded: deque[tuple[int, TensorRef]] = field(default_factory=deque)
    denoised: deque[tuple[int, TensorRef]] = field(default_factory=deque)
    inflight: dict[Stage, int] = field(default_factory=dict)  # stage -> chunk index being computed
    last_part: FramesReady | None = None  # a chunk's final frames, held until its decode is done
    records: dict[int, ChunkRecord] = field(default_factory=dict)
    outstanding: dict[tuple[str, str, int, int, int], TensorRef] = field(default_factory=dict)  # unreleased
    error: str | None = None
    opened_t: float = field(default_factory=time.perf_counter)

    def record(self, index: int) -> ChunkRecord:
        if index not in self.records:
            self.records[index] = ChunkRecord(index)
        return self.records[index]

    def wants_more(self, index: int) -> bool:
        return self.state is SessionState.RUNNING and (self.max_chunks is None or index < self.max_chunks)


@dataclass
class Inflight:
    """The one command a stage is working on; multi-rank stages reply once per rank."""

    session_id: str | None
    epoch: int
    kind: str
    chunk_index: int | None
    inputs: tuple[tuple[Stage, TensorRef], ...] = ()  # (producer, ref) read by the command
    replies: list[Any] = field(default_factory=list)


@dataclass
class StageWorkers:
    stage: Stage
    devices: tuple[str, ...]
    procs: list[mp.process.BaseProcess] = field(default_factory=list)
    conns: list[Connection] = field(default_factory=list)
    inflight: Inflight | None = None
    control: deque[Any] = field(default_factory=deque)  # open/close commands, ahead of chunk work
    alive: bool = False
    idle_since: float | None = None
    idle_intervals: list[tuple[float, float]] = field(default_factory=list)
    busy_s: float = 0.0
    rr: int = 0  # round-robin pointer over sessions
    dist_dir: str | None = None

    @property
    def world_size(self) -> int:
        return len(self.devices)


def _ref_key(ref: TensorRef | None) -> tuple[str, str, int, int, int] | None:
    """Identity of one use of a slot (None for inline tensors, which hold no slot)."""
    if isinstance(ref, SlotRef):
        return (ref.producer, ref.channel_id, ref.profile_id, ref.slot, ref.generation)
    return None


def _inputs_of(stage: Stage, cmd: Any) -> tuple[tuple[Stage, TensorRef], ...]:
    if isinstance(cmd, DenoiseChunk):
        return ((Stage.ENCODE, cmd.cond),)
    if isinstance(cmd, DecodeChunk):
        return ((Stage.DIT, cmd.latents),)
    if isinstance(cmd, OpenSession) and cmd.text is not None:
        return ((Stage.ENCODE, cmd.text),)
    return ()


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
    ) -> None:
        if schedule not in ("pipelined", "serial"):
            raise ValueError(f"schedule must be 'pipelined' or 'serial', got {schedule!r}")
        if prefetch_chunks < 1 or edge_capacity < 1 or max_sessions < 1:
            raise ValueError("prefetch_chunks, edge_capacity and max_sessions must be at least 1")
        self.preset = get_preset(preset) if isinstance(preset, str) else preset
        placement.validate_for(self.preset)
        self.placement = placement
        self.schedule = schedule
        self.max_sessions = max_sessions
        self.checkpoint_dir = str(checkpoint_dir) if checkpoint_dir is not None else None
        self.weights_seed = weights_seed
        self.prefetch_chunks = 1 if schedule == "serial" else prefetch_chunks
        self.edge_capacity = edge_capacity
        self.synthetic = synthetic
        self.faults = faults or {}
        self.start_timeout_s = start_timeout_s
        self.stages = {s: StageWorkers(s, tuple(getattr(placement, s.value))) for s in STAGES}
        self.sessions: dict[str, EngineSession] = {}
        self.consumer = ChannelConsumer(torch.device("cpu"))  # frames arrive in host shared memory
        self.counters = {"late_results_dropped": 0, "leaked_slots": 0, "worker_restarts": 0, "sessions_failed": 0}
        self._epochs = itertools.count(1)
        self._requests: queue.Queue[Callable[[], None]] = queue.Queue()
        self._wake_r, self._wake_w = mp.Pipe(duplex=False)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stats_waiters: list[tuple[threading.Event, dict[str, Any]]] = []
        self._retry_at = float("inf")  # earliest Hold deadline of this pass (perf_counter seconds)
        self.started_t: float | None = None

    # ------------------------------------------------------------------ public, thread-safe

    def start(self) -> None:
        """Spawn every stage's workers and wait until all have loaded their models (warm)."""
        t0 = time.perf_counter()
        try:
            for stage in STAGES:
                self._spawn(stage)
            for stage in STAGES:
                self._await_ready(stage)
        except BaseException:
            self._kill_all()
            raise
        self.started_t = time.perf_counter()
        self.start_s = self.started_t - t0
        self._thread = threading.Thread(target=self._loop, name="pipeline-scheduler", daemon=True)
        self._thread.start()

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
    ) -> str:
        """Start a session; chunks stream to `on_chunk` (called on the scheduler thread)."""
        if self._thread is None:
            raise EngineError("engine not started")
        p = self.preset
        chunk = chunk_latent_frames or p.chunk_latent_frames
        if image.shape != (p.height_px, p.width_px, 3) or image.dtype != np.uint8:
            raise ValueError(f"image must be {p.height_px}x{p.width_px}x3 uint8 (fit it to the model first)")
        if p.dit.local_attn_size_frames != -1 and chunk + p.dit.sink_size_frames >= p.dit.local_attn_size_frames:
            raise ValueError(f"chunk of {chunk} latent frames does not fit the attention window")
        active = sum(s.state in (SessionState.OPENING, SessionState.RUNNING) for s in list(self.sessions.values()))
        if active >= self.max_sessions:
            raise EngineError(f"engine is full ({self.max_sessions} sessions)")
        session = EngineSession(
            id=uuid.uuid4().hex[:12],
            epoch=next(self._epochs),
            seed=seed,
            chunk_latent_frames=chunk,
            image=image,
            prompt=prompt,
            control_source=control_source,
            on_chunk=on_chunk,
            on_end=on_end,
            max_chunks=max_chunks,
        )
        self._submit(lambda: self._open(session))
        return session.id

    def close_session(self, session_id: str) -> None:
        self._submit(lambda: self._close(session_id, None))

    def stats(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Engine counters plus each stage's channel stats (asks the workers)."""
        done = threading.Event()
        box: dict[str, Any] = {}
        self._submit(lambda: self._query_stats(done, box))
        if not done.wait(timeout_s):
            raise EngineError("stats timed out")
        return box

    def stage_report(self) -> dict[str, Any]:
        """Busy and idle seconds per stage (scheduler-side view), for benchmarks.

        Idle time counts while sessions are open, up to now (an idle stage's open interval included),
        so two readings a while apart give the idle fraction between them.
        """
        out = {}
        now = time.perf_counter()
        for stage, w in self.stages.items():
            idle = sum(b - a for a, b in w.idle_intervals)
            idle_since = w.idle_since
            if idle_since is not None and self.sessions:
                idle += now - idle_since
            out[stage.value] = {"busy_s": w.busy_s, "idle_s": idle, "idle_intervals": list(w.idle_intervals)}
        return out

    def worker_pids(self) -> dict[str, list[int]]:
        return {s.value: [p.pid for p in w.procs if p.pid is not None] for s, w in self.stages.items()}

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Close every session, stop the workers, release everything. Idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._thread is not None:
            self._wake()
            self._thread.join(timeout_s)
        for w in self.stages.values():
            for conn in w.conns:
                with contextlib.suppress(OSError, BrokenPipeError):
                    conn.send(Shutdown())
        deadline = time.monotonic() + timeout_s
        for w in self.stages.values():
            for proc in w.procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        self._kill_all()
        self.consumer.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> PipelineEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ workers

    def _spawn(self, stage: Stage) -> None:
        w = self.stages[stage]
        ctx = mp.get_context("spawn")
        # Idle OpenMP threads that spin would steal the cores other stages' processes are using.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if w.world_size > 1:
            w.dist_dir = tempfile.mkdtemp(prefix=f"worldrtc-{stage.value}-")
        w.procs, w.conns = [], []
        for rank, device in enumerate(w.devices):
            parent, child = ctx.Pipe()
            spec = WorkerSpec(
                stage=stage,
                rank=rank,
                world_size=w.world_size,
                device=device,
                preset=self.preset.name,
                checkpoint_dir=self.checkpoint_dir,
                weights_seed=self.weights_seed,
                dist_init=f"file://{w.dist_dir}/rendezvous" if w.dist_dir else None,
                parent_pid=os.getpid(),
                cpu_threads=self.placement.cpu_threads_per_worker,
                output_shards=len(self.placement.decode) if stage is Stage.DIT else 1,
                synthetic=self.synthetic,
                fault=self.faults.get(stage),
            )
            proc = ctx.Process(target=worker_main, args=(spec, child), name=f"worldrtc-{spec.name}", daemon=True)
            proc.start()
            child.close()
            w.procs.append(proc)
            w.conns.append(parent)

    def _await_ready(self, stage: Stage) -> None:
        w = self.stages[stage]
        deadline = time.monotonic() + self.start_timeout_s
        for rank, conn in enumerate(w.conns):
            while not conn.poll(0.1):
                if not w.procs[rank].is_alive():
                    raise EngineError(f"{stage.value} worker rank {rank} exited during start-up")
                if time.monotonic() > deadline:
                    raise EngineError(f"{stage.value} worker rank {rank} not ready after {self.start_timeout_s:.0f} s")
            msg = conn.recv()
            if isinstance(msg, StageFailed):
                raise EngineError(msg.error)
            assert isinstance(msg, WorkerReady), msg
        w.alive = True
        w.idle_since = time.perf_counter()

    def _kill_stage(self, stage: Stage) -> None:
        w = self.stages[stage]
        for proc in w.procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            if proc.pid is not None:
                # A worker that did not exit cleanly cannot unlink its own slot files.
                remove_segments(proc.pid)
        for conn in w.conns:
            conn.close()
        w.procs, w.conns, w.alive, w.inflight = [], [], False, None
        w.control.clear()
        if w.dist_dir:
            shutil.rmtree(w.dist_dir, ignore_errors=True)
            w.dist_dir = None

    def _kill_all(self) -> None:
        for stage in STAGES:
            self._kill_stage(stage)

    def _stage_died(self, stage: Stage, error: str) -> None:
        """A worker died or failed fatally: every session loses its stage state; fail them all."""
        lost = self.stages[stage].inflight
        self._kill_stage(stage)
        for session in list(self.sessions.values()):
            # The dead stage's command will never reply: forget it, and give back what it was reading.
            session.inflight.pop(stage, None)
            if lost is not None and lost.session_id == session.id:
                self._release_unread(session, lost, [])
            if session.state in (SessionState.OPENING, SessionState.RUNNING, SessionState.CLOSING):
                self._fail(session, error)

    def _ensure_workers(self) -> None:
        for stage in STAGES:
            if not self.stages[stage].alive:
                self.counters["worker_restarts"] += 1
                self._spawn(stage)
                self._await_ready(stage)

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
                # A scheduler bug must not hang every client: fail the sessions, keep serving.
                log.exception("scheduler error; failing all sessions")
                for session in list(self.sessions.values()):
                    self._finish(session, SessionState.FAILED, "internal scheduler error")
                for w in self.stages.values():
                    w.inflight = None
                    w.control.clear()
        for session in list(self.sessions.values()):
            if session.state not in (SessionState.CLOSED, SessionState.FAILED):
                self._finish(session, SessionState.CLOSED, None)

    def _step(self) -> None:
        conn_owner: dict[Any, tuple[Stage, int]] = {}
        sentinels: dict[Any, Stage] = {}
        for stage, w in self.stages.items():
            for rank, conn in enumerate(w.conns):
                conn_owner[conn] = (stage, rank)
            for proc in w.procs:
                sentinels[proc.sentinel] = stage
        timeout = min(LOOP_TICK_S, max(0.0, self._retry_at - time.perf_counter()))
        ready = wait([self._wake_r, *conn_owner, *sentinels], timeout=timeout)
        for obj in ready:
            if obj is self._wake_r:
                while self._wake_r.poll():
                    self._wake_r.recv_bytes()
            elif obj in conn_owner:
                stage, rank = conn_owner[obj]
                if not self.stages[stage].alive:
                    continue
                try:
                    while self.stages[stage].alive and obj.poll():
                        self._on_reply(stage, rank, obj.recv())
                except (EOFError, OSError):
                    if self.stages[stage].alive:
                        self._stage_died(stage, f"{stage.value} worker rank {rank} exited unexpectedly")
            elif obj in sentinels:
                stage = sentinels[obj]
                if self.stages[stage].alive:
                    self._stage_died(stage, f"{stage.value} worker died (killed or crashed)")
        while True:
            try:
                fn = self._requests.get_nowait()
            except queue.Empty:
                break
            fn()
        self._retry_at = float("inf")
        self._dispatch()

    # ---- session lifecycle ----

    def _open(self, session: EngineSession) -> None:
        try:
            self._ensure_workers()
        except EngineError as exc:
            self._kill_all()
            session.on_end(session.id, f"workers failed to start: {exc}")
            return
        self.sessions[session.id] = session
        self.stages[Stage.ENCODE].control.append(
            OpenSession(
                session.id, session.epoch, session.chunk_latent_frames, session.seed, session.image, session.prompt
            )
        )
        self.stages[Stage.DECODE].control.append(
            OpenSession(session.id, session.epoch, session.chunk_latent_frames, session.seed)
        )

    def _close(self, session_id: str, error: str | None) -> None:
        session = self.sessions.get(session_id)
        if session is None or session.state in (SessionState.CLOSING, SessionState.CLOSED, SessionState.FAILED):
            return
        session.state = SessionState.CLOSING
        session.error = error
        self._discard_queued(session)
        self._maybe_finish_close(session)

    def _fail(self, session: EngineSession, error: str) -> None:
        self.counters["sessions_failed"] += 1
        if session.state is SessionState.CLOSING:
            session.error = session.error or error
        else:
            session.state = SessionState.CLOSING
            session.error = error
            self._discard_queued(session)
        self._maybe_finish_close(session)

    def _discard_queued(self, session: EngineSession) -> None:
        if session.last_part is not None:
            self._release(session, Stage.DECODE, [session.last_part.output], "discarded")
            session.last_part = None
        for stage_queue, producer in ((session.encoded, Stage.ENCODE), (session.denoised, Stage.DIT)):
            while stage_queue:
                _, ref = stage_queue.popleft()
                self._release(session, producer, [ref], "discarded")

    def _maybe_finish_close(self, session: EngineSession) -> None:
        """Once nothing is in flight, release per-stage state in reverse pipeline order."""
        if session.inflight:
            return
        for stage in reversed(STAGES):
            w = self.stages[stage]
            if stage in session.closed:
                continue
            if not w.alive or stage not in session.opened:
                session.closed.add(stage)
                continue
            if not any(isinstance(c, CloseSession) and c.session_id == session.id for c in w.control):
                w.control.append(CloseSession(session.id))
            return  # one stage at a time, downstream first
        leaked = len(session.outstanding)
        if leaked and all(self.stages[s].alive for s in STAGES):
            self.counters["leaked_slots"] += leaked
        final = SessionState.FAILED if session.error else SessionState.CLOSED
        self._finish(session, final, session.error)

    def _finish(self, session: EngineSession, state: SessionState, error: str | None) -> None:
        session.state = state
        self.sessions.pop(session.id, None)
        session.on_end(session.id, error)

    # ---- replies ----

    def _on_reply(self, stage: Stage, rank: int, msg: Any) -> None:
        w = self.stages[stage]
        if isinstance(msg, StageStats):
            for done, box in self._stats_waiters:
                box.setdefault("stages", {})[f"{stage.value}{rank}"] = {
                    "channel": msg.channel,
                    "slots_in_use": msg.slots_in_use,
                    "sessions": msg.sessions,
                }
                if len(box["stages"]) == sum(x.world_size for x in self.stages.values()):
                    done.set()
            self._stats_waiters = [(d, b) for d, b in self._stats_waiters if not d.is_set()]
            return
        if isinstance(msg, StageFailed) and msg.fatal:
            self._stage_died(stage, msg.error)
            return
        if isinstance(msg, FramesReady):
            self._on_frames(msg)  # ahead of the command's reply, which ends it
            return
        inflight = w.inflight
        assert inflight is not None, f"unexpected reply from {stage.value}: {msg!r}"
        inflight.replies.append(msg)
        if len(inflight.replies) < w.world_size:
            return
        now = time.perf_counter()
        w.inflight = None
        w.idle_since = now
        failures = [r for r in inflight.replies if isinstance(r, StageFailed)]
        session = self.sessions.get(inflight.session_id) if inflight.session_id else None
        current = session is not None and session.epoch == inflight.epoch
        # Inputs consumed by every rank can be handed back to their producer now.
        acks = [a for r in inflight.replies for a in getattr(r, "acks", ())]
        if acks and stage in UPSTREAM:
            self._forward_acks(session if current else None, UPSTREAM[stage], acks, len(inflight.replies))
        first = next(r for r in inflight.replies if r.rank == 0)  # rank 0 carries the stage's output
        if inflight.kind == "close":
            if session is not None:
                session.closed.add(stage)
                self._maybe_finish_close(session)
            return
        if session is None or not current:
            self.counters["late_results_dropped"] += 1
            out = getattr(first, "output", None) or getattr(first, "text", None)
            if out is not None:
                self._send_release(stage, [Ack.of(out, "discarded")])
            self._release_unread(None, inflight, acks)
            return
        if inflight.kind == "chunk":
            session.inflight.pop(stage, None)
        if failures:
            self._release_unread(session, inflight, acks)
            self._fail(session, failures[0].error)
            return
        if inflight.kind == "open":
            self._on_opened(session, stage, first)
        else:
            self._on_chunk_done(session, stage, first, now)
        if session.state is SessionState.CLOSING:
            self._discard_queued(session)
            self._maybe_finish_close(session)

    def _on_opened(self, session: EngineSession, stage: Stage, reply: SessionOpened) -> None:
        session.opened.add(stage)
        if stage is Stage.ENCODE:
            assert reply.text is not None
            self._track(session, reply.text)
            self.stages[Stage.DIT].control.append(
                OpenSession(session.id, session.epoch, session.chunk_latent_frames, session.seed, text=reply.text)
            )
        if session.opened == set(STAGES) and session.state is SessionState.OPENING:
            session.state = SessionState.RUNNING

    def _on_chunk_done(self, session: EngineSession, stage: Stage, reply: ChunkDone, now: float) -> None:
        rec = session.record(reply.chunk_index)
        tm = rec.stages[stage]
        tm.done_t = now
        tm.busy_s = reply.busy_s
        self.stages[stage].busy_s += reply.busy_s
        if stage is not Stage.DECODE:  # decode's frames came ahead, as FramesReady parts
            assert reply.output is not None, f"{stage.value} rank 0 published no output"
            self._track(session, reply.output)
        if stage is Stage.ENCODE:
            session.encoded.append((reply.chunk_index, reply.output))
            rec.stages[Stage.DIT].ready_t = now
        elif stage is Stage.DIT:
            session.denoised.append((reply.chunk_index, reply.output))
            rec.stages[Stage.DECODE].ready_t = now
        else:
            last, session.last_part = session.last_part, None
            session.chunks_out += 1
            if last is not None:  # None: the session stopped running while the chunk decoded
                assert last.chunk_index == reply.chunk_index, "a chunk's last frames came with another chunk"
                self._deliver(session, last, rec)
            if session.max_chunks is not None and session.chunks_out >= session.max_chunks:
                self._close(session.id, None)

    def _on_frames(self, msg: FramesReady) -> None:
        """Part of a chunk's frames: copy them out of the ring at once; hand on all but the last
        part now, the last one with the chunk's ChunkDone (its record complete)."""
        session = self.sessions.get(msg.session_id)
        if session is None or session.epoch != msg.epoch or session.state is not SessionState.RUNNING:
            self._send_release(Stage.DECODE, [Ack.of(msg.output, "discarded")])  # nobody will show them
            return
        self._track(session, msg.output)
        if msg.last:
            session.last_part = msg
        else:
            self._deliver(session, msg, None)

    def _deliver(self, session: EngineSession, part: FramesReady, done: ChunkRecord | None) -> None:
        frames = self.consumer.get(part.output, copy=True).numpy()
        self._release(session, Stage.DECODE, [part.output], "copied")
        rec = session.record(part.chunk_index)
        rec.num_frames = part.offset + len(frames)
        if part.offset == 0:
            rec.frames_ready_t = time.perf_counter()  # the chunk's first frames are out
        session.on_chunk(ChunkOutput(session.id, part.chunk_index, frames, rec, part.offset, last=done is not None))

    # ---- slot bookkeeping ----

    def _track(self, session: EngineSession, ref: TensorRef) -> None:
        key = _ref_key(ref)
        if key is not None:
            session.outstanding[key] = ref

    def _forward_acks(self, session: EngineSession | None, producer: Stage, acks: list[Ack], ranks: int) -> None:
        """Hand consumed slots back to their producer, once every consuming rank has replied.

        A sharded slot is acked per shard rank (the producer frees it after all ranks); a slot read
        whole by several ranks gets exactly one ack, since the producer rejects duplicates.
        """
        forward: list[Ack] = []
        seen: set[tuple[str, str, int, int, int]] = set()
        for ack in acks:
            key = _ref_key(ack.ref)
            if key is None:
                continue
            assert ack.ref is not None
            if ack.ref.num_shards > 1 or key not in seen:
                forward.append(ack)
            seen.add(key)
            if session is not None:
                session.outstanding.pop(key, None)
        self._send_release(producer, forward)

    def _release_unread(self, session: EngineSession | None, inflight: Inflight, acks: list[Ack]) -> None:
        """A failed or stale command may not have acked its inputs: give those slots back."""
        acked = {_ref_key(a.ref) for a in acks}
        for producer, ref in inflight.inputs:
            key = _ref_key(ref)
            if key is None or key in acked:
                continue
            if session is not None:
                session.outstanding.pop(key, None)
            self._send_release(producer, [Ack.of(ref, "discarded")])

    def _release(self, session: EngineSession, producer: Stage, refs: list[TensorRef], outcome: str) -> None:
        """Release whole slots on a consumer's behalf (copied by the server, or discarded)."""
        acks = []
        for ref in refs:
            key = _ref_key(ref)
            if key is not None:
                session.outstanding.pop(key, None)
                acks.append(Ack.of(ref, outcome))  # type: ignore[arg-type]
        self._send_release(producer, acks)

    def _send_release(self, producer: Stage, acks: list[Ack]) -> None:
        acks = [a for a in acks if a.ref is not None]
        w = self.stages[producer]
        if acks and w.alive:
            w.conns[0].send(Release(tuple(acks)))

    def _query_stats(self, done: threading.Event, box: dict[str, Any]) -> None:
        box.update(
            {
                "counters": dict(self.counters),
                "sessions": {sid: s.state.value for sid, s in self.sessions.items()},
                "outstanding_slots": sum(len(s.outstanding) for s in self.sessions.values()),
                "workers": self.worker_pids(),
            }
        )
        if not all(w.alive for w in self.stages.values()):
            done.set()
            return
        self._stats_waiters.append((done, box))
        for w in self.stages.values():
            for conn in w.conns:
                conn.send(QueryStats())

    # ---- dispatch ----

    def _send(self, stage: Stage, cmd: Any, kind: str, session: EngineSession | None, chunk: int | None) -> None:
        w = self.stages[stage]
        now = time.perf_counter()
        if w.idle_since is not None and self.sessions:
            w.idle_intervals.append((w.idle_since - (self.started_t or 0.0), now - (self.started_t or 0.0)))
        w.idle_since = None
        w.inflight = Inflight(
            session_id=None if session is None else session.id,
            epoch=0 if session is None else session.epoch,
            kind=kind,
            chunk_index=chunk,
            inputs=_inputs_of(stage, cmd),
        )
        if session is not None and kind == "chunk":
            assert chunk is not None
            session.inflight[stage] = chunk
            session.record(chunk).stages[stage].dispatch_t = now
        for conn in w.conns:
            conn.send(cmd)

    def _dispatch(self) -> None:
        for stage in (Stage.DECODE, Stage.DIT, Stage.ENCODE):  # downstream first: drain before filling
            w = self.stages[stage]
            if not w.alive or w.inflight is not None:
                continue
            if w.control:
                cmd = w.control.popleft()
                session = self.sessions.get(cmd.session_id)
                if session is None:
                    continue
                kind = "close" if isinstance(cmd, CloseSession) else "open"
                self._send(stage, cmd, kind, session, None)
                continue
            order = list(self.sessions.values())
            if not order:
                continue
            for i in range(len(order)):
                session = order[(w.rr + i) % len(order)]
                if session.state is not SessionState.RUNNING:
                    continue
                cmd = self._next_work(stage, session)
                if cmd is not None:
                    w.rr = (w.rr + i + 1) % len(order)
                    self._send(stage, cmd, "chunk", session, cmd.chunk_index)
                    break

    def _next_work(self, stage: Stage, s: EngineSession) -> Any:
        serial = self.schedule == "serial"
        if stage is Stage.ENCODE:
            k = s.next_encode
            ahead = len(s.encoded) + (Stage.ENCODE in s.inflight)
            if not s.wants_more(k) or ahead >= self.prefetch_chunks or (serial and k > s.chunks_out):
                return None
            s.next_encode += 1
            rec = s.record(k)
            rec.stages[Stage.ENCODE].ready_t = time.perf_counter()
            return EncodeChunk(s.id, s.epoch, k)
        if stage is Stage.DIT:
            if not s.encoded or s.encoded[0][0] != s.next_dit:
                return None
            waiting = len(s.denoised) + (Stage.DECODE in s.inflight)
            if waiting >= self.edge_capacity or (serial and s.next_dit > s.chunks_out):
                return None
            # The control is sampled now, when the DiT is ready to start this chunk; the source may
            # also hold the chunk back (None) when its viewer is far enough ahead.
            sampled = s.control_source(s.next_dit)
            if sampled is None:
                return None
            if isinstance(sampled, Hold):
                self._retry_at = min(self._retry_at, time.perf_counter() + sampled.retry_in_s)
                return None
            control, reset = sampled
            k, cond = s.encoded.popleft()
            s.next_dit += 1
            s.record(k).control = control
            return DenoiseChunk(s.id, s.epoch, k, cond, control, reset)
        if not s.denoised:
            return None
        k, latents = s.denoised.popleft()
        return DecodeChunk(s.id, s.epoch, k, latents)
