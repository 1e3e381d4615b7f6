"""The memory plan: what every worker of a placement holds, per device, against its capacity.

    worldrtc plan PRESET --placement P --max-sessions N [--gpu-memory-gib 80] [savings flags]

Savings (workers/models/savings.py) change what is planned as they change what runs: the VAE's
dtype and height bands (traced), the DiT's fp8 block weights (traced), and the context encoder on
the host (its weights and activations move to the host's line).

Per worker it lists weights (by component and dtype), the state each open session keeps (the
DiT's KV cache and text K/V, the VAE's causal caches), one chunk's activations, the tensor
channel's slots and frame ring, and per device the CUDA contexts of every process that touches it
(its own workers, and the workers that map its IPC slots) and NCCL buffers. The model figures
come from tracing the stage code on the `meta` device (workers/runtime/footprint.py); the runtime
figures below are measured constants. The server runs the same plan at start and refuses a
placement that cannot fit (server/state.py), naming the device, the shortfall and placements that
would fit.

Approximations, stated once: a multi-rank stage's activations and (decode) caches are the
one-rank figure divided by the rank count (Ulysses splits tokens or heads evenly, decode splits
rows; replicated pieces such as the gathered velocity are small), and the CUDA caching
allocator's rounding and fragmentation are a margin on the device's tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workers.chunk_geometry import video_frames
from workers.families.registry import family_for
from workers.models.attention_backend import AttentionBackend
from workers.models.components import Precision
from workers.models.kernels import DEFAULT_KERNELS, KernelConfig
from workers.models.presets import ModelPreset
from workers.models.savings import NO_SAVINGS, Quantization, Savings
from workers.runtime.footprint import context_encoder_footprint, dit_footprint, vae_footprints
from workers.runtime.handler import StageHandler
from workers.runtime.messages import Stage
from workers.runtime.placement import PLACEMENTS, Placement, PlacementError
from workers.runtime.spec import WorkerSpec

MIB = 2**20
GIB = 2**30
# A CPU worker process apart from its model's tensors: Python, torch and its libraries, oneDNN's
# primitive caches and malloc arenas (a bare process that imports the worker modules holds 240 MiB
# before any op runs). Measured per stage on x86-64 Linux with torch 2.13 (CPU build), from the
# workers' peak resident sets with the tiny and gridworld models, whose tensors are a few MiB.
CPU_WORKER_RUNTIME_BYTES = {Stage.ENCODE: 350 * MIB, Stage.DIT: 330 * MIB, Stage.DECODE: 300 * MIB}
# The server process itself (FastAPI, aiortc, the video encoders), on the host, for CPU placements.
SERVER_RUNTIME_BYTES = 400 * MIB
# A CUDA context with torch's kernels, cuBLAS and cuDNN loaded and their workspaces, on the device a
# process computes on; a process that only maps another device's IPC slots creates a lighter one.
CUDA_CONTEXT_BYTES = 768 * MIB
CUDA_PEER_CONTEXT_BYTES = 512 * MIB
NCCL_BUFFER_BYTES = 256 * MIB  # per rank of a multi-rank group on CUDA
ALLOCATOR_MARGIN = 0.05  # of a CUDA device's tensor bytes: the caching allocator's rounding and fragments
DEFAULT_DEVICE_GIB = 80.0
HOST = "cpu"


@dataclass(frozen=True)
class Line:
    what: str
    nbytes: int
    # Host shared memory mapped by several processes: counted in each one's resident set, once per device.
    shared: bool = False


@dataclass(frozen=True)
class WorkerPlan:
    name: str  # stage and rank, as RUN.json's peak_memory names workers: "dit1"
    device: str
    stage_ranks: int  # ranks of its stage
    lines: tuple[Line, ...]

    @property
    def total_bytes(self) -> int:
        return sum(line.nbytes for line in self.lines)


@dataclass(frozen=True)
class DevicePlan:
    device: str
    workers: tuple[WorkerPlan, ...]
    extra: tuple[Line, ...]  # contexts, NCCL, margin, server process: not any one worker's tensors
    capacity_bytes: int | None

    @property
    def total_bytes(self) -> int:
        own = sum(line.nbytes for w in self.workers for line in w.lines if not line.shared)
        shared = {line.what: line.nbytes for w in self.workers for line in w.lines if line.shared}
        return own + sum(shared.values()) + sum(line.nbytes for line in self.extra)

    def summary(self) -> str:
        cap = "unknown capacity" if self.capacity_bytes is None else _gib(self.capacity_bytes)
        return f"{_label(self.device)}: {_gib(self.total_bytes)} of {cap}"

    @property
    def shortfall_bytes(self) -> int:
        return 0 if self.capacity_bytes is None else max(0, self.total_bytes - self.capacity_bytes)


@dataclass(frozen=True)
class MemoryPlan:
    preset: str
    placement: str
    max_sessions: int
    kernels: KernelConfig
    devices: tuple[DevicePlan, ...]
    savings: Savings = NO_SAVINGS
    # One snapshot (workers/session_state.py): a copy of one session's state on every worker, in
    # host memory. The largest it gets: before the condition stream's fixed point, with its caches;
    # and once the encoder has reached it (a few chunks in), without them.
    snapshot_bytes: int = 0
    snapshot_steady_bytes: int = 0

    @property
    def fits(self) -> bool:
        return all(d.shortfall_bytes == 0 for d in self.devices)

    def worker(self, name: str) -> WorkerPlan:
        return next(w for d in self.devices for w in d.workers if w.name == name)

    def describe(self) -> str:
        head = f"memory plan: {self.preset} on {self.placement}, {self.max_sessions} session(s)"
        out = [head, f"savings: {self.savings.describe()}"]
        for d in self.devices:
            cap = "capacity unknown" if d.capacity_bytes is None else f"capacity {_gib(d.capacity_bytes)}"
            verdict = "fits" if d.shortfall_bytes == 0 else f"SHORT by {_gib(d.shortfall_bytes)}"
            out.append(f"\n{_label(d.device)}: {_gib(d.total_bytes)} of {cap}: {verdict}")
            for w in d.workers:
                rank = "" if w.stage_ranks == 1 else f" (of {w.stage_ranks} ranks)"
                out.append(f"  {w.name}{rank}: {_gib(w.total_bytes)}")
                out += [f"    {line.what:<58} {_gib(line.nbytes):>11}" for line in w.lines]
            out += [f"  {line.what:<60} {_gib(line.nbytes):>11}" for line in d.extra]
        first, steady = _size(self.snapshot_bytes), _size(self.snapshot_steady_bytes)
        out.append(f"\none snapshot (host memory, every worker's part of one session's state): {first}")
        out.append(f"  ({steady} once the condition encoder has reached its fixed point)")
        out.append("\n" + ("the placement fits" if self.fits else "the placement does NOT fit"))
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {
            "savings": self.savings.record(),
            "fits": self.fits,
            "device_totals": {
                d.device: {"total_bytes": d.total_bytes, "capacity_bytes": d.capacity_bytes} for d in self.devices
            },
        }


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _size(n: int) -> str:
    return _gib(n) if n >= GIB else f"{n / MIB:.1f} MiB"


def _label(device: str) -> str:
    return "host (cpu)" if device == HOST else device


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()


def plan_memory(
    preset: ModelPreset,
    placement: Placement,
    max_sessions: int,
    capacity: Callable[[str], int | None],
    kernels: KernelConfig = DEFAULT_KERNELS,
    frame_ring_slots: int = WorkerSpec.frame_ring_slots,
    savings: Savings = NO_SAVINGS,
) -> MemoryPlan:
    """The plan for `max_sessions` open sessions with `savings`; `capacity(device)` gives each device's bytes."""
    if max_sessions < 1:
        raise ValueError("max_sessions must be at least 1")
    n = max_sessions
    math = kernels.attention is AttentionBackend.MATH
    c = preset.chunk_latent_frames
    lat = (preset.latent_height, preset.latent_width)
    cond_bytes = _nbytes((1, 20, c, *lat), torch.float32)
    image_bytes = _nbytes((3, preset.height_px, preset.width_px), torch.float32)  # the condition stream keeps it
    latents_bytes = _nbytes((1, preset.vae.z_dim, c, *lat), torch.float32)
    slots = StageHandler.OUTPUT_SLOTS
    stage_devices = {s: [str(d) for d in placement.stage_devices(s.value)] for s in Stage}
    workers: list[WorkerPlan] = []

    # Encode: the VAE and the context encoder (umT5 or CLIP); per session the encoder caches plus the
    # condition stream's snapshot of them and its last condition (how it detects its fixed point,
    # workers/stages/condition.py), and on the host its repeat memo (not in a session's snapshots).
    # Counted as a session starts: at the fixed point, some chunks in, the caches, snapshot and memo
    # go and only the condition stays.
    dev = stage_devices[Stage.ENCODE][0]
    prec = Precision.for_device(torch.device(dev), savings)
    enc, _ = vae_footprints(preset, prec.vae, savings.vae_bands, dev == HOST)
    family = family_for(preset)
    ctx = context_encoder_footprint(preset, prec.context)
    context_here = dev == HOST or not savings.text_encoder_on_cpu
    context_bytes = _nbytes(family.context_shape(preset), prec.context)
    slot_bytes = slots * (cond_bytes + context_bytes)
    encode_slots = Line(f"output slots: {slots} conditions + {slots} contexts", slot_bytes, dev == HOST)
    snapshot = 2 * enc.session_bytes + cond_bytes + image_bytes
    encode_session = snapshot + enc.memo_bytes
    memo = "repeat memo, " if enc.memo_bytes else ""
    bands = "" if savings.vae_bands == 1 else f", {savings.vae_bands} bands"
    context_weights = Line(f"{family.context_name} weights ({_dtype_name(prec.context)})", ctx.weights_bytes)
    # A chunk's encode and a prompt's encoding take turns on the worker: the larger of the two.
    activations = (
        Line(f"activations (one chunk{bands}, or one context)", max(enc.peak_bytes, ctx.peak_bytes))
        if context_here
        else Line(f"activations (one chunk{bands})", enc.peak_bytes)
    )
    workers.append(
        WorkerPlan(
            "encode0",
            dev,
            1,
            (
                *_runtime(Stage.ENCODE, dev),
                Line(f"VAE weights ({_dtype_name(prec.vae)})", enc.weights_bytes),
                *((context_weights,) if context_here else ()),
                Line(f"VAE encoder caches, their copy, {memo}condition, image × {n}", n * encode_session),
                activations,
                encode_slots,
            ),
        )
    )
    if not context_here:  # --text-encoder-on-cpu: the encode worker's host memory holds the context encoder
        context_activations = Line(f"{family.context_name} activations (one context)", ctx.peak_bytes)
        workers.append(WorkerPlan("encode0 (host)", HOST, 1, (context_weights, context_activations)))

    # DiT: every rank holds all weights (Ulysses), its share of the heads' KV cache, all text K/V.
    ranks = len(stage_devices[Stage.DIT])
    fp8 = savings.quantization is Quantization.FP8
    for r, dev in enumerate(stage_devices[Stage.DIT]):
        prec = Precision.for_device(torch.device(dev), savings)
        dit = dit_footprint(preset, prec.dit, math, fp8)
        share = "" if ranks == 1 else f" (1/{ranks})"
        lines = [
            *_runtime(Stage.DIT, dev),
            Line(f"DiT weights ({'fp8 blocks, ' if fp8 else ''}{_dtype_name(prec.dit)})", dit.weights_bytes),
            Line(f"KV cache{share} × {n}", n * dit.kv_cache_bytes // ranks),
            Line(f"context K/V, RoPE tables, ray directions × {n}", n * (dit.session_bytes - dit.kv_cache_bytes)),
            Line(f"activations (one chunk){share}", dit.peak_bytes // ranks),
        ]
        if dev == HOST:  # reads the encode stage's slots from shared memory
            lines.append(Line(encode_slots.what, encode_slots.nbytes, True))
        if r == 0:
            lines.append(Line(f"output slots: {slots} latents", slots * latents_bytes, dev == HOST))
        workers.append(WorkerPlan(f"dit{r}", dev, ranks, tuple(lines)))
        snapshot += dit.kv_cache_bytes // ranks + dit.session_bytes - dit.kv_cache_bytes

    # Decode: the VAE; per session the decoder caches (rows split across ranks); rank 0 fills the
    # frame ring in host shared memory, one profile for a session's first chunk and one for the rest.
    ranks = len(stage_devices[Stage.DECODE])
    ring = frame_ring_slots * sum(
        _nbytes((video_frames(c, first), preset.height_px, preset.width_px, 3), torch.uint8) for first in (True, False)
    )
    for r, dev in enumerate(stage_devices[Stage.DECODE]):
        prec = Precision.for_device(torch.device(dev), savings)
        _, dec = vae_footprints(preset, prec.vae, savings.vae_bands, dev == HOST)
        share = "" if ranks == 1 else f" (1/{ranks})"
        lines = [
            *_runtime(Stage.DECODE, dev),
            Line(f"VAE weights ({_dtype_name(prec.vae)})", dec.weights_bytes),
            Line(f"VAE decoder caches{share} × {n}", n * dec.session_bytes // ranks),
            Line(f"activations (one latent frame{bands}){share}", dec.peak_bytes // ranks),
        ]
        if dev == HOST:
            lines.append(Line(f"output slots: {slots} latents", slots * latents_bytes, True))
            if r == 0:
                lines.append(Line(f"frame ring: {frame_ring_slots} chunks × 2 sizes", ring, True))
        workers.append(WorkerPlan(f"decode{r}", dev, ranks, tuple(lines)))
        snapshot += dec.session_bytes // ranks

    devices = []
    for device in dict.fromkeys(w.device for w in workers):
        mine = tuple(w for w in workers if w.device == device)
        devices.append(DevicePlan(device, mine, _extra(device, mine, placement), capacity(device)))
    steady = snapshot - 2 * enc.session_bytes  # the encoder's caches and their copy go at the fixed point
    return MemoryPlan(preset.name, placement.name, n, kernels, tuple(devices), savings, snapshot, steady)


def _runtime(stage: Stage, device: str) -> tuple[Line, ...]:
    if device != HOST:
        return ()  # on CUDA the process's host memory is not planned; its context is, per device
    return (Line("worker process runtime (Python, torch)", CPU_WORKER_RUNTIME_BYTES[stage]),)


def _extra(device: str, mine: tuple[WorkerPlan, ...], placement: Placement) -> tuple[Line, ...]:
    if device == HOST:
        # The server maps the frame ring too (counted once, with the decode worker's line).
        return (Line("server process (signaling, video encoders)", SERVER_RUNTIME_BYTES),)
    dit_devices = [str(d) for d in placement.stage_devices("dit")]
    encode_device = str(placement.stage_devices("encode")[0])
    # Processes that map this device's IPC slots without computing on it: every DiT rank reads the
    # encode stage's conditions, every decode rank the DiT rank 0's latents.
    peers = {f"dit{r}" for r, d in enumerate(dit_devices) if device == encode_device != d}
    peers |= {
        f"decode{r}" for r, d in enumerate(placement.stage_devices("decode")) if device == dit_devices[0] != str(d)
    }
    tensors = sum(line.nbytes for w in mine for line in w.lines)
    lines = [Line(f"CUDA contexts: {len(mine)} worker(s) computing here", len(mine) * CUDA_CONTEXT_BYTES)]
    if peers:
        mapping = len(peers) * CUDA_PEER_CONTEXT_BYTES
        lines.append(Line(f"CUDA contexts: {len(peers)} worker(s) mapping its slots", mapping))
    nccl = sum(1 for w in mine if w.stage_ranks > 1)
    if nccl:
        lines.append(Line(f"NCCL buffers: {nccl} rank(s) of multi-rank stages", nccl * NCCL_BUFFER_BYTES))
    lines.append(Line(f"allocator margin ({ALLOCATOR_MARGIN:.0%} of tensors)", int(ALLOCATOR_MARGIN * tensors)))
    return tuple(lines)


# ---- capacity ----


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (what the host can give without swapping), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def machine_capacity(device_gib: float | None = None, host_gib: float | None = None) -> Callable[[str], int | None]:
    """Capacity per device: the given GiB, else what this machine reports (None where it cannot)."""

    def capacity(device: str) -> int | None:
        if device == HOST:
            return int(host_gib * GIB) if host_gib is not None else host_available_bytes()
        if device_gib is not None:
            return int(device_gib * GIB)
        index = torch.device(device).index or 0
        if torch.cuda.is_available() and index < torch.cuda.device_count():
            return int(torch.cuda.get_device_properties(index).total_memory)
        return None

    return capacity


def placements_that_fit(
    preset: ModelPreset,
    max_sessions: int,
    capacity: Callable[[str], int | None],
    kernels: KernelConfig = DEFAULT_KERNELS,
    cuda_device_count: int | None = None,
) -> list[tuple[str, int]]:
    """(placement, most sessions it holds, up to max_sessions) for each named placement that holds one."""
    found = []
    for name, placement in PLACEMENTS.items():
        try:
            placement.validate_for(preset, cuda_device_count)
        except PlacementError:
            continue
        most = 0
        for sessions in range(1, max_sessions + 1):
            if not plan_memory(preset, placement, sessions, capacity, kernels).fits:
                break
            most = sessions
        if most:
            found.append((name, most))
    return found


def check_fits(
    preset: ModelPreset,
    placement: Placement,
    max_sessions: int,
    capacity: Callable[[str], int | None],
    kernels: KernelConfig = DEFAULT_KERNELS,
    cuda_device_count: int | None = None,
    savings: Savings = NO_SAVINGS,
) -> MemoryPlan:
    """The plan, or PlacementError naming each short device, by how much, and what would fit."""
    plan = plan_memory(preset, placement, max_sessions, capacity, kernels, savings=savings)
    if plan.fits:
        return plan
    short = "; ".join(
        f"{_label(d.device)} needs {_gib(d.total_bytes)} of {_gib(d.capacity_bytes or 0)} "
        f"({_gib(d.shortfall_bytes)} short)"
        for d in plan.devices
        if d.shortfall_bytes
    )
    fewer = next(
        (
            k
            for k in range(max_sessions - 1, 0, -1)
            if plan_memory(preset, placement, k, capacity, kernels, savings=savings).fits
        ),
        None,
    )
    options = [f"--max-sessions {fewer}"] if fewer else []
    options += [
        f"--placement {name}" + ("" if most >= max_sessions else f" --max-sessions {most}")
        for name, most in placements_that_fit(preset, max_sessions, capacity, kernels, cuda_device_count)
        if name != placement.name
    ]
    hint = f"; would fit: {', '.join(options)}" if options else "; no named placement on this machine fits it"
    command = f"worldrtc plan {preset.name} --placement {placement.name} --max-sessions {max_sessions}"
    with_savings = "" if savings == NO_SAVINGS else f" even with savings {savings.describe()}"
    raise PlacementError(
        f"placement {placement.name!r} cannot hold {preset.name} with {max_sessions} session(s){with_savings}: "
        f"{short}{hint} "
        f"(see `{command}`)"
    )
