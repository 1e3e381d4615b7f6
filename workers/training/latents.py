"""The DiT's data set: walks of the procedural world, encoded once with the trained VAE.

Each start pose gets several control paths, so one start image is seen walking different ways
(which is what teaches control), and the start's image-condition stream (start image + black
frames through the VAE's causal caches, exactly as `ImageConditionStream` makes it at inference)
is encoded once and shared by its paths. Clips are rendered with walls stopping the walker; the
controls are stored so the camera input is computed at training time by the server's own
integration (`CameraTrack`), which knows nothing about walls, exactly as at inference.

A second, wider set teaches control where it is learned most slowly, at the start of a session
(`first_chunk_set`): many more starts, one chunk each, and from each start several different single
moves (forward, back, strafe, turn, look, stand), so that what tells a start's clips apart is only
the control. Walking paths rarely begin with a plain back-step (about 2 % of first chunks) or a
plain turn (about 6 % each way); here every move is equally common.

Encoding is split over worker processes by start (one thread each on the CPU; one process on a GPU).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from safetensors.torch import load_file

from workers.controls import ChunkControl
from workers.images import to_model_range
from workers.models.camera import CameraState
from workers.models.presets import ModelPreset
from workers.models.vae import WanVAE
from workers.runtime.parent_death import die_with_parent
from workers.stages.condition import ImageConditionStream
from workers.training.clips import (
    WORLD_SEED,
    ClipSpec,
    frames_to_model,
    render_clip,
    sample_controls,
    sample_start,
    split_rng,
)
from workers.world import EVENT_PROMPTS, World, WorldEvent

# What clips without a prompt of their own are trained with: prompts that name no event, as people
# type them (the empty one twice as often); they all mean the day.
PROMPTS = ("", "", "a walk through the town", "streets and towers", "walking", "a sunny day", "explore", "hello")

# The single moves of `first_chunk_set`: every key alone, forward and back with a turn, standing still.
MOVES: tuple[tuple[str, ...], ...] = (
    ("w",),
    ("s",),
    ("a",),
    ("d",),
    ("j",),
    ("l",),
    ("i",),
    ("k",),
    ("w", "j"),
    ("w", "l"),
    ("s", "j"),
    ("s", "l"),
    (),
)


@dataclass(frozen=True)
class LatentSetConfig:
    starts: int = 200
    paths_per_start: int = 4
    chunks: int = 4  # per clip; with the preset's window (12 frames, 2 sink) chunk 3 sees a rolled cache
    # "walks": plausible walking paths (`random_controls`); "moves": each clip holds one of `MOVES`
    # throughout, the moves of one start all different.
    controls: Literal["walks", "moves"] = "walks"
    # Whether each walk's prompt (and with it the world's event) may switch at a chunk boundary
    # (`event_schedule`); without, clips keep no prompt and training draws one that names no event.
    events: bool = False
    # Which draw of starts: sets of different streams draw their starts independently; the same
    # stream and seed give the same starts, in order.
    stream: int = 1
    seed: int = 0
    workers: int = 2


EVENT_STARTS = 300  # starts of the event walks (2 paths each): 600 walks, about 13 min on 2 cores
DAY_SHARE = 0.2  # event walks that stay in the day throughout, under one prompt that names no event
SECOND_SWITCH = 0.35  # of the others: a second switch later in the walk, back to the day or to another event
MOVE_STARTS = 1500  # starts of the shipped weights' first-chunk set: 6000 clips, about 15 min on 2 cores


def first_chunk_set(starts: int, seed: int, workers: int, chunks: int = 1) -> LatentSetConfig:
    """Many starts, four different single moves from each, held for `chunks` chunks (the span of the
    DiT's first-chunk steps: one chunk, or several short ones)."""
    return LatentSetConfig(
        starts=starts, paths_per_start=4, chunks=chunks, controls="moves", stream=2, seed=seed, workers=workers
    )


def event_set(starts: int, seed: int, workers: int, chunks: int) -> LatentSetConfig:
    """Walks whose prompt switches mid-walk: what teaches the world its events."""
    return LatentSetConfig(
        starts=starts, paths_per_start=2, chunks=chunks, stream=3, seed=seed, workers=workers, events=True
    )


def event_schedule(rng: np.random.Generator, chunks: int) -> tuple[tuple[WorldEvent, ...], tuple[str, ...]]:
    """Each chunk's event and the prompt that named it. Walks start in the day (their start image is
    a day view); an event starts at a random chunk, the first included, and the prompt stays as
    typed until the next switch. Day prompts are drawn from everything that names no event."""
    day = tuple(dict.fromkeys((*EVENT_PROMPTS[WorldEvent.DAY], *PROMPTS)))
    others = [e for e in WorldEvent if e is not WorldEvent.DAY]
    events = [WorldEvent.DAY] * chunks
    if rng.random() >= DAY_SHARE:
        at = int(rng.integers(0, chunks))
        events[at:] = [others[int(rng.integers(len(others)))]] * (chunks - at)
        if at + 1 < chunks and rng.random() < SECOND_SWITCH:
            again = int(rng.integers(at + 1, chunks))
            choices = [e for e in WorldEvent if e is not events[at]]
            events[again:] = [choices[int(rng.integers(len(choices)))]] * (chunks - again)
    prompts: list[str] = []
    for k, event in enumerate(events):
        if k and event is events[k - 1]:
            prompts.append(prompts[-1])
        else:
            pool = day if event is WorldEvent.DAY else EVENT_PROMPTS[event]
            prompts.append(pool[int(rng.integers(len(pool)))])
    return tuple(events), tuple(prompts)


def control_to_dict(c: ChunkControl) -> dict:
    return {"keys": sorted(c.keys), "look_dx_px": c.look_dx_px, "look_dy_px": c.look_dy_px}


def control_from_dict(d: dict) -> ChunkControl:
    return ChunkControl(keys=frozenset(d["keys"]), look_dx_px=d["look_dx_px"], look_dy_px=d["look_dy_px"])


def _sample_paths(
    rng: np.random.Generator, world: World, spec: ClipSpec, start: CameraState, cfg: LatentSetConfig
) -> list[tuple[ChunkControl, ...]]:
    if cfg.controls == "walks":
        return [sample_controls(rng, world, spec, start, cfg.chunks) for _ in range(cfg.paths_per_start)]
    picks = rng.choice(len(MOVES), cfg.paths_per_start, replace=False)
    return [(ChunkControl.from_keys(MOVES[int(m)]),) * cfg.chunks for m in picks]


def _encode_starts(preset: ModelPreset, vae_path: str, cfg: LatentSetConfig, indices: list[int], device: str) -> dict:
    torch.set_num_threads(1)
    vae = WanVAE(preset.vae)
    vae.load_state_dict(load_file(vae_path), strict=True)
    vae.eval().to(device)
    world = World.generate(WORLD_SEED)
    spec = ClipSpec.for_preset(preset)
    latents: list[torch.Tensor] = []
    conds: list[torch.Tensor] = []
    controls: list[list[dict[str, object]]] = []
    prompts: list[tuple[str, ...]] = []
    start_of: list[int] = []
    with torch.inference_mode():
        for n, i in enumerate(indices):
            rng = split_rng(cfg.seed, "train", cfg.stream * 10**6 + i)
            start = sample_start(rng, world, "train")
            for path in _sample_paths(rng, world, spec, start, cfg):
                events = None
                if cfg.events:
                    events, chunk_prompts = event_schedule(rng, cfg.chunks)
                    prompts.append(chunk_prompts)
                clip = render_clip(world, spec, start, path, events)
                if not conds or start_of[-1] != n:
                    stream = ImageConditionStream(vae, to_model_range(clip.frames[0]), preset, spec.chunk_latent_frames)
                    conds.append(torch.cat([stream.next_chunk() for _ in range(cfg.chunks)], dim=2)[0].cpu())
                latents.append(vae.encode(frames_to_model(clip.frames).to(device))[0].cpu())
                controls.append([control_to_dict(c) for c in clip.controls])
                start_of.append(n)
            if (n + 1) % 10 == 0 or n + 1 == len(indices):
                print(f"[latents] {n + 1}/{len(indices)} starts of this worker encoded", flush=True)
    return {"latents": latents, "conds": conds, "controls": controls, "prompts": prompts, "start_of": start_of}


def build_latent_set(
    preset: ModelPreset, vae_path: Path, out_path: Path, cfg: LatentSetConfig, device: str = "cpu"
) -> dict:
    """Render and encode the set; writes `out_path` (a torch file) and returns it."""
    t0 = time.time()
    workers = cfg.workers if device == "cpu" else 1  # one process drives a GPU
    shards = [list(range(w, cfg.starts, workers)) for w in range(workers)]
    # Encoders die with this process: a killed training run must not leave them rendering.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        n = len(shards)
        parts = list(pool.map(_encode_starts, [preset] * n, [str(vae_path)] * n, [cfg] * n, shards, [device] * n))
    latents: list[torch.Tensor] = []
    conds: list[torch.Tensor] = []
    controls: list[list[dict[str, object]]] = []
    prompts: list[tuple[str, ...]] = []
    start_of: list[int] = []
    for part in parts:
        base = len(conds)
        latents += part["latents"]
        conds += part["conds"]
        controls += part["controls"]
        prompts += part["prompts"]
        start_of += [base + s for s in part["start_of"]]
    data = {
        "latents": torch.stack(latents).half(),  # [N, 16, F, h, w]
        "conds": torch.stack(conds).half(),  # [S, 20, F, h, w]
        "controls": controls,
        "prompts": prompts,  # per clip, each chunk's prompt (event sets only)
        "start_of": torch.tensor(start_of),
        "config": asdict(cfg),
        "wall_s": time.time() - t0,
    }
    torch.save(data, out_path)
    print(
        f"[latents] {len(latents)} clips from {len(conds)} starts in {data['wall_s']:.0f} s -> {out_path}", flush=True
    )
    return data
