"""The models' command line: inspect presets and checkpoints without allocating weights, fetch
released files, and plan memory on a placement (`worldrtc describe|fetch|verify|plan` run it). It
sits above the models, the families and the runtime it reads, at the top of workers/.

python -m workers describe PRESET [--json]
python -m workers fetch PRESET [--dry-run]    (into the Hugging Face cache; HF_HOME, HF_HUB_CACHE, HF_TOKEN)
python -m workers verify PRESET [--checkpoint-dir DIR [--assets-dir DIR]]
    (released or diffusers layout, named first; without a directory, the Hugging Face cache)
python -m workers plan PRESET --placement P --max-sessions N [--gpu-memory-gib 80] [savings] [--json]
python -m workers plan PRESET --placement P --fit-gib 16,24,80    (per card size: the savings it takes, sessions)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from workers.families.registry import family_for
from workers.models import hub
from workers.models.attention_backend import AttentionBackend
from workers.models.checkpoint_files import CheckpointMissing, detect_layout
from workers.models.hub import plan_fetch
from workers.models.loading import KeyReport, state_shapes
from workers.models.presets import PRESETS, ModelPreset, get_preset
from workers.models.resolve import resolve_weights
from workers.models.savings import Savings, add_savings_arguments, savings_from_arguments
from workers.models.weights_dir import compose

if TYPE_CHECKING:
    from workers.models.kernels import KernelConfig
    from workers.runtime.placement import Placement


def describe(name: str) -> dict[str, object]:
    preset = get_preset(name)
    components = {}
    for component, module in family_for(preset).meta_components(preset).items():
        components[component] = {
            "params": sum(p.numel() for p in module.parameters()),
            "state_dict": {k: list(v) for k, v in state_shapes(module).items()},
        }
    return {
        "preset": preset.name,
        "family": preset.family.value,
        "weights": preset.weights_note,
        "resolution": [preset.width_px, preset.height_px],
        "chunk_latent_frames": preset.chunk_latent_frames,
        "tokens_per_latent_frame": preset.tokens_per_latent_frame,
        "params": {k: v["params"] for k, v in components.items()},
        "components": components,
    }


def _human(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def main(argv: list[str] | None = None, prog: str = "python -m workers") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("describe", help="shapes and parameter counts of a preset")
    d.add_argument("preset", choices=sorted(PRESETS))
    d.add_argument("--json", action="store_true", help="print the full description as JSON")
    f = sub.add_parser(
        "fetch",
        help="download a released preset's files (only those) at its pinned revision into the Hugging Face cache",
    )
    f.add_argument("preset", choices=sorted(name for name, p in PRESETS.items() if p.hub is not None))
    f.add_argument("--dry-run", action="store_true", help="say what is cached and what would be downloaded")
    v = sub.add_parser(
        "verify",
        help="check a preset's weights against its shapes, from their headers: a directory (released or "
        "diffusers layout), else the Hugging Face cache (nothing is downloaded)",
    )
    v.add_argument("preset", choices=sorted(PRESETS))
    v.add_argument("--checkpoint-dir", "--checkpoint", dest="checkpoint", type=Path, default=None)
    v.add_argument("--assets-dir", type=Path, default=None, help="VAE, umT5 and tokenizer for a DiT-only directory")
    pl = sub.add_parser("plan", help="memory per worker and device for a placement (workers/runtime/memory_plan.py)")
    pl.add_argument("preset", choices=sorted(PRESETS))
    pl.add_argument("--placement", default="cpu", help="a named placement or a placement .json")
    pl.add_argument("--max-sessions", type=int, default=1)
    pl.add_argument(
        "--gpu-memory-gib",
        "--device-gib",
        dest="device_gib",
        metavar="GIB",
        type=float,
        default=None,
        help="GiB per GPU (default: this machine's, else 80)",
    )
    add_savings_arguments(pl)
    pl.add_argument(
        "--host-memory-gib",
        "--host-gib",
        dest="host_gib",
        metavar="GIB",
        type=float,
        default=None,
        help="host memory for CPU placements (default: available)",
    )
    pl.add_argument(
        "--attention",
        default="auto",
        choices=[b.value for b in AttentionBackend],
        help="attention backend (math counts its score matrix)",
    )
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument(
        "--fit-gib",
        default=None,
        help="comma-separated card sizes in GiB (e.g. 16,24,80): print, for each, the cheapest savings that fit "
        "one session and how many sessions fit with them",
    )
    args = parser.parse_args(argv)

    if args.command == "plan":
        return _plan(args)
    if args.command == "fetch":
        return _fetch(get_preset(args.preset), args.dry_run)
    if args.command == "describe":
        info = describe(args.preset)
        if args.json:
            print(json.dumps(info, indent=1))
        else:
            print(f"{info['preset']}, {info['family']} ({info['weights']})")
            for component, count in info["params"].items():  # type: ignore[attr-defined]
                print(f"  {component:>4}: {_human(count)} parameters ({count:,})")
        return 0

    return _verify(get_preset(args.preset), args.checkpoint, args.assets_dir)


def _fetch(preset: ModelPreset, dry_run: bool) -> int:
    plan = plan_fetch(preset)
    print(plan.describe())
    if plan.complete:
        print(f"every file is cached: {hub.snapshot(plan)}")
        return 0
    if dry_run:
        return 0
    try:
        plan = hub.fetch(plan)
    except CheckpointMissing as exc:  # offline, or a download that ended without its file
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the same command resumes where the download stopped", file=sys.stderr)
        return 130
    print(f"fetched: {hub.snapshot(plan)}")
    return 0


def _verify(preset: ModelPreset, checkpoint: Path | None, assets: Path | None) -> int:
    if checkpoint is not None and not checkpoint.is_dir():
        print(f"error: {checkpoint} is not a directory", file=sys.stderr)
        return 1
    try:
        if checkpoint is None:  # the Hugging Face cache: missing files are named with the command that fetches them
            directory = resolve_weights(preset, None, assets, download=False)
        else:  # every component is checked below, missing files included
            directory = checkpoint if assets is None else compose(checkpoint, assets)
    except (CheckpointMissing, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if directory is None:
        print(f"{preset.name}: {preset.weights_note}; nothing to verify")
        return 0
    if checkpoint is None:
        print(f"weights: {directory} (the Hugging Face cache)")
    if preset.matrix_game is None:  # the Matrix-Game release has one layout
        print(f"layout: {detect_layout(directory).describe()}")
    results = family_for(preset).verify(preset, directory)
    ok = True
    for component, result in results.items():
        if isinstance(result, KeyReport) and result.ok:
            print(f"{component}: ok")
        else:
            ok = False
            print(result.describe(component) if isinstance(result, KeyReport) else f"{component}: {result}")
    print("checkpoint matches the preset" if ok else "checkpoint does NOT match the preset")
    return 0 if ok else 1


def _plan(args: argparse.Namespace) -> int:
    # The plan needs placements, which live in the runtime layer; this CLI is their one meeting point.
    from workers.models.kernels import KernelConfig
    from workers.runtime.memory_plan import DEFAULT_DEVICE_GIB, machine_capacity, placements_that_fit, plan_memory
    from workers.runtime.placement import PlacementError, get_placement
    from workers.runtime.savings_plan import check_savings, choose_savings

    try:
        placement = get_placement(args.placement)
        preset = get_preset(args.preset)
        placement.validate_for(preset, cuda_device_count=64)  # planning for any machine: GPUs are not counted
        kernels = KernelConfig(attention=AttentionBackend(args.attention))
        if args.max_sessions < 1:
            raise ValueError("--max-sessions must be at least 1")
        savings = savings_from_arguments(args)
        check_savings(savings, preset, placement, kernels)
    except (PlacementError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device_gib = args.device_gib
    if device_gib is None and not torch.cuda.is_available():
        device_gib = DEFAULT_DEVICE_GIB  # no GPU here: plan for the common 80 GB card
    if args.fit_gib is not None:
        return _fit(preset, placement, kernels, args.fit_gib, args.host_gib, savings)
    capacity = machine_capacity(device_gib, args.host_gib)
    plan = plan_memory(preset, placement, args.max_sessions, capacity, kernels, savings=savings)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=1, default=str))
    else:
        print(plan.describe())
        if not plan.fits:
            choice = choose_savings(preset, placement, args.max_sessions, capacity, kernels, savings)
            if choice.fits:
                print(f"fits with savings: {choice.savings.describe()} (worldrtc serve adds them when needed)")
            fit = placements_that_fit(preset, args.max_sessions, capacity, kernels, cuda_device_count=64)
            print("placements that fit: " + (", ".join(f"{p} ({k} session(s))" for p, k in fit) or "none"))
    return 0 if plan.fits else 1


def _fit(
    preset: ModelPreset,
    placement: Placement,
    kernels: KernelConfig,
    sizes: str,
    host_gib: float | None,
    savings: Savings,
) -> int:
    from workers.runtime.memory_plan import GIB, machine_capacity, plan_memory
    from workers.runtime.savings_plan import choose_savings

    try:
        cards = [float(x) for x in sizes.split(",")]
    except ValueError:
        print(f"error: --fit-gib takes comma-separated numbers, got {sizes!r}", file=sys.stderr)
        return 2
    one = plan_memory(preset, placement, 1, machine_capacity(max(cards), host_gib), kernels, savings=savings)
    fullest = max(d.total_bytes for d in one.devices if d.device != "cpu" or placement.name == "cpu")
    print(
        f"{preset.name} on {placement.name}: one session takes {fullest / GIB:.1f} GiB on its fullest device "
        f"(savings: {savings.describe()})"
    )
    for gib in cards:
        capacity = machine_capacity(gib, host_gib)
        choice = choose_savings(preset, placement, 1, capacity, kernels, savings)
        if not choice.fits:
            short = max(d.total_bytes for d in choice.plan.devices if d.shortfall_bytes)
            print(f"  {gib:g} GiB cards: 0 session(s) (needs {short / GIB:.1f} GiB with every saving)")
            continue
        fitting = 1
        while (
            fitting < MAX_FIT_SESSIONS
            and plan_memory(preset, placement, fitting + 1, capacity, kernels, savings=choice.savings).fits
        ):
            fitting += 1
        more = "+" if fitting == MAX_FIT_SESSIONS else ""
        needs = max(d.total_bytes for d in choice.plan.devices if d.device != "cpu" or placement.name == "cpu")
        print(
            f"  {gib:g} GiB cards: {fitting}{more} session(s), one takes {needs / GIB:.1f} GiB, "
            f"with savings: {choice.savings.describe()}"
        )
    return 0


MAX_FIT_SESSIONS = 64  # where --fit-gib stops counting


if __name__ == "__main__":
    raise SystemExit(main())
