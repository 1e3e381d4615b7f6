"""Inspect presets and checkpoints without allocating weights.

python -m workers.models describe PRESET [--json]
python -m workers.models verify PRESET --checkpoint DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workers.models.components import meta_components, verify_checkpoint
from workers.models.loading import KeyReport, state_shapes
from workers.models.presets import PRESETS, get_preset


def describe(name: str) -> dict[str, object]:
    preset = get_preset(name)
    components = {}
    for component, module in meta_components(preset).items():
        components[component] = {
            "params": sum(p.numel() for p in module.parameters()),
            "state_dict": {k: list(v) for k, v in state_shapes(module).items()},
        }
    return {
        "preset": preset.name,
        "weights": preset.weights_note,
        "resolution": [preset.width_px, preset.height_px],
        "chunk_latent_frames": preset.chunk_latent_frames,
        "tokens_per_latent_frame": preset.tokens_per_latent_frame,
        "params": {k: v["params"] for k, v in components.items()},
        "components": components,
    }


def _human(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("describe", help="shapes and parameter counts of a preset")
    d.add_argument("preset", choices=sorted(PRESETS))
    d.add_argument("--json", action="store_true", help="print the full description as JSON")
    v = sub.add_parser("verify", help="check a checkpoint directory against a preset")
    v.add_argument("preset", choices=sorted(PRESETS))
    v.add_argument("--checkpoint", type=Path, required=True)
    args = parser.parse_args(argv)

    if args.command == "describe":
        info = describe(args.preset)
        if args.json:
            print(json.dumps(info, indent=1))
        else:
            print(f"{info['preset']} ({info['weights']})")
            for component, count in info["params"].items():  # type: ignore[attr-defined]
                print(f"  {component:>4}: {_human(count)} parameters ({count:,})")
        return 0

    if not args.checkpoint.is_dir():
        print(f"error: {args.checkpoint} is not a directory", file=sys.stderr)
        return 1
    results = verify_checkpoint(get_preset(args.preset), args.checkpoint)
    ok = True
    for component, result in results.items():
        if isinstance(result, KeyReport) and result.ok:
            print(f"{component}: ok")
        else:
            ok = False
            print(result.describe(component) if isinstance(result, KeyReport) else f"{component}: {result}")
    print("checkpoint matches the preset" if ok else "checkpoint does NOT match the preset")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
