"""Would batching sessions into one DiT forward pay? The DiT's chunk time at batch 1, 2 and 4.

    python -m benchmarks.dit_batching [--model lingbot-world-v2-1.3b,matrix-game-2-universal]
                                      [--device cuda] [--batches 1,2,4] [--chunks 6] [--json OUT]
                                      [--check-bits]

Today every session runs its own DiT forwards. Batching B sessions that are due at the same time
into one forward pays only where batch 1 leaves the device idle: public evidence is mixed, since on
a large GPU one session's few thousand tokens already fill it. This measures it directly, at full
size with seeded random weights (the time is the model's; the numbers are noise):

- per preset, the DiT is built at its real widths and the real token counts of its resolution;
- per batch size B, B sessions' steady chunks are run as one: the sampling forwards at the preset's
  steps and the t = 0 forward that commits, against a KV cache of batch B already filled to its
  window (the steady state, where every chunk evicts as much as it commits);
- the batch sizes take their chunks in turn, so a busy machine slows them alike, and the figure is
  a ratio within one run: time per session-chunk at batch B against batch 1 (above 1: batching pays).

Reported per batch size: the chunk's median seconds, per session-chunk seconds, the ratio to batch 1,
how many sessions that rate keeps in real time (the chunk's media duration over the per-session
time), and the peak device memory.

`--check-bits` also answers what batching would cost the recordings: B sessions with their own
inputs run their chunks (the window's fill, then one more) batched and each alone, and every
session's last forward is compared with its own, bit for bit. A recording regenerates exactly only
if a session's frames do not depend on who it was batched with.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workers.chunk_geometry import chunk_num_frames
from workers.controls import ChunkControl
from workers.families.registry import family_for
from workers.models.camera import PluckerEncoder
from workers.models.dit import WanDiT
from workers.models.kv_cache import KVCacheSpec, SessionKVCache
from workers.models.matrix_game.actions import ChunkActions
from workers.models.matrix_game.cache import MatrixGameCache
from workers.models.matrix_game.dit import MatrixGameDiT
from workers.models.presets import ModelPreset, get_preset
from workers.models.rope import RopeTables

GPU_MODELS = "lingbot-world-v2-1.3b,matrix-game-2-universal"
# The timestep each sampling forward is given: the cost of a forward does not depend on it.
SAMPLING_T = 500.0

ChunkFn = Callable[[], torch.Tensor]  # a chunk's forwards; returns its last sampling forward's output
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]  # x, cond, t, commit
Inputs = tuple[torch.Tensor, torch.Tensor]  # every session's (x, cond) rows, [B, 16 | 20, C, h, w]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _steady_control(preset: ModelPreset, frames: int) -> Any:
    """A steady chunk's control input (the second chunk's: the first one's is shorter in video frames)."""
    track = family_for(preset).control_track(preset)
    control = ChunkControl.from_keys(["w", "d"])
    track.next_inputs(control, frames)
    return track.next_inputs(control, frames)


def session_inputs(preset: ModelPreset, batch: int, device: torch.device, seed: int = 0) -> Inputs:
    """B sessions' own chunk inputs: the latents a forward denoises and the condition."""
    frames, h, w = preset.chunk_latent_frames, preset.latent_height, preset.latent_width
    gen = torch.Generator(device="cpu").manual_seed(seed)
    cond = torch.randn(batch, 20, frames, h, w, generator=gen).to(device)
    return torch.randn(batch, 16, frames, h, w, generator=gen).to(device), cond


def _chunk(preset: ModelPreset, device: torch.device, inputs: Inputs, forward: Forward) -> ChunkFn:
    """One chunk of B sessions as the denoise loop runs it: a forward per sampling step, then the
    t = 0 forward that commits to the caches. `forward(x, cond, t, commit)` is the family's."""
    x, cond = inputs
    batch = x.shape[0]
    t_sample = torch.full((batch,), SAMPLING_T, device=device)
    t_commit = torch.zeros(batch, device=device)

    @torch.no_grad()
    def chunk() -> torch.Tensor:
        out = x
        for _ in preset.timestep_indices:
            out = forward(x, cond, t_sample, False)
        forward(x, cond, t_commit, True)
        return out

    return chunk


def lingbot_chunk(
    dit: WanDiT, preset: ModelPreset, batch: int, device: torch.device, inputs: Inputs | None = None
) -> ChunkFn:
    """B LingBot-World sessions' chunk as one: camera rays, the prompt's K/V, the rolling cache."""
    cfg, frames = preset.dit, preset.chunk_latent_frames
    gen = torch.Generator(device="cpu").manual_seed(0)
    context = torch.randn(cfg.text_len, cfg.text_dim, generator=gen).to(device)
    with torch.no_grad():
        text_kv = dit.text_kv([context] * batch)
        poses = _steady_control(preset, frames).to(device)
        cells = PluckerEncoder(preset, device).cells(poses)[None].expand(batch, -1, -1, -1, -1)
        camera = dit.chunk_camera(cells.contiguous())
    spec = KVCacheSpec.for_dit(cfg, preset.tokens_per_latent_frame, frames, batch=batch)
    cache = SessionKVCache(spec, dit.patch_embedding.weight.dtype, device)
    _, ph, pw = cfg.patch_size
    rope = RopeTables(cfg.head_dim, preset.latent_height // ph, preset.latent_width // pw, device)

    def forward(x: torch.Tensor, cond: torch.Tensor, t: torch.Tensor, commit: bool) -> torch.Tensor:
        return dit(x, cond, t, text_kv, camera, cache.committed_frames, cache, commit, rope=rope)

    return _chunk(preset, device, inputs or session_inputs(preset, batch, device), forward)


def matrix_game_chunk(
    dit: MatrixGameDiT, preset: ModelPreset, batch: int, device: torch.device, inputs: Inputs | None = None
) -> ChunkFn:
    """B Matrix-Game sessions' chunk as one: the CLIP image K/V, per-frame actions, the three caches."""
    frames = preset.chunk_latent_frames
    cfg = dataclasses.replace(dit.cfg, chunk_frames=frames)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens, width = family_for(preset).context_shape(preset)
    with torch.no_grad():
        clip = torch.randn(1, tokens, width, generator=gen).to(device)  # one start image for all
        image_kv = dit.image_kv(clip.expand(batch, -1, -1).contiguous())
    one: ChunkActions = _steady_control(preset, frames)
    actions = ChunkActions(
        keyboard=one.keyboard.expand(batch, *one.keyboard.shape[1:]).contiguous(),
        mouse=None if one.mouse is None else one.mouse.expand(batch, *one.mouse.shape[1:]).contiguous(),
    ).to(device)
    cache = MatrixGameCache(cfg, batch, preset.tokens_per_latent_frame, dit.patch_embedding.weight.dtype, device)
    _, ph, pw = cfg.patch_size
    rope = RopeTables(cfg.head_dim, preset.latent_height // ph, preset.latent_width // pw, device)

    def forward(x: torch.Tensor, cond: torch.Tensor, t: torch.Tensor, commit: bool) -> torch.Tensor:
        return dit(x, cond, t, image_kv, actions, cache.committed_frames, cache, commit, rope=rope)

    return _chunk(preset, device, inputs or session_inputs(preset, batch, device), forward)


def fill_chunks(preset: ModelPreset) -> int:
    """Chunks that fill the cache's window, so every timed chunk evicts (the steady state)."""
    window = preset.dit.local_attn_size_frames
    frames = preset.chunk_latent_frames
    return 1 if window == -1 else -(-window // frames) + 1


def measure(preset: ModelPreset, device: torch.device, batches: list[int], chunks: int) -> dict[str, Any]:
    family = family_for(preset)
    t0 = time.perf_counter()
    dit = family.load_dit(preset, device, None, weights_seed=0)
    load_s = time.perf_counter() - t0
    build = lingbot_chunk if isinstance(dit, WanDiT) else matrix_game_chunk
    runs: dict[int, ChunkFn] = {}
    peak: dict[int, int | None] = {}
    for b in batches:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        runs[b] = build(dit, preset, b, device)  # type: ignore[arg-type]
        for _ in range(fill_chunks(preset)):
            runs[b]()
        _sync(device)
        peak[b] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    times: dict[int, list[float]] = {b: [] for b in batches}
    for _ in range(chunks):
        for b in batches:  # in turn: noise on the machine hits every batch size alike
            _sync(device)
            t = time.perf_counter()
            runs[b]()
            _sync(device)
            times[b].append(time.perf_counter() - t)
    chunk_media_s = chunk_num_frames(1, preset.chunk_latent_frames) / preset.fps
    base = statistics.median(times[batches[0]]) / batches[0]
    rows = []
    for b in batches:
        chunk_s = statistics.median(times[b])
        per_session = chunk_s / b
        rows.append(
            {
                "batch": b,
                "chunk_s_p50": chunk_s,
                "chunk_s_max": max(times[b]),
                "per_session_chunk_s": per_session,
                "speedup_vs_batch1": base / per_session,
                "real_time_sessions": chunk_media_s / per_session,
                "peak_device_bytes": peak[b],
            }
        )
    return {
        "model": preset.name,
        "dit_parameters": sum(p.numel() for p in dit.parameters()),
        "dtype": str(next(dit.parameters()).dtype),
        "tokens_per_latent_frame": preset.tokens_per_latent_frame,
        "chunk_latent_frames": preset.chunk_latent_frames,
        "forwards_per_chunk": len(preset.timestep_indices) + 1,
        "window_frames": preset.dit.local_attn_size_frames,
        "chunk_media_s": chunk_media_s,
        "load_s": load_s,
        "chunks_timed": chunks,
        "rows": rows,
    }


def check_bits(preset: ModelPreset, device: torch.device, batch: int) -> dict[str, Any]:
    """Does a session batched with B - 1 others compute what it computes alone? B sessions with their
    own inputs run the window's fill and one more chunk batched, and each alone; every session's last
    sampling forward is compared with its own."""
    dit = family_for(preset).load_dit(preset, device, None, weights_seed=0)
    build = lingbot_chunk if isinstance(dit, WanDiT) else matrix_game_chunk
    x, cond = session_inputs(preset, batch, device, seed=1)
    together = build(dit, preset, batch, device, (x, cond))  # type: ignore[arg-type]
    alone = [build(dit, preset, 1, device, (x[i : i + 1], cond[i : i + 1])) for i in range(batch)]  # type: ignore[arg-type]
    for _ in range(fill_chunks(preset) + 1):
        batched = together()
        own = [run() for run in alone]
    diffs = [float((batched[i : i + 1] - own[i]).abs().max()) for i in range(batch)]
    equal = all(torch.equal(batched[i : i + 1], own[i]) for i in range(batch))
    return {"batch": batch, "bit_equal": equal, "max_abs_diff": max(diffs)}


def table(report: dict[str, Any]) -> list[str]:
    lines = [
        f"{report['model']} ({report['dtype']}, {report['tokens_per_latent_frame']} tokens × "
        f"{report['chunk_latent_frames']} frames, {report['forwards_per_chunk']} forwards a chunk of "
        f"{report['chunk_media_s']:.2f} s):"
    ]
    for r in report["rows"]:
        mem = "" if r["peak_device_bytes"] is None else f", peak {r['peak_device_bytes'] / 2**30:.1f} GiB"
        lines.append(
            f"  batch {r['batch']}: chunk {r['chunk_s_p50']:.3f} s, per session-chunk {r['per_session_chunk_s']:.3f} s "
            f"({r['speedup_vs_batch1']:.2f}× batch 1; {r['real_time_sessions']:.1f} sessions in real time){mem}"
        )
    for bits in report.get("bits", []):
        same = "yes" if bits["bit_equal"] else f"no (max |diff| {bits['max_abs_diff']:.2g})"
        lines.append(f"  batch {bits['batch']}: each session's output bit for bit its own forward's: {same}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dit_batching", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=GPU_MODELS, help=f"comma-separated presets (default {GPU_MODELS})")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batches", default="1,2,4", help="batch sizes, the first one the reference")
    p.add_argument("--chunks", type=int, default=6, help="timed chunks per batch size")
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    p.add_argument(
        "--check-bits", action="store_true", help="also compare each batched session with its own forward, bit for bit"
    )
    args = p.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
        presets = [get_preset(name) for name in args.model.split(",")]
    except ValueError as exc:
        p.error(str(exc))
    if any(b < 1 for b in batches) or args.chunks < 1:
        p.error("batch sizes and --chunks must be positive")
    device = torch.device(args.device)
    reports = []
    for preset in presets:
        print(f"{preset.name}: building the DiT with random weights on {device} …", file=sys.stderr, flush=True)
        reports.append(measure(preset, device, batches, args.chunks))
        if args.check_bits:
            reports[-1]["bits"] = [check_bits(preset, device, b) for b in batches if b > 1]
        print("\n".join(table(reports[-1])), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": str(device), "models": reports}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
