"""A stage's command handler, worker side: per-session state plus channel plumbing.

A handler consumes input tensors named by `SlotRef`s (reading them in place and acking), runs its
stage, and publishes its output into its own producer channel. This base class holds what every
stage shares; each stage's file (`*_handler.py`) holds only its own work, and `handlers.py` maps a
worker spec to its handler.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from workers.parallel.group import StageGroup
from workers.runtime.channel import Ack, ChannelConsumer, ChannelProducer, SlotGoneError, StaleAckError
from workers.runtime.host_reserve import HostReserve
from workers.runtime.messages import (
    ChunkDone,
    CloseSession,
    Command,
    DropSnapshot,
    FramesReady,
    KeepSnapshot,
    OpenSession,
    QueryStats,
    Release,
    Reply,
    SessionClosed,
    SessionOpened,
    SnapshotKept,
    SnapshotTaken,
    SpillSnapshot,
    Stage,
    StageStats,
    TakeSnapshot,
    TensorRef,
)
from workers.runtime.peak_memory import measure_peak_memory
from workers.runtime.snapshot_store import SnapshotStore
from workers.runtime.spec import WorkerSpec
from workers.session_state import StateCaptureError, capture, restore, state_nbytes

log = logging.getLogger(__name__)


class StageHandler:
    # Slots per output profile: up to 2 chunks in flight on each edge per session, for a few sessions;
    # a busy pool falls back to the inline path rather than blocking the stage.
    OUTPUT_SLOTS = 4

    def __init__(self, spec: WorkerSpec, group: StageGroup) -> None:
        self.spec = spec
        self.group = group
        self.device = torch.device(spec.device)
        self.consumer = ChannelConsumer(self.device)
        # Rank 0 publishes the stage's output; other ranks of a multi-rank stage only consume. Decode
        # output goes to the server, so it lives in host shared memory: the frame ring.
        to_server = spec.stage is Stage.DECODE
        self.producer = (
            ChannelProducer(
                f"{spec.stage.value}{spec.rank}",
                torch.device("cpu") if to_server else self.device,
                slots_per_profile=spec.frame_ring_slots if to_server else self.OUTPUT_SLOTS,
            )
            if spec.rank == 0
            else None
        )
        self.sessions: dict[str, Any] = {}
        self.snapshots = SnapshotStore(f"{spec.stage.value}{spec.rank}")
        self.host_reserve = HostReserve() if self.device.type == "cpu" else None
        self._fault_rng: random.Random | None = None
        self._fault_fired = False
        # Sends a reply from another thread (a save's writer), between the command loop's replies:
        # the worker's process sets it (workers/runtime/worker.py).
        self.reply_later: Callable[[Reply], None] = _no_reply_channel

    # ---- dispatch ----

    def handle(self, msg: Command) -> Iterator[Reply]:
        if isinstance(msg, Release):
            assert self.producer is not None, "only rank 0 owns output slots"
            for ack in msg.acks:
                try:
                    self.producer.release(ack)
                except (StaleAckError, SlotGoneError) as exc:
                    # Harmless (the slot was already freed or reused); worth a line, not a failure.
                    log.warning("%s: ignoring ack: %s", self.spec.name, exc)
            return
        if isinstance(msg, QueryStats):
            yield StageStats(
                self.spec.stage,
                self.spec.rank,
                self.producer.stats() if self.producer else {},
                self.producer.in_use() if self.producer else 0,
                len(self.sessions),
                measure_peak_memory(self.device),
            )
            return
        if isinstance(msg, CloseSession):
            self.drop_session(msg.session_id)
            yield SessionClosed(self.spec.stage, self.spec.rank, msg.session_id)
            return
        if isinstance(msg, TakeSnapshot):
            yield self._take_snapshot(msg)
            return
        if isinstance(msg, DropSnapshot):
            self.snapshots.drop(msg.snapshot_id)
            return
        if isinstance(msg, SpillSnapshot):
            self.snapshots.spill(msg.snapshot_id, Path(msg.directory))
            return
        if isinstance(msg, KeepSnapshot):
            self._keep_snapshot(msg)  # answered once written, by the writer thread
            return
        if isinstance(msg, OpenSession) and msg.snapshot is not None:
            if msg.snapshot_dir is not None:  # saved: its files are the part
                part = self.snapshots.load_kept(msg.snapshot, Path(msg.snapshot_dir))
            else:
                part = self.snapshots.get(msg.snapshot)
            self.sessions[msg.session_id] = restore(part, self.shared_state(), self.device)
            self._expect_snapshot(msg.session_id)
            yield SessionOpened(self.spec.stage, self.spec.rank, msg.session_id, msg.epoch)
            return
        yield from self.handle_stage(msg)
        if isinstance(msg, OpenSession):
            self._expect_snapshot(msg.session_id)

    def handle_stage(self, msg: Command) -> Iterator[Reply]:
        raise NotImplementedError

    def shared_state(self) -> dict[str, object]:
        """What this stage's sessions point at and a snapshot keeps by name: its modules, its group."""
        return {}

    def _expect_snapshot(self, session_id: str) -> None:
        """A CPU stage readies host memory for a snapshot of the session it just opened."""
        if self.host_reserve is None or session_id not in self.sessions:
            return
        # A state that cannot be captured fails its snapshots, saying why, when they are asked for.
        with contextlib.suppress(StateCaptureError):
            self.host_reserve.expect(state_nbytes(self.sessions[session_id], self.shared_state()))

    def _take_snapshot(self, msg: TakeSnapshot) -> SnapshotTaken:
        stage, rank = self.spec.stage, self.spec.rank
        take = self.host_reserve.take if self.host_reserve is not None else None
        try:
            part = capture(self.sessions[msg.session_id], self.shared_state(), take)
            self.snapshots.put(msg.snapshot_id, part)
        except Exception as exc:  # the snapshot fails, not the session: its state was only read
            log.exception("%s: snapshot %s failed", self.spec.name, msg.snapshot_id)
            error = f"{stage.value} stage (rank {rank}) could not copy its state: {type(exc).__name__}: {exc}"
            return SnapshotTaken(stage, rank, msg.session_id, msg.epoch, msg.snapshot_id, 0, error)
        return SnapshotTaken(stage, rank, msg.session_id, msg.epoch, msg.snapshot_id, part.nbytes)

    def _keep_snapshot(self, msg: KeepSnapshot) -> None:
        """Write this worker's part of a save off the command loop (workers/runtime/snapshot_store.py):
        chunks go on meanwhile. A failed write fails the save, nothing else."""
        stage, rank = self.spec.stage, self.spec.rank

        def written(error: str | None) -> None:
            why = None if error is None else f"{stage.value} stage (rank {rank}) could not write it: {error}"
            self.reply_later(SnapshotKept(stage, rank, msg.snapshot_id, why))

        try:
            self.snapshots.keep(msg.snapshot_id, Path(msg.directory), written)
        except KeyError as exc:
            written(str(exc))

    # ---- helpers for subclasses ----

    def take(self, ref: TensorRef, shard_rank: int | None = None) -> torch.Tensor:
        """An input tensor read in place from its producer's slot (no copy where it is already on our device).

        The view stays valid until `done_with(ref)`, whose ack goes back with the command's reply; a
        slot is therefore held for one command and the consumer never copies its inputs.
        """
        return self.consumer.get(ref, shard_rank=shard_rank, copy=False)

    def done_with(self, *refs: TensorRef) -> tuple[Ack, ...]:
        return tuple(self.consumer.ack(ref, "copied") for ref in refs)

    def publish(self, tensor: torch.Tensor, shard_dim: int | None = None, num_shards: int = 1) -> TensorRef | None:
        if self.producer is None:
            return None
        return self.producer.put(tensor, shard_dim=shard_dim, num_shards=num_shards)

    def frames_ready(self, msg: Any, offset: int, frames: torch.Tensor, last: bool) -> FramesReady:
        """Publish part of a chunk's frames ahead of its ChunkDone (decode rank 0)."""
        output = self.publish(frames)
        assert output is not None, "only rank 0 publishes frames"
        stage, rank = self.spec.stage, self.spec.rank
        return FramesReady(stage, rank, msg.session_id, msg.epoch, msg.chunk_index, offset, last, output)

    def chunk_done(
        self,
        msg: Any,
        busy_s: float,
        output: TensorRef | None,
        inputs: tuple[TensorRef, ...] = (),
        model_input: dict[str, Any] | None = None,
        prompt: dict[str, Any] | None = None,
        commit_follows: bool = False,
    ) -> ChunkDone:
        """The reply to a chunk command, acking the inputs it read in place."""
        stage, rank = self.spec.stage, self.spec.rank
        acks = self.done_with(*inputs)
        return ChunkDone(
            stage,
            rank,
            msg.session_id,
            msg.epoch,
            msg.chunk_index,
            busy_s,
            output,
            acks,
            model_input,
            prompt,
            commit_follows,
        )

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self) -> _Timer:
        return _Timer(self)

    def check_fault(self, chunk_index: int) -> None:
        """Injected faults (tests only; `spec.fault` is None in service)."""
        fault = self.spec.fault
        if fault is None:
            return
        if fault.max_delay_s > 0:
            if self._fault_rng is None:
                self._fault_rng = random.Random(fault.seed * 1000 + self.spec.rank)
            time.sleep(self._fault_rng.uniform(0, fault.max_delay_s))
        if chunk_index == fault.chunk_index and not self._fault_fired:
            self._fault_fired = True  # once: a later session passes, showing only the hit session failed
            raise RuntimeError(fault.message)

    def drop_session(self, session_id: str | None) -> None:
        if session_id is not None:
            self.sessions.pop(session_id, None)

    def close(self) -> None:
        self.sessions.clear()
        self.snapshots.close()
        self.consumer.close()
        if self.producer is not None:
            self.producer.close()


def _no_reply_channel(reply: Reply) -> None:
    raise RuntimeError(f"no reply channel for {type(reply).__name__}: the handler runs outside a worker process")


class _Timer:
    """Device-synchronised busy time of one command."""

    def __init__(self, handler: StageHandler) -> None:
        self.handler = handler
        self.busy_s = 0.0

    def __enter__(self) -> _Timer:
        self.handler.synchronize()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.handler.synchronize()
        self.busy_s = time.perf_counter() - self._t0
