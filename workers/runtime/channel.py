"""Direct tensor channels between worker processes: producer-owned slot pools, named by small refs.

A producer copies a tensor into one of its preallocated slots and returns a `SlotRef` (a small
picklable record: no tensor inside). The scheduler forwards the ref to the consumer(s) in their
command; a consumer opens the slot once (cached), copies out or takes a view, and replies with an
`Ack`, which the scheduler forwards back to the producer, which frees the slot. Channel objects never
talk to each other: they only create and consume refs and acks. Cancelling = the scheduler builds
`Ack.of(ref, "discarded")` on the consumer's behalf, for refs it has not handed to a consumer (a
consumer still reading a discarded slot would race the producer's next copy).

Transports, chosen by the producer's device:
- CPU: one file per slot in /dev/shm (`worldrtc-<producer pid>-<channel id>-<n>`), mapped by both
  sides; `torch.frombuffer` gives zero-copy views. Not multiprocessing.shared_memory, whose resource
  tracker warns about and unlinks segments across processes. A crashed producer leaks its files:
  `leaked_segments(pid)` finds them, `remove_segments(pid)` removes them (its supervisor does), and
  `remove_orphaned_segments()` removes those of every producer that no longer runs (a server's
  start does: a server killed with all its workers at once could not).
- CUDA: slots are device tensors shared by CUDA IPC (torch's `reduce_tensor` args, opened once per
  slot), each with an interprocess event recorded after the producer's copy; the consumer's stream
  waits on it before reading, and the consumer synchronises its stream before acking, so the
  producer may reuse the slot as soon as the ack arrives. No host staging.

Sharding: `put(t, shard_dim=d, num_shards=n)` fills one slot; consumer rank r reads and copies only
`t.narrow(d, r·size/n, size/n)` and acks its rank; the slot is free once all n ranks acked (or one
whole-slot ack arrived, e.g. a discard). A ref read in full by several consumers is acked once, by
the scheduler, after all of them replied.

Bounds and overflow policy: at most `max_profiles` pools of `slots_per_profile` slots each, one pool
per profile (shape, dtype, device), allocated on the profile's first put and reused after (no
allocation in steady state). A put of a new profile beyond `max_profiles`, or of a profile whose
slots are all awaiting acks, returns an `InlineTensor` instead (the tensor as a contiguous CPU copy,
pickled as bytes through the control pipe) and counts it in `stats()` (`fallback_profiles`,
`fallback_busy`). The producer never blocks on a consumer.

Teardown order: consumers `close()` first (unmap), then producers `close()` (unmap and unlink);
a producer closing first is safe too (mappings keep unlinked memory alive until unmapped). Both
`close()` are idempotent. One thread per channel object.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import re
import secrets
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch.multiprocessing.reductions import reduce_tensor

SHM_DIR = Path("/dev/shm")
SEGMENT_PREFIX = "worldrtc-"
_CHANNEL_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SEGMENT_OWNER = re.compile(rf"^{re.escape(SEGMENT_PREFIX)}(\d+)-")  # the producer's pid, in every channel file's name
_SEGMENT_COUNTER = itertools.count()  # process-wide, so two producers of one channel id never collide

Outcome = Literal["copied", "discarded"]
OUTCOMES: tuple[str, ...] = ("copied", "discarded")


class StaleAckError(ValueError):
    """An ack names a slot that was already released or reused, or an earlier producer instance."""


class SlotGoneError(RuntimeError):
    """A ref names a slot whose producer has closed or exited."""


# ---- messages ----


@dataclass(frozen=True)
class ShmHandle:
    name: str  # file name under SHM_DIR
    nbytes: int


@dataclass(frozen=True)
class CudaHandle:
    rebuild: Callable[..., torch.Tensor]  # torch's rebuild function for `args` (pickled by reference)
    args: tuple[Any, ...]  # from torch.multiprocessing.reductions.reduce_tensor: IPC memory handle etc.
    event: bytes  # ipc_handle() of the slot's interprocess event
    device_index: int


@dataclass(frozen=True)
class SlotRef:
    """Names one filled slot. Small and picklable; valid until the producer gets its ack(s)."""

    channel_id: str
    producer: str  # "<pid>.<nonce>" of the producer object: a restarted producer's acks don't match
    profile_id: int
    slot: int
    generation: int  # increments on every reuse of the slot, so stale acks are detected
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    device: str  # where the slot lives, e.g. "cpu", "cuda:0"
    handle: ShmHandle | CudaHandle
    shard_dim: int | None = None
    num_shards: int = 1

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * _dtype(self.dtype).itemsize

    def shard_nbytes(self) -> int:
        return self.nbytes // self.num_shards


@dataclass(frozen=True, eq=False)
class InlineTensor:
    """Overflow fallback: the tensor itself, a contiguous CPU copy, pickled as raw bytes.

    Pickling goes through bytes (not torch's tensor reductions, which would pass a shared-memory
    file descriptor), so it travels through any pipe like any other message.
    """

    tensor: torch.Tensor
    shard_dim: int | None = None
    num_shards: int = 1
    channel_id: str = ""

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def __reduce__(self) -> tuple[Any, ...]:
        t = self.tensor
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        args = (data, tuple(t.shape), _dtype_name(t.dtype), self.shard_dim, self.num_shards, self.channel_id)
        return (_rebuild_inline, args)


def _rebuild_inline(
    data: bytes, shape: tuple[int, ...], dtype: str, shard_dim: int | None, num_shards: int, channel_id: str
) -> InlineTensor:
    if data:
        tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(_dtype(dtype)).reshape(shape)
    else:
        tensor = torch.empty(shape, dtype=_dtype(dtype))
    return InlineTensor(tensor, shard_dim, num_shards, channel_id)


TensorRef = SlotRef | InlineTensor


@dataclass(frozen=True)
class Ack:
    """A consumer is done with a slot (or the scheduler cancels it). Goes back to the producer."""

    ref: SlotRef | None  # None: the tensor came inline, so there is nothing to free
    outcome: Outcome = "copied"
    shard_rank: int | None = None  # None: the whole slot (every rank), e.g. a discard

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"ack outcome must be one of {OUTCOMES}, got {self.outcome!r}")

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor this ack releases (0 for an inline tensor)."""
        return 0 if self.ref is None else self.ref.nbytes

    @staticmethod
    def of(ref: TensorRef, outcome: Outcome = "copied", shard_rank: int | None = None) -> Ack:
        return Ack(ref if isinstance(ref, SlotRef) else None, outcome, shard_rank)


# ---- producer ----


@dataclass
class _Slot:
    tensor: torch.Tensor  # the slot's memory, shaped as its profile
    handle: ShmHandle | CudaHandle
    event: Any = None  # CUDA: torch.cuda.Event(interprocess=True)
    generation: int = 0
    pending: set[int] | None = None  # shard ranks still to ack; None: free


@dataclass
class _Pool:
    profile_id: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    slots: list[_Slot]


_STAT_KEYS = (
    "puts",
    "slot_puts",
    "fallbacks",
    "fallback_profiles",
    "fallback_busy",
    "releases",
    "discards",
    "profiles",
    "bytes_allocated",
)

# Producers of this process by instance id: a consumer in the same process reads CUDA slots directly
# (CUDA IPC handles cannot be opened by the process that exported them).
_LOCAL_PRODUCERS: weakref.WeakValueDictionary[str, ChannelProducer] = weakref.WeakValueDictionary()


class ChannelProducer:
    def __init__(
        self, channel_id: str, device: torch.device | str, slots_per_profile: int = 2, max_profiles: int = 4
    ) -> None:
        if not _CHANNEL_ID.match(channel_id):
            raise ValueError(f"channel id {channel_id!r}: use 1-64 characters from [A-Za-z0-9_.-]")
        if slots_per_profile < 1 or max_profiles < 1:
            raise ValueError(f"slots_per_profile ({slots_per_profile}) and max_profiles ({max_profiles}) must be ≥ 1")
        self.channel_id = channel_id
        self.device = _normalize_device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"channel device must be cpu or cuda, got {self.device}")
        if self.device.type == "cpu" and not SHM_DIR.is_dir():
            raise ValueError(f"{SHM_DIR} is missing: the CPU channel needs a Linux tmpfs there")
        self.slots_per_profile = slots_per_profile
        self.max_profiles = max_profiles
        self._pid = os.getpid()
        self.instance = f"{self._pid}.{secrets.token_hex(4)}"
        self._pools: dict[tuple[tuple[int, ...], torch.dtype, torch.device], _Pool] = {}
        self._pools_by_id: dict[int, _Pool] = {}
        self._paths: list[str] = []
        # Unlinks this process's files at close, at garbage collection, or at interpreter exit.
        self._unlink = weakref.finalize(self, _unlink_paths, self._pid, self._paths)
        self._stats = dict.fromkeys(_STAT_KEYS, 0)
        self._closed = False
        _LOCAL_PRODUCERS[self.instance] = self

    def put(self, tensor: torch.Tensor, shard_dim: int | None = None, num_shards: int = 1) -> TensorRef:
        """Copy `tensor` into a free slot of its profile; an `InlineTensor` on overflow (module docstring)."""
        if self._closed:
            raise RuntimeError(f"channel {self.channel_id!r} is closed")
        shape = tuple(tensor.shape)
        shard_dim = _check_shards(shape, shard_dim, num_shards)
        tensor = tensor.detach()
        self._stats["puts"] += 1
        if tensor.numel() == 0:
            return self._inline(tensor, shard_dim, num_shards)  # nothing worth a slot
        key = (shape, tensor.dtype, self.device)
        pool = self._pools.get(key)
        if pool is None:
            if len(self._pools) >= self.max_profiles:
                self._stats["fallback_profiles"] += 1
                return self._inline(tensor, shard_dim, num_shards)
            pool = self._allocate(key)
        index = next((i for i, s in enumerate(pool.slots) if s.pending is None), None)
        if index is None:
            self._stats["fallback_busy"] += 1
            return self._inline(tensor, shard_dim, num_shards)
        slot = pool.slots[index]
        self._copy_in(slot, tensor)
        slot.generation += 1
        slot.pending = set(range(num_shards))
        self._stats["slot_puts"] += 1
        return SlotRef(
            channel_id=self.channel_id,
            producer=self.instance,
            profile_id=pool.profile_id,
            slot=index,
            generation=slot.generation,
            shape=shape,
            dtype=_dtype_name(tensor.dtype),
            device=str(self.device),
            handle=slot.handle,
            shard_dim=shard_dim,
            num_shards=num_shards,
        )

    def release(self, ack: Ack) -> None:
        """Apply a consumer's (or the scheduler's) ack; the slot is free once every shard rank acked."""
        if ack.ref is None or self._closed:
            return  # inline tensors hold nothing; after close every slot is gone anyway
        ref = ack.ref
        if ref.channel_id != self.channel_id:
            raise ValueError(f"ack for channel {ref.channel_id!r} sent to channel {self.channel_id!r}")
        where = f"channel {ref.channel_id!r} profile {ref.profile_id} slot {ref.slot}"
        if ref.producer != self.instance:
            raise StaleAckError(f"ack for {where} names producer {ref.producer}, now {self.instance} (restarted)")
        pool = self._pools_by_id.get(ref.profile_id)
        if pool is None or not 0 <= ref.slot < len(pool.slots):
            raise ValueError(f"ack for {where}: no such slot")
        slot = pool.slots[ref.slot]
        if ref.generation != slot.generation:
            raise StaleAckError(
                f"stale ack for {where}: generation {ref.generation}, but the slot was reused (now {slot.generation})"
            )
        if slot.pending is None:
            raise StaleAckError(f"duplicate ack for {where} generation {ref.generation}: already released")
        if ack.shard_rank is None:
            slot.pending.clear()
        elif ack.shard_rank in slot.pending:
            slot.pending.discard(ack.shard_rank)
        else:
            raise StaleAckError(f"duplicate or out-of-range ack of shard rank {ack.shard_rank} for {where}")
        if not slot.pending:
            slot.pending = None
        self._stats["releases"] += 1
        if ack.outcome == "discarded":
            self._stats["discards"] += 1

    def in_use(self) -> int:
        return sum(s.pending is not None for pool in self._pools.values() for s in pool.slots)

    def stats(self) -> dict[str, int]:
        """puts (all), slot_puts, fallbacks (= fallback_profiles + fallback_busy), releases (acks applied:
        one per shard rank, or one per whole-slot ack), discards (of those, outcome "discarded"), profiles,
        bytes_allocated (slot memory, constant once every profile has been seen)."""
        stats = dict(self._stats)
        stats["fallbacks"] = stats["fallback_profiles"] + stats["fallback_busy"]
        stats["profiles"] = len(self._pools)
        return stats

    def close(self) -> None:
        """Free every slot; for CPU unlink every file this process created. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _LOCAL_PRODUCERS.pop(self.instance, None)
        self._pools.clear()
        self._pools_by_id.clear()  # drops the slot tensors, which own (and unmap) the mappings
        if self.device.type == "cuda" and torch.cuda.is_initialized():
            torch.cuda.ipc_collect()  # frees slots whose consumers have let go of them
        self._unlink()

    # ---- internals ----

    def _inline(self, tensor: torch.Tensor, shard_dim: int | None, num_shards: int) -> InlineTensor:
        cpu = tensor.to("cpu", memory_format=torch.contiguous_format, copy=True)
        return InlineTensor(cpu, shard_dim, num_shards, self.channel_id)

    def _allocate(self, key: tuple[tuple[int, ...], torch.dtype, torch.device]) -> _Pool:
        shape, dtype, _ = key
        pool = _Pool(profile_id=len(self._pools_by_id), shape=shape, dtype=dtype, slots=[])
        nbytes = _numel(shape) * dtype.itemsize
        for _ in range(self.slots_per_profile):
            slot = self._new_cuda_slot(shape, dtype) if self.device.type == "cuda" else self._new_shm_slot(shape, dtype)
            pool.slots.append(slot)
            self._stats["bytes_allocated"] += nbytes
        self._pools[key] = pool
        self._pools_by_id[pool.profile_id] = pool
        return pool

    def _new_shm_slot(self, shape: tuple[int, ...], dtype: torch.dtype) -> _Slot:
        nbytes = _numel(shape) * dtype.itemsize
        name = f"{SEGMENT_PREFIX}{self._pid}-{self.channel_id}-{next(_SEGMENT_COUNTER)}"
        path = SHM_DIR / name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        self._paths.append(str(path))  # before anything can fail, so close() still unlinks it
        try:
            try:
                # Reserve the pages now: a full tmpfs fails here, not with SIGBUS on a later write.
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as e:
                raise RuntimeError(
                    f"{SHM_DIR} has no room for {nbytes} bytes (channel {self.channel_id!r}): enlarge it "
                    "(docker: --shm-size) or lower slots_per_profile / max_profiles"
                ) from e
            mapping = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        return _Slot(tensor=_view(mapping, shape, dtype), handle=ShmHandle(name, nbytes))

    def _new_cuda_slot(self, shape: tuple[int, ...], dtype: torch.dtype) -> _Slot:
        with torch.cuda.device(self.device):
            tensor = torch.empty(shape, dtype=dtype, device=self.device)
            event = torch.cuda.Event(interprocess=True)
            event.record()  # creates it on this device; a consumer waiting before the first put returns at once
            rebuild, args = reduce_tensor(tensor)
            handle = CudaHandle(rebuild, tuple(args), bytes(event.ipc_handle()), self.device.index)
        return _Slot(tensor=tensor, handle=handle, event=event)

    def _copy_in(self, slot: _Slot, tensor: torch.Tensor) -> None:
        if self.device.type == "cpu":
            slot.tensor.copy_(tensor)
            return
        with torch.cuda.device(self.device):
            slot.tensor.copy_(tensor, non_blocking=tensor.is_cuda)  # a host source copies synchronously
            slot.event.record(torch.cuda.current_stream(self.device))

    def _local_slot(self, ref: SlotRef) -> _Slot:
        pool = self._pools_by_id.get(ref.profile_id)
        if pool is None or not 0 <= ref.slot < len(pool.slots):
            raise SlotGoneError(f"channel {ref.channel_id!r}: no profile {ref.profile_id} slot {ref.slot}")
        return pool.slots[ref.slot]


# ---- consumer ----


@dataclass
class _Opened:
    producer: str
    tensor: torch.Tensor  # the whole slot, shaped
    event: Any = None


def _host_copy(view: torch.Tensor) -> torch.Tensor:
    """A private, contiguous copy of a host tensor, made on the calling thread alone. Torch's copy
    would use its intra-op pool, and in a process that runs no model (the server, whose engine
    thread copies every part of the frames out of the decode's slots) that pool spins on the cores
    the workers compute on: on a busy 2-core machine a 200 kB copy took 6 ms and 9 ms of CPU on 2
    threads, against 0.1 ms on one. A dtype numpy lacks (bfloat16) is copied by torch."""
    try:
        array = view.numpy()
    except TypeError:
        return torch.empty(view.shape, dtype=view.dtype, device=view.device).copy_(view)
    return torch.from_numpy(array.copy(order="C"))


class ChannelConsumer:
    def __init__(self, device: torch.device | str) -> None:
        self.device = _normalize_device(device)
        self._open: dict[tuple[str, int, int], _Opened] = {}
        # The shard rank each slot was last read as, so `ack(ref)` acks the right rank.
        self._ranks: dict[tuple[str, str, int, int], tuple[int, int | None]] = {}
        self._closed = False

    def get(self, ref: TensorRef, shard_rank: int | None = None, copy: bool = True) -> torch.Tensor:
        """The tensor (or rank `shard_rank`'s shard of it) on this consumer's device.

        copy=True: a private copy, so the slot may be acked at once. copy=False: a view of the slot
        where it is already on this device (valid until this consumer acks); otherwise a copy anyway.
        """
        if self._closed:
            raise RuntimeError("channel consumer is closed")
        if isinstance(ref, InlineTensor):
            view = _shard(ref.tensor, ref.shard_dim, ref.num_shards, shard_rank)
            if view.device == self.device:
                return view.clone(memory_format=torch.contiguous_format) if copy else view
            return view.to(self.device)
        if not isinstance(ref, SlotRef):
            raise TypeError(f"expected SlotRef or InlineTensor, got {type(ref).__name__}")
        opened = self._slot(ref)
        view = _shard(opened.tensor, ref.shard_dim, ref.num_shards, shard_rank)
        self._ranks[(ref.producer, ref.channel_id, ref.profile_id, ref.slot)] = (ref.generation, shard_rank)
        if view.is_cuda:
            return self._get_cuda(view, opened, copy)
        if view.device == self.device:
            return _host_copy(view) if copy else view
        return view.to(self.device)  # host slot -> device: pageable copy, done with the slot on return

    def ack(self, ref: TensorRef, outcome: Outcome = "copied", shard_rank: int | None = None) -> Ack:
        """The message that lets the producer reuse the slot. Call it once done with any view."""
        if not isinstance(ref, SlotRef):
            return Ack.of(ref, outcome, shard_rank)
        read = self._ranks.pop((ref.producer, ref.channel_id, ref.profile_id, ref.slot), None)
        if shard_rank is None and read is not None and read[0] == ref.generation:
            shard_rank = read[1]
        if self.device.type == "cuda" or ref.device.startswith("cuda"):
            # Our copy (or use of a view) must be finished before the producer may overwrite the slot.
            for device in {self.device, torch.device(ref.device)}:
                if device.type == "cuda":
                    torch.cuda.current_stream(device).synchronize()
        return Ack(ref, outcome, shard_rank)

    def forget(self, channel_id: str) -> None:
        """Unmap every slot of one channel (e.g. its producer exited and will not come back)."""
        for key in [k for k in self._open if k[0] == channel_id]:
            del self._open[key]

    def close(self) -> None:
        """Unmap everything. Idempotent. Close consumers before their producers."""
        if self._closed:
            return
        self._closed = True
        self._open.clear()  # each slot unmaps once no view a caller still holds refers to it
        self._ranks.clear()

    # ---- internals ----

    def _slot(self, ref: SlotRef) -> _Opened:
        key = (ref.channel_id, ref.profile_id, ref.slot)
        opened = self._open.get(key)
        if opened is not None and opened.producer == ref.producer:
            return opened
        if opened is not None:  # the producer was recreated: its old mapping is stale
            del self._open[key]
        opened = self._open_cuda(ref) if isinstance(ref.handle, CudaHandle) else _open_shm(ref)
        self._open[key] = opened
        return opened

    def _open_cuda(self, ref: SlotRef) -> _Opened:
        handle = ref.handle
        assert isinstance(handle, CudaHandle)
        if ref.producer.split(".")[0] == str(os.getpid()):
            local = _LOCAL_PRODUCERS.get(ref.producer)
            if local is None:
                raise SlotGoneError(f"channel {ref.channel_id!r}: its producer in this process has closed")
            slot = local._local_slot(ref)
            return _Opened(ref.producer, slot.tensor, event=slot.event)
        device = torch.device("cuda", handle.device_index)
        with torch.cuda.device(device):
            tensor = handle.rebuild(*handle.args)  # opens the IPC memory handle, once per slot
            event = torch.cuda.Event.from_ipc_handle(device, handle.event)
        return _Opened(ref.producer, tensor, event=event)

    def _get_cuda(self, view: torch.Tensor, opened: _Opened, copy: bool) -> torch.Tensor:
        # Our streams wait (on the GPU) for the producer's copy into the slot.
        streams = {view.device: torch.cuda.current_stream(view.device)}
        if self.device.type == "cuda":
            streams[self.device] = torch.cuda.current_stream(self.device)
        for stream in streams.values():
            opened.event.wait(stream)
        if view.device == self.device:
            if not copy:
                return view
            out = torch.empty(view.shape, dtype=view.dtype, device=self.device)
            return out.copy_(view, non_blocking=True)
        return view.to(self.device)


def _open_shm(ref: SlotRef) -> _Opened:
    handle = ref.handle
    assert isinstance(handle, ShmHandle)
    try:
        fd = os.open(SHM_DIR / handle.name, os.O_RDWR)  # read-write so a stray write can't SIGSEGV
    except FileNotFoundError:
        raise SlotGoneError(
            f"channel {ref.channel_id!r}: {handle.name} is gone (its producer closed or exited)"
        ) from None
    try:
        size = os.fstat(fd).st_size
        if size != handle.nbytes or handle.nbytes != ref.nbytes:
            raise SlotGoneError(
                f"{handle.name}: {size} bytes, the ref says {handle.nbytes} ({ref.nbytes} for the tensor)"
            )
        mapping = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return _Opened(ref.producer, _view(mapping, ref.shape, _dtype(ref.dtype)))


# ---- leak checks ----


def leaked_segments(pid: int | None = None) -> list[str]:
    """Channel files under /dev/shm (names), all of them or those of one producer pid."""
    prefix = SEGMENT_PREFIX if pid is None else f"{SEGMENT_PREFIX}{pid}-"
    try:
        return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefix))
    except FileNotFoundError:
        return []


def remove_segments(pid: int) -> int:
    """Unlink the channel files of a producer process that exited without closing. Returns how many."""
    names = leaked_segments(pid)
    _unlink_paths(os.getpid(), [str(SHM_DIR / name) for name in names])
    return len(names)


def remove_orphaned_segments() -> int:
    """Unlink the channel files whose producer no longer runs, of any earlier server of this user:
    one killed with its whole process group (systemd, `kill -9 -- -PGID`, the OOM killer) left them,
    and nobody else will. A live producer's files are never touched (another server's included),
    nor another user's. Returns how many."""
    removed = 0
    for name in leaked_segments():
        match = _SEGMENT_OWNER.match(name)
        if match is None or _running(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            path = SHM_DIR / name
            if path.stat().st_uid == os.getuid():
                path.unlink()
                removed += 1
    return removed


def _running(pid: int) -> bool:
    """Whether `pid` is a process that can still unlink its own files (a zombie cannot)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: leave its files alone
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # the state follows the command name


# ---- helpers ----


def _normalize_device(device: torch.device | str) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device}: CUDA is not available in this process")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _check_shards(shape: tuple[int, ...], shard_dim: int | None, num_shards: int) -> int | None:
    if num_shards < 1:
        raise ValueError(f"num_shards must be ≥ 1, got {num_shards}")
    if shard_dim is None:
        if num_shards != 1:
            raise ValueError(f"num_shards={num_shards} needs a shard_dim")
        return None
    if not -len(shape) <= shard_dim < len(shape):
        raise ValueError(f"shard_dim {shard_dim} out of range for shape {list(shape)}")
    dim = shard_dim % len(shape)
    if shape[dim] % num_shards:
        raise ValueError(
            f"dim {dim} of shape {list(shape)} ({shape[dim]}) does not split into {num_shards} equal shards"
        )
    return dim


def _shard(tensor: torch.Tensor, shard_dim: int | None, num_shards: int, shard_rank: int | None) -> torch.Tensor:
    if shard_rank is None:
        return tensor
    if not 0 <= shard_rank < num_shards:
        raise ValueError(f"shard rank {shard_rank} outside 0..{num_shards - 1}")
    if shard_dim is None or num_shards == 1:
        return tensor
    size = tensor.shape[shard_dim] // num_shards
    return tensor.narrow(shard_dim, shard_rank * size, size)


def _view(mapping: mmap.mmap, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    # The tensor keeps a reference to the mmap object but no buffer export, so mapping.close() would
    # succeed and leave it dangling: never close one; it unmaps when the last tensor on it is freed.
    return torch.frombuffer(mapping, dtype=torch.uint8).view(dtype).view(shape)


def _unlink_paths(owner_pid: int, paths: list[str]) -> None:
    if os.getpid() != owner_pid:
        return  # a forked child must not unlink its parent's slots
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    paths.clear()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype
