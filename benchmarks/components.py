"""Per-component costs that tests should not time: frame conversion, encoder bitrate, world render.

    python -m benchmarks.components [--json runs/components.json]

- `convert`: RGB24 → yuv420p `av.VideoFrame` (what the video track does per frame, off the event
  loop) at the 14B preset's 832×480 and the embedded model's 128×128: median and p90 ms.
- `bitrate`: H.264 and VP8 through aiortc's encoders at two configured targets on hard content
  (scrolling noise); the achieved kbps against each target shows the setting takes effect.
- `render`: one 128×128 frame of the procedural town (training data and evaluation ground truth).
- `first_part`: the decode of a steady latent frame on one thread by each embedded world's VAE
  (gridworld's, and gridworld-responsive's per-frame full-resolution stage), whole and with its
  first `FIRST_PART_FRAMES` frames apart (workers/stages/decode.py), all in turn: when the first
  frames are out, and the whole latent frame's time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch
from aiortc.codecs import get_encoder
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from benchmarks.stats import summarize
from server.media import codecs
from server.media.video_track import rgb_to_video_frame
from workers.determinism import intra_op_threads
from workers.models.camera import CameraState, Intrinsics
from workers.models.components import load_vae
from workers.models.presets import get_preset
from workers.stages.decode import FIRST_PART_FRAMES
from workers.training.clips import WORLD_SEED
from workers.world import World

FPS = 16
# The embedded worlds' VAEs: gridworld's 3-frame decoder, and the responsive preset's, whose
# full-resolution stage runs frame by frame.
DECODE_PRESETS = ("gridworld", "gridworld-responsive")
BITRATE_TARGETS_BPS = (300_000, 2_000_000)


def time_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> dict[str, float | None]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return summarize(times)


def convert_costs(repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    out = {}
    for w, h in ((832, 480), (128, 128)):
        rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        out[f"{w}x{h}"] = time_ms(partial(rgb_to_video_frame, rgb), repeats)
    return out


def moving_noise(n: int = 64, h: int = 240, w: int = 320) -> list[av.VideoFrame]:
    """Scrolling noise plus fresh noise: hard enough that both encoders spend the whole budget."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 224, (h, 2 * w, 3), dtype=np.uint8)
    frames = []
    for i in range(n):
        rgb = base[:, 3 * i : 3 * i + w] + rng.integers(0, 33, (h, w, 3), dtype=np.uint8)
        frame = rgb_to_video_frame(rgb)
        frame.pts, frame.time_base = i * (90_000 // FPS), Fraction(1, 90_000)
        frames.append(frame)
    return frames


def bitrates() -> dict[str, dict[str, float]]:
    frames = moving_noise()
    media_s = len(frames) / FPS
    before = codecs.video_encoder_settings()
    out: dict[str, dict[str, float]] = {}
    try:
        for mime in ("video/H264", "video/VP8"):
            for target in BITRATE_TARGETS_BPS:
                codecs.set_video_bitrate(target, fps=FPS)
                encoder = get_encoder(RTCRtpCodecParameters(mimeType=mime, clockRate=90000, payloadType=96))
                total = 0
                for i, frame in enumerate(frames):
                    payloads, _ = encoder.encode(frame, force_keyframe=i == 0)
                    total += sum(len(p) for p in payloads)
                out.setdefault(mime, {})[str(target)] = total * 8 / media_s
    finally:
        codecs.restore_video_encoder_settings(before)
    return out


def render_cost(repeats: int) -> dict[str, float | None]:
    world = World.generate(WORLD_SEED)
    pose = CameraState(yaw_deg=33.0, pitch_deg=4.0).c2w().numpy()
    intr = Intrinsics.default(128, 128)
    return time_ms(lambda: world.render(pose, intr, 128, 128), repeats)


def first_part_costs(repeats: int, presets: tuple[str, ...] = DECODE_PRESETS) -> dict[str, dict[str, Any]]:
    """Per preset, its VAE's decode of a steady latent frame on one thread: whole, and with its first
    frames apart (when they are out, when all are). Every preset's decodes run in turn, so a busy
    spell hits them alike and their ratio holds within the run."""
    chosen = [get_preset(name) for name in presets]
    vaes = {p.name: load_vae(p, torch.device("cpu"), None) for p in chosen}
    shape = {(p.latent_height, p.latent_width) for p in chosen}
    if len(shape) != 1:
        raise ValueError(f"{presets} decode latents of different shapes: {sorted(shape)}")
    (h, w), gen = shape.pop(), torch.Generator().manual_seed(0)
    latents = [torch.randn(1, 16, 1, h, w, generator=gen) for _ in range(8)]
    times: dict[str, dict[str, list[float]]] = {
        name: {"whole_ms": [], "apart_first_ms": [], "apart_whole_ms": []} for name in presets
    }
    with intra_op_threads(1), torch.inference_mode():
        states = {name: (vae.new_stream_state(), vae.new_stream_state()) for name, vae in vaes.items()}
        for i in range(repeats + 3):  # 3 to warm up
            z = latents[i % len(latents)]
            for name, vae in vaes.items():
                whole, apart = states[name]
                t = time.perf_counter()
                vae.decode_stream(z, whole)
                took = [(time.perf_counter() - t) * 1e3]
                t = time.perf_counter()
                for _ in vae.decode_stream_parts(z, apart, first_frames=FIRST_PART_FRAMES if i else 0):
                    took.append((time.perf_counter() - t) * 1e3)
                if i >= 3:
                    times[name]["whole_ms"].append(took[0])
                    times[name]["apart_first_ms"].append(took[1])
                    times[name]["apart_whole_ms"].append(took[-1])
    return {name: {k: summarize(v) for k, v in by.items()} for name, by in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.components", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=50, help="timed repetitions per cost")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    report = {
        "convert_ms": convert_costs(args.repeats),
        "bitrate_bps": bitrates(),
        "render_ms": render_cost(20),
        "first_part_ms": first_part_costs(args.repeats),
    }
    for size, s in report["convert_ms"].items():
        print(f"rgb24→yuv420p {size}: median {s['p50']:.3f} ms, p90 {s['p90']:.3f} ms")
    for mime, got in report["bitrate_bps"].items():
        pairs = ", ".join(f"target {int(t) / 1e3:.0f} kbps → {bps / 1e3:.0f} kbps" for t, bps in got.items())
        print(f"{mime}: {pairs}")
    r = report["render_ms"]
    print(f"world render 128x128: median {r['p50']:.2f} ms, p90 {r['p90']:.2f} ms")
    for preset, figures in report["first_part_ms"].items():
        f = {name: s["p50"] for name, s in figures.items()}
        print(
            f"{preset}: decode of a latent frame, one thread: whole {f['whole_ms']:.1f} ms; first "
            f"{FIRST_PART_FRAMES} frames apart: out at {f['apart_first_ms']:.1f} ms, all at "
            f"{f['apart_whole_ms']:.1f} ms (medians)"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
