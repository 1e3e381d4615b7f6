"""Tensor channels: slot reuse, acks, sharding, overflow fallback and cleanup, in one process and across real ones."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import pickle
import signal
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import torch

from workers.runtime.channel import (
    SEGMENT_PREFIX,
    SHM_DIR,
    Ack,
    ChannelConsumer,
    ChannelProducer,
    InlineTensor,
    SlotGoneError,
    SlotRef,
    StaleAckError,
    leaked_segments,
    remove_orphaned_segments,
    remove_segments,
)

CPU = torch.device("cpu")
RECV_TIMEOUT_S = 60.0
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def channel() -> Iterator[tuple[ChannelProducer, ChannelConsumer]]:
    producer = ChannelProducer("test", CPU, slots_per_profile=2)
    consumer = ChannelConsumer(CPU)
    try:
        yield producer, consumer
    finally:
        consumer.close()
        producer.close()
    assert leaked_segments(os.getpid()) == []


def pattern(shape: tuple[int, ...], step: int, device: str | torch.device = "cpu") -> torch.Tensor:
    """Distinct contents per step, so a stale read shows."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32, device=device) + 1000.0 * step).reshape(shape)


def recv(conn: Connection) -> Any:
    if not conn.poll(RECV_TIMEOUT_S):
        raise TimeoutError(f"no message in {RECV_TIMEOUT_S} s")
    return conn.recv()


def spawn(target: Any, *args: Any) -> tuple[mp.Process, Connection]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    child.close()
    return proc, parent


def stop(proc: mp.Process, conn: Connection) -> None:
    conn.send(None)
    proc.join(RECV_TIMEOUT_S)
    assert proc.exitcode == 0, f"consumer process exited with {proc.exitcode}"


# ---- processes ----


def consumer_process(conn: Connection, device: str) -> None:
    """Gets each (ref, step, shard_rank) it is sent, checks it against `pattern`, replies (ack, ok)."""
    consumer = ChannelConsumer(torch.device(device))
    try:
        while (msg := conn.recv()) is not None:
            ref, step, shard_rank = msg
            got = consumer.get(ref, shard_rank=shard_rank)
            want = pattern(ref.shape if isinstance(ref, SlotRef) else tuple(ref.tensor.shape), step, device)
            if shard_rank is not None and ref.shard_dim is not None:
                size = want.shape[ref.shard_dim] // ref.num_shards
                want = want.narrow(ref.shard_dim, shard_rank * size, size)
            ok = got.device.type == torch.device(device).type and torch.equal(got, want)
            conn.send((consumer.ack(ref), ok))
    finally:
        consumer.close()


def holding_process(conn: Connection) -> None:
    """Maps a slot as a view and holds it until killed."""
    consumer = ChannelConsumer(CPU)
    view = consumer.get(conn.recv(), copy=False)
    conn.send(float(view.sum()))
    conn.recv()  # never comes: the test kills us


def crashing_producer_process(conn: Connection) -> None:
    """Fills a slot, reports its pid, then dies without closing (no finalizers, like a crash)."""
    producer = ChannelProducer("crash", CPU)
    producer.put(torch.ones(16))
    conn.send(os.getpid())
    conn.recv()
    os._exit(0)


def cuda_producer_process(conn: Connection, shape: tuple[int, ...], shard_dim: int | None, num_shards: int) -> None:
    """CUDA producer: for each step it is sent, fills a slot (after a long GPU sleep) and sends the ref."""
    producer = ChannelProducer("gpu", torch.device("cuda", 0))
    try:
        while (step := conn.recv()) is not None:
            x = pattern(shape, step, "cuda:0")
            torch.cuda._sleep(200_000_000)  # the copy lands well after put() returns: readers must wait on the event
            conn.send(producer.put(x, shard_dim=shard_dim, num_shards=num_shards))
            for ack in recv(conn):
                producer.release(ack)
            conn.send(producer.stats())
    finally:
        producer.close()


# ---- in one process ----


def test_round_trip_in_process_reuses_slots(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, consumer = channel
    shape = (3, 5, 7)
    refs: list[SlotRef] = []
    allocated = None
    for step in range(6):
        ref = producer.put(pattern(shape, step))
        assert isinstance(ref, SlotRef)
        assert producer.in_use() == 1
        assert torch.equal(consumer.get(ref), pattern(shape, step))
        producer.release(consumer.ack(ref))
        assert producer.in_use() == 0
        refs.append(ref)
        if allocated is None:
            allocated = producer.stats()["bytes_allocated"]
        assert producer.stats()["bytes_allocated"] == allocated == 2 * 3 * 5 * 7 * 4  # no steady-state allocation
    assert {r.slot for r in refs} == {0}  # the lowest free slot is reused ...
    assert [r.generation for r in refs] == [1, 2, 3, 4, 5, 6]  # ... and its generation counts the reuses
    assert len(leaked_segments(os.getpid())) == 2
    stats = producer.stats()
    assert (stats["puts"], stats["slot_puts"], stats["releases"], stats["fallbacks"], stats["profiles"]) == (
        6,
        6,
        6,
        0,
        1,
    )


def test_refs_and_acks_are_small_and_picklable(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, consumer = channel
    x = torch.randn(64, 1024)  # 256 KiB
    ref = producer.put(x)
    assert isinstance(ref, SlotRef)
    assert (ref.nbytes, ref.dtype, ref.shape) == (x.numel() * 4, "float32", (64, 1024))
    ack = consumer.ack(ref)
    for msg in (ref, ack):
        data = pickle.dumps(msg)
        assert len(data) < 1024
        assert pickle.loads(data) == msg
    producer.release(pickle.loads(pickle.dumps(ack)))
    assert producer.in_use() == 0


def test_copy_false_is_a_view_of_the_slot(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, consumer = channel
    ref = producer.put(pattern((8, 8), 0))
    view = consumer.get(ref, copy=False)
    copy = consumer.get(ref, copy=True)
    producer.release(consumer.ack(ref))
    ref2 = producer.put(pattern((8, 8), 1))
    assert isinstance(ref2, SlotRef) and ref2.slot == ref.slot
    assert torch.equal(view, pattern((8, 8), 1))  # zero copy: the view sees the slot's new contents
    assert torch.equal(copy, pattern((8, 8), 0))
    del view


def test_several_dtypes_and_profiles(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, consumer = channel
    for x in (torch.randn(2, 3).bfloat16(), torch.randint(0, 255, (4, 4, 3), dtype=torch.uint8), torch.tensor(3.5)):
        ref = producer.put(x)
        assert isinstance(ref, SlotRef)
        got = consumer.get(ref)
        assert got.dtype == x.dtype and torch.equal(got, x)
        producer.release(consumer.ack(ref))
    assert producer.stats()["profiles"] == 3


def test_sharded_delivery(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, consumer = channel
    x = torch.randn(4, 6, 8)
    ref = producer.put(x, shard_dim=1, num_shards=3)
    assert isinstance(ref, SlotRef) and (ref.shard_dim, ref.num_shards, ref.shard_nbytes()) == (1, 3, 4 * 2 * 8 * 4)
    ranks = [ChannelConsumer(CPU) for _ in range(3)]
    try:
        for r, rank in enumerate(ranks):
            got = rank.get(ref, shard_rank=r)
            assert got.shape == (4, 2, 8) and got.is_contiguous()
            assert torch.equal(got, x[:, 2 * r : 2 * r + 2])
        assert torch.equal(consumer.get(ref), x)  # no rank: the whole tensor
        for r, rank in enumerate(ranks):
            assert producer.in_use() == 1  # free only once every rank has acked
            ack = rank.ack(ref)
            assert ack.shard_rank == r  # remembered from get()
            producer.release(ack)
        assert producer.in_use() == 0
        with pytest.raises(StaleAckError):
            producer.release(ranks[0].ack(ref, shard_rank=0))
        ref2 = producer.put(x, shard_dim=-2, num_shards=3)
        assert isinstance(ref2, SlotRef) and ref2.shard_dim == 1
        producer.release(ranks[1].ack(ref2, shard_rank=1))
        with pytest.raises(StaleAckError, match="shard rank 1"):
            producer.release(Ack(ref2, "copied", 1))
        with pytest.raises(ValueError, match="outside"):
            ranks[0].get(ref2, shard_rank=3)
    finally:
        for rank in ranks:
            rank.close()


def test_sharding_is_validated_at_put(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, _ = channel
    with pytest.raises(ValueError, match="does not split into 3"):
        producer.put(torch.zeros(4, 5, 8), shard_dim=1, num_shards=3)
    with pytest.raises(ValueError, match="needs a shard_dim"):
        producer.put(torch.zeros(4, 6, 8), num_shards=2)
    with pytest.raises(ValueError, match="out of range"):
        producer.put(torch.zeros(4, 6, 8), shard_dim=3, num_shards=2)
    assert producer.stats()["puts"] == 0


def test_discard_frees_the_slot(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, _ = channel
    ref = producer.put(torch.ones(10), shard_dim=0, num_shards=2)
    assert producer.in_use() == 1
    producer.release(Ack.of(ref, "discarded"))  # the scheduler cancels on the consumers' behalf: all ranks
    assert producer.in_use() == 0
    assert producer.stats()["discards"] == 1
    with pytest.raises(ValueError, match="outcome"):
        Ack(None, "lost")  # type: ignore[arg-type]


def test_stale_and_foreign_acks_are_rejected(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, consumer = channel
    old = producer.put(torch.ones(10))
    assert isinstance(old, SlotRef)
    producer.release(consumer.ack(old))
    with pytest.raises(StaleAckError, match="already released"):
        producer.release(Ack(old))
    new = producer.put(torch.ones(10))
    assert isinstance(new, SlotRef) and (new.slot, new.generation) == (old.slot, old.generation + 1)
    with pytest.raises(StaleAckError, match="reused"):
        producer.release(Ack(old))
    assert producer.in_use() == 1  # the stale ack did not free the new contents
    other = ChannelProducer("other", CPU)
    try:
        with pytest.raises(ValueError, match="sent to channel 'other'"):
            other.release(Ack(new))
        again = ChannelProducer("test", CPU)  # a restarted producer of the same channel
        try:
            with pytest.raises(StaleAckError, match="restarted"):
                again.release(Ack(new))
        finally:
            again.close()
    finally:
        other.close()


def test_busy_profile_falls_back_inline(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, consumer = channel
    refs = [producer.put(pattern((4, 4), step)) for step in range(3)]
    assert [type(r) for r in refs] == [SlotRef, SlotRef, InlineTensor]
    inline = refs[2]
    assert isinstance(inline, InlineTensor) and inline.nbytes == 64
    assert torch.equal(consumer.get(inline), pattern((4, 4), 2))
    ack = consumer.ack(inline)
    assert ack.ref is None and ack.nbytes == 0
    producer.release(ack)  # nothing to free
    stats = producer.stats()
    assert (stats["fallback_busy"], stats["fallbacks"], stats["slot_puts"]) == (1, 1, 2)
    assert producer.in_use() == 2


def test_profile_limit_falls_back_inline() -> None:
    producer = ChannelProducer("limit", CPU, slots_per_profile=1, max_profiles=2)
    consumer = ChannelConsumer(CPU)
    try:
        x = torch.randn(6, 4)
        refs = [producer.put(torch.zeros(1)), producer.put(torch.zeros(2)), producer.put(x, shard_dim=0, num_shards=2)]
        assert [type(r) for r in refs] == [SlotRef, SlotRef, InlineTensor]
        assert torch.equal(consumer.get(refs[2], shard_rank=1), x[3:])  # sharding works inline too
        stats = producer.stats()
        assert (stats["fallback_profiles"], stats["fallbacks"], stats["profiles"]) == (1, 1, 2)
        assert stats["bytes_allocated"] == 4 + 8
    finally:
        consumer.close()
        producer.close()


def test_inline_tensor_pickles_as_bytes() -> None:
    x = torch.randn(5, 3).bfloat16()
    inline = InlineTensor(x, shard_dim=1, num_shards=3, channel_id="c")
    data = mp.reduction.ForkingPickler.dumps(inline)  # the pickler multiprocessing pipes use
    assert len(data) >= inline.nbytes  # the bytes themselves, not a shared-memory handle
    back = pickle.loads(data)
    assert torch.equal(back.tensor, x) and (back.shard_dim, back.num_shards, back.channel_id) == (1, 3, "c")
    empty = pickle.loads(pickle.dumps(InlineTensor(torch.zeros(0, 3))))
    assert empty.tensor.shape == (0, 3)


def test_inline_is_a_private_copy(channel: tuple[ChannelProducer, ChannelConsumer]) -> None:
    producer, consumer = channel
    x = torch.zeros(0, 4)
    inline = producer.put(x)  # an empty tensor travels inline
    assert isinstance(inline, InlineTensor)
    y = torch.ones(3)
    busy = ChannelProducer("busy", CPU, slots_per_profile=1)
    try:
        busy.put(y)
        fallback = busy.put(y)
        assert isinstance(fallback, InlineTensor)
        y.fill_(7.0)  # the producer reuses its tensor
        assert torch.equal(consumer.get(fallback), torch.ones(3))
    finally:
        busy.close()


def test_consumer_reopens_a_recreated_producer() -> None:
    consumer = ChannelConsumer(CPU)
    try:
        first = ChannelProducer("again", CPU)
        ref = first.put(pattern((4,), 1))
        assert torch.equal(consumer.get(ref), pattern((4,), 1))
        first.close()  # producer first: the consumer's mapping outlives the unlink
        assert leaked_segments(os.getpid()) == []
        with pytest.raises(SlotGoneError):
            ChannelConsumer(CPU).get(ref)
        second = ChannelProducer("again", CPU)
        ref2 = second.put(pattern((4,), 2))
        assert isinstance(ref, SlotRef) and isinstance(ref2, SlotRef)
        assert (ref2.profile_id, ref2.slot) == (ref.profile_id, ref.slot) and ref2.producer != ref.producer
        assert torch.equal(consumer.get(ref2), pattern((4,), 2))
        second.close()
    finally:
        consumer.close()


def test_close_is_idempotent_and_final() -> None:
    producer = ChannelProducer("close", CPU)
    consumer = ChannelConsumer(CPU)
    ref = producer.put(torch.ones(8))
    view = consumer.get(ref, copy=False)  # a view still alive at close must not break it
    consumer.close()
    consumer.close()
    producer.close()
    producer.close()
    assert leaked_segments(os.getpid()) == []
    assert float(view.sum()) == 8.0  # unlinked, still mapped until the view goes
    del view
    producer.release(Ack(ref))  # late acks after close are ignored
    with pytest.raises(RuntimeError, match="closed"):
        producer.put(torch.ones(8))
    with pytest.raises(RuntimeError, match="closed"):
        consumer.get(ref)


def test_garbage_collected_producer_unlinks() -> None:
    producer = ChannelProducer("gc", CPU)
    producer.put(torch.ones(8))
    assert len(leaked_segments(os.getpid())) == 2
    del producer
    gc.collect()
    assert leaked_segments(os.getpid()) == []


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="channel id"):
        ChannelProducer("a/b", CPU)
    with pytest.raises(ValueError, match="must be ≥ 1"):
        ChannelProducer("x", CPU, slots_per_profile=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            ChannelProducer("x", "cuda")


# ---- across processes ----


@pytest.mark.processes
def test_round_trip_across_processes() -> None:
    producer = ChannelProducer("xproc", CPU, slots_per_profile=2)
    proc, conn = spawn(consumer_process, "cpu")
    try:
        shape = (16, 32, 8)
        generations = []
        for step in range(6):
            ref = producer.put(pattern(shape, step))
            assert isinstance(ref, SlotRef)
            conn.send((ref, step, None))
            ack, ok = recv(conn)
            assert ok, f"step {step}: consumer saw the wrong contents"
            producer.release(ack)
            generations.append(ref.generation)
        for step in range(3):  # sharded: one consumer process reads each rank in turn
            x = pattern((4, 6, 8), step)
            ref = producer.put(x, shard_dim=1, num_shards=3)
            for r in range(3):
                conn.send((ref, step, r))
                ack, ok = recv(conn)
                assert ok and ack.shard_rank == r
                producer.release(ack)
        assert producer.in_use() == 0
        assert generations == [1, 2, 3, 4, 5, 6]
        stats = producer.stats()
        assert stats["fallbacks"] == 0 and stats["bytes_allocated"] == 2 * (16 * 32 * 8 + 4 * 6 * 8) * 4
        stop(proc, conn)
    finally:
        if proc.is_alive():
            proc.kill()
        producer.close()
    assert leaked_segments(os.getpid()) == []


@pytest.mark.processes
def test_killed_consumer_does_not_leak() -> None:
    producer = ChannelProducer("killed", CPU)
    proc, conn = spawn(holding_process)
    try:
        conn.send(producer.put(torch.ones(1 << 16)))
        assert recv(conn) == float(1 << 16)  # the consumer has the slot mapped
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(RECV_TIMEOUT_S)
        assert proc.exitcode == -signal.SIGKILL
    finally:
        if proc.is_alive():
            proc.kill()
        producer.close()
    assert leaked_segments(os.getpid()) == []


@pytest.mark.processes
def test_crashed_producer_segments_can_be_removed() -> None:
    proc, conn = spawn(crashing_producer_process)
    try:
        pid = recv(conn)
        conn.send(None)
        proc.join(RECV_TIMEOUT_S)
    finally:
        if proc.is_alive():
            proc.kill()
    assert len(leaked_segments(pid)) == 2  # a producer that dies without closing leaks its files ...
    assert remove_segments(pid) == 2  # ... which its supervisor removes by pid
    assert leaked_segments(pid) == []


def test_a_servers_start_removes_the_files_of_producers_that_no_longer_run(
    channel: tuple[ChannelProducer, ChannelConsumer],
) -> None:
    """What a process group killed at once leaves: files named for a pid that no process has. A live
    producer's files (this process's) stay."""
    producer, _ = channel
    producer.put(torch.ones(4))
    ours = leaked_segments(os.getpid())
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    unused = next(pid for pid in range(pid_max - 1, 1, -1) if not Path(f"/proc/{pid}").exists())
    orphan = SHM_DIR / f"{SEGMENT_PREFIX}{unused}-dit0-0"
    orphan.write_bytes(b"\0" * 64)
    try:
        assert remove_orphaned_segments() >= 1
        assert not orphan.exists()
        assert leaked_segments(os.getpid()) == ours and ours
    finally:
        orphan.unlink(missing_ok=True)


# ---- CUDA ----


@pytest.mark.gpu
@cuda_only
def test_cuda_round_trip_in_process() -> None:
    producer = ChannelProducer("gpu", "cuda:0")
    consumer = ChannelConsumer("cuda:0")
    try:
        for step in range(4):
            torch.cuda._sleep(50_000_000)
            ref = producer.put(pattern((64, 128), step, "cuda:0"))
            assert isinstance(ref, SlotRef) and ref.device == "cuda:0"
            got = consumer.get(ref)
            assert got.is_cuda and torch.equal(got, pattern((64, 128), step, "cuda:0"))
            producer.release(consumer.ack(ref))
        assert producer.stats()["bytes_allocated"] == 2 * 64 * 128 * 4
        assert pickle.loads(pickle.dumps(ref)).handle.event == ref.handle.event
    finally:
        consumer.close()
        producer.close()


def run_cuda_producer(
    shape: tuple[int, ...], shard_dim: int | None, num_shards: int, consumer_device: str, steps: int = 4
) -> dict[str, int]:
    """A CUDA producer process; this process consumes each step (as every shard rank) and checks it."""
    proc, conn = spawn(cuda_producer_process, shape, shard_dim, num_shards)
    consumers = [ChannelConsumer(consumer_device) for _ in range(num_shards)]
    try:
        for step in range(steps):
            conn.send(step)
            ref = recv(conn)
            assert isinstance(ref, SlotRef) and ref.device == "cuda:0"
            want = pattern(shape, step, consumer_device)
            acks = []
            for r, consumer in enumerate(consumers):
                rank = r if num_shards > 1 else None
                got = consumer.get(ref, shard_rank=rank)  # must wait for the producer's event
                part = want if rank is None else want.narrow(shard_dim, r * shape[shard_dim] // num_shards,
                                                               shape[shard_dim] // num_shards)  # fmt: skip
                assert torch.equal(got, part), f"step {step} rank {r}: read before the producer's copy landed"
                acks.append(consumer.ack(ref))
            conn.send(acks)
            stats = recv(conn)
        stop(proc, conn)
        return stats
    finally:
        for consumer in consumers:
            consumer.close()
        if proc.is_alive():
            proc.kill()


@pytest.mark.gpu
@cuda_only
def test_cuda_ipc_round_trip_across_processes() -> None:
    stats = run_cuda_producer((256, 1024), None, 1, "cuda:0")
    assert stats["slot_puts"] == 4 and stats["fallbacks"] == 0 and stats["bytes_allocated"] == 2 * 256 * 1024 * 4


@pytest.mark.gpu
@cuda_only
def test_cuda_ipc_sharded_across_processes() -> None:
    stats = run_cuda_producer((4, 6, 8), 1, 3, "cuda:0")
    assert stats["releases"] == 4 * 3 and stats["fallbacks"] == 0


@pytest.mark.gpu
@cuda_only
def test_cuda_slot_to_host_consumer() -> None:
    stats = run_cuda_producer((32, 32), None, 1, "cpu", steps=2)
    assert stats["slot_puts"] == 2


def test_a_host_copy_is_private_contiguous_and_exact_for_every_dtype() -> None:
    """The consumer's host copies (made on the calling thread, not torch's intra-op pool)."""
    from workers.runtime.channel import _host_copy

    for dtype in (torch.uint8, torch.float32, torch.bfloat16):
        view = torch.arange(48, dtype=torch.float32).to(dtype).view(4, 3, 4)[:, 1:]  # strided, like a shard
        copy = _host_copy(view)
        assert copy.dtype == dtype and copy.is_contiguous() and torch.equal(copy, view)
        view[0, 0, 0] = 99  # the slot is written again: the copy keeps what it read
        assert copy[0, 0, 0] != 99
