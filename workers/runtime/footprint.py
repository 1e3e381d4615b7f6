"""What each model component needs in memory, measured by tracing it on the `meta` device.

For a preset at its own geometry and the stage's dtype, per component:
- `weights_bytes`: parameters and buffers;
- `session_bytes`: what one open session keeps between chunks (the DiT's caches, context K/V and
  RoPE tables; the VAE's causal conv caches, of the encoder or the decoder);
- `peak_bytes`: what one chunk allocates on top while it runs (activations).

The chunk and session figures come from running the real stage code on `meta` under `LiveBytes`
(workers/models/live_bytes.py), not from formulas, so they follow the code as it changes. Two
shortcuts keep a trace of the 14B model within seconds: a DiT of one block (the family's largest
kind, `ModelFamily.one_layer`) is traced, and the full model's session state (caches and context
K/V) is computed exactly from their shapes (`ModelFamily.session_state_bytes`). And unless the attention
backend is `math`, attention is traced by a stand-in that allocates what a FlashAttention-class
kernel does (its output and a float32 log-sum-exp per query), since on `meta` PyTorch would pick
the math kernel and count an L × L score matrix that flash kernels never build.

A trace takes seconds (the first one in a process also imports torch's dispatch machinery), and a
server plans at every start: each result is kept on disk, under `$WORLDRTC_CACHE/footprints/`, keyed
by the call's arguments, torch's version and the source of every module under `workers/` (the code
traced), so that a restart of the same code on the same model reads it in a millisecond and any
change to the code traces afresh. A store that cannot be read or written is skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import torch

from workers.chunk_geometry import video_frames
from workers.controls import ChunkControl
from workers.determinism import intra_op_threads
from workers.families.registry import family_for
from workers.models.fp8 import quantize_blocks
from workers.models.live_bytes import LiveBytes
from workers.models.loading import build_on_meta
from workers.models.presets import ModelPreset
from workers.models.vae import WanVAE
from workers.models.weights_dir import cache_root

log = logging.getLogger(__name__)

META = torch.device("meta")
# Below this many weight bytes a float32 component is traced on the CPU with real (uninitialised)
# tensors: small shapes run faster there than through meta's Python shape functions, and the bytes
# counted are the same. Other dtypes (a GPU plan's bf16) go to meta whatever their size: CPU bf16
# matmuls are slow enough that one block of a 1.3B DiT took a minute to trace.
REAL_TRACE_MAX_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Footprint:
    weights_bytes: int
    session_bytes: int  # kept per open session between chunks, and copied by its snapshots
    peak_bytes: int  # allocated on top while one chunk (or one prompt) runs
    # Kept per open session too, not in its snapshots (the encode's repeat memo).
    memo_bytes: int = dataclasses.field(default=0, kw_only=True)


@dataclass(frozen=True)
class DiTFootprint(Footprint):
    kv_cache_bytes: int  # part of session_bytes: every layer's K and V window, all heads
    text_kv_bytes: int  # part of session_bytes: every layer's cross-attention K/V of the context


def _module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


M = TypeVar("M", bound=torch.nn.Module)
F = TypeVar("F", bound=Callable[..., Any])


def _for_tracing(module: M, dtype: torch.dtype) -> tuple[M, torch.device]:
    """`module` (built on meta) in `dtype`, on the device it is traced on (see REAL_TRACE_MAX_BYTES)."""
    module = module.to(dtype).eval()
    if dtype != torch.float32 or _module_bytes(module) > REAL_TRACE_MAX_BYTES:
        return module, META
    module = module.to_empty(device="cpu")
    with torch.no_grad():
        for t in (*module.parameters(), *module.buffers()):
            t.zero_()  # defined values: no NaN or denormal slows the trace
    return module, torch.device("cpu")


def _flash_stand_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Allocates what a flash kernel does: the output, and the log-sum-exp it keeps per query."""
    torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    return torch.empty_like(q)


# False: every call traces (the tests of the trace itself).
STORE = True
WORKERS_DIR = Path(__file__).resolve().parents[1]


@functools.cache
def _code_digest() -> str:
    """Of every module under workers/: a trace's result holds for the code that traced it."""
    digest = hashlib.sha256(torch.__version__.encode())
    for path in sorted(WORKERS_DIR.rglob("*.py")):
        digest.update(path.relative_to(WORKERS_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _canonical(value: Any) -> Any:
    """`value` as JSON that is the same in every process (a set's repr follows the hash seed)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__type__": type(value).__qualname__, **fields}
    if isinstance(value, set | frozenset):
        return sorted((_canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)  # dtypes, enums: their reprs do not vary


def _stored(fn: F) -> F:
    """Keep `fn`'s results on disk (see the module docstring); results are footprints or tuples of them."""
    kinds = {cls.__name__: cls for cls in (Footprint, DiTFootprint)}

    def encode(result: Any) -> Any:
        if isinstance(result, tuple):
            return [encode(r) for r in result]
        return {"kind": type(result).__name__, **dataclasses.asdict(result)}

    def decode(data: Any) -> Any:
        if isinstance(data, list):
            return tuple(decode(d) for d in data)
        fields = dict(data)
        return kinds[fields.pop("kind")](**fields)

    @functools.wraps(fn)
    def stored(*args: Any, **kwargs: Any) -> Any:
        if not STORE:
            return fn(*args, **kwargs)
        call = _canonical([fn.__name__, args, kwargs, REAL_TRACE_MAX_BYTES, _code_digest()])
        key = json.dumps(call, sort_keys=True)
        path = cache_root() / "footprints" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
        try:
            return decode(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not stored yet (or unreadable): trace
        result = fn(*args, **kwargs)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.partial")
            partial.write_text(json.dumps(encode(result)))
            partial.replace(path)  # whole or absent, for a server starting beside this one
        except OSError as exc:
            log.debug("footprints: cannot store %s (%s)", path, exc)
        return result

    return cast(F, stored)


def _one_thread(fn: F) -> F:
    """Trace at one intra-op thread: the shapes are small or absent, and a server's other threads
    (or a busy machine) would otherwise make the thread pool spin far longer than the work takes."""

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with intra_op_threads(1):
            return fn(*args, **kwargs)

    return cast(F, traced)


@functools.cache
@_stored
@_one_thread
def dit_footprint(
    preset: ModelPreset, dtype: torch.dtype, math_attention: bool = False, fp8: bool = False
) -> DiTFootprint:
    """`fp8`: block weights stored in float8 (workers/models/fp8.py): each linear widens its weight
    to `dtype` for its matmul, a transient the chunk's trace sees."""
    family = family_for(preset)
    one_layer = family.one_layer(preset)
    dit, dev = _for_tracing(build_on_meta(family.build_dit(one_layer)), dtype)
    if fp8:
        quantize_blocks(dit)
    if not math_attention:
        for module in dit.modules():
            if "attention" in vars(module):  # self, cross and action attention (kernels.apply_attention)
                vars(module)["attention"] = _flash_stand_in
    chunk = preset.chunk_latent_frames
    traced, full = family.session_state_bytes(one_layer, dtype), family.session_state_bytes(preset, dtype)
    window = preset.dit.local_attn_size_frames if preset.dit.local_attn_size_frames != -1 else 2 * chunk

    opened = LiveBytes()
    with opened:
        context = torch.zeros(family.context_shape(preset), device=dev)
        session = family.open_denoise(dit, one_layer, context, 0, chunk)
        del context
    cond = torch.zeros(1, 20, chunk, preset.latent_height, preset.latent_width, device=dev)
    track = family.control_track(one_layer)
    peak, kept, transition = 0, 0, 0
    # Until the window rolls: the roll's shift of the cache is the largest transient of a session.
    for i in range(window // chunk + 2):
        inputs = track.next_inputs(ChunkControl(), chunk).to(dev)
        run = LiveBytes()
        with run:
            if i == 1 and family.live_prompts:
                # A prompt change in the middle of a transition: the old prompt's embeddings and the
                # blend are kept beside the new one's, and every block's text K/V computed anew.
                session.change_prompt(torch.zeros(family.context_shape(preset), device=dev), "", 3)
            session.run_chunk(cond, inputs)
        peak = max(peak, run.peak_bytes)
        if i == 1 and family.live_prompts:
            transition = run.live_bytes  # kept while the transition lasts, on top of everything else
        else:
            kept = max(kept, run.live_bytes)  # tables the session keeps for its next chunk
    fixed = opened.live_bytes - traced.kv_cache_bytes - traced.context_kv_bytes  # RoPE tables, ray directions, …
    # The full model's weights from its build on meta: shapes only, no memory.
    full_dit = build_on_meta(family.build_dit(preset)).to(dtype)
    weights = _module_bytes(quantize_blocks(full_dit) if fp8 else full_dit)
    return DiTFootprint(
        weights_bytes=weights,
        session_bytes=full.kv_cache_bytes + full.context_kv_bytes + fixed + kept + transition,
        peak_bytes=peak,
        kv_cache_bytes=full.kv_cache_bytes,
        text_kv_bytes=full.context_kv_bytes,
    )


@functools.cache
@_stored
@_one_thread
def vae_footprints(
    preset: ModelPreset, dtype: torch.dtype, bands: int = 1, host: bool = False
) -> tuple[Footprint, Footprint]:
    """(encode, decode): one VAE's weights, with each direction's stream state and chunk peak, its
    full-resolution layers run in `bands` height bands; `host`: as the CPU runs it (a half-precision
    VAE's convolutions in float32, workers/models/vae.py)."""
    vae, dev = _for_tracing(cast(WanVAE, build_on_meta(lambda: WanVAE(preset.vae))), dtype)
    vae.set_bands(bands, preset.height_px)
    vae.convolve_in_float32(host)
    weights = _module_bytes(vae)
    chunk, (h, w) = preset.chunk_latent_frames, (preset.height_px, preset.width_px)
    state = vae.new_stream_state(skip_repeats=host)  # as ImageConditionStream runs it on the host
    # One trace over the whole stream, so that a call's replacing of the previous call's caches is
    # seen as the free it is; each call's peak is taken above what it leaves behind (the caches,
    # counted as session state).
    run = LiveBytes()

    def transient(call: Callable[..., object], *args: object) -> int:
        run.peak_bytes = run.live_bytes
        call(*args)
        return run.peak_bytes - run.live_bytes

    def encode(first: bool) -> None:
        vae.encode_stream(torch.zeros(1, 3, video_frames(chunk, first), h, w, device=dev), state)

    with torch.no_grad(), run:
        enc_peak = max(transient(encode, first) for first in (True, False))
        enc_state = _cache_bytes(state.cache_tensors("encoder"))
        enc_memo = _cache_bytes(state.memo_tensors())
        latent = torch.zeros(1, preset.vae.z_dim, 1, preset.latent_height, preset.latent_width, device=dev)
        # The first latent frame, then the steady ones (cache full).
        dec_peak = max(transient(lambda: vae.decode_stream(latent, state)) for _ in range(3))
        dec_state = _cache_bytes(state.cache_tensors("decoder"))
    return Footprint(weights, enc_state, enc_peak, memo_bytes=enc_memo), Footprint(weights, dec_state, dec_peak)


@functools.cache
@_stored
@_one_thread
def context_encoder_footprint(preset: ModelPreset, dtype: torch.dtype) -> Footprint:
    """The family's context encoder (umT5 or CLIP): weights, and one session's encoding as the peak."""
    family = family_for(preset)
    module, dev = _for_tracing(build_on_meta(family.context_encoder_module(preset)), dtype)
    run = LiveBytes()
    with torch.no_grad(), run:
        family.trace_context_encoder(module, preset, dev)
    return Footprint(_module_bytes(module), 0, run.peak_bytes)


def _cache_bytes(cache: Sequence[torch.Tensor]) -> int:
    return sum(c.numel() * c.element_size() for c in cache)
