"""Run the server: `python -m server [--host H] [--port P] [--model M] [--placement P] ...`.

Flags override WORLDRTC_* environment variables, which override the defaults. The URL to open is
printed once the model is loaded and warm. SIGTERM drains, SIGINT stops (server/http/lifecycle.py); the
exit status is 0 after either, 1 when the engine failed, 2 for bad settings.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from pydantic import ValidationError

from server.common.logs import configure_logging
from server.common.settings import Settings, TurnHandover
from server.wire.dispatch import DispatchPolicy
from workers.models.attention_backend import AttentionBackend
from workers.models.hub import FetchPlan
from workers.models.presets import DEFAULT_PRESET, PRESETS, ModelPreset
from workers.models.resolve import resolve_weights
from workers.models.savings import add_savings_arguments


def parse_args(argv: list[str] | None = None, prog: str = "python -m server") -> dict[str, object]:
    p = argparse.ArgumentParser(prog=prog, description="worldrtc: a real-time world-model server")
    p.add_argument("preset", nargs="?", metavar="MODEL", help=f"model preset, as --model (default {DEFAULT_PRESET})")
    p.add_argument("--host", help="bind address (default 127.0.0.1; others need an API token)")
    p.add_argument("--port", type=int, help="HTTP port (default 8000)")
    p.add_argument("--model", help=f"model preset, or 'synthetic' for the timing model (default {DEFAULT_PRESET})")
    p.add_argument("--stage-ms", help="synthetic model: encode,dit,decode hold times in ms (default 100,800,500)")
    p.add_argument("--synthetic-geometry", help="synthetic model: preset whose tensor shapes flow (default 14B)")
    p.add_argument(
        "--synthetic-state-mib", type=float, help="synthetic model: state each session's DiT keeps (default 0)"
    )
    p.add_argument("--dispatch", choices=[d.value for d in DispatchPolicy], help="when chunks start (default jit)")
    p.add_argument(
        "--dispatch-margin-ms",
        type=float,
        metavar="MS",
        help="jit: slack between a chunk's predicted arrival and when the viewer needs it (default 100)",
    )
    p.add_argument("--placement", help="placement preset or .json (default cpu)")
    p.add_argument(
        "--checkpoint-dir",
        help="the release's directory as published (default: built-in weights, or the Hugging Face cache)",
    )
    p.add_argument("--assets-dir", help="VAE, umT5 and tokenizer for a DiT-only --checkpoint-dir (the 14B release)")
    p.add_argument(
        "--random-weights",
        action="store_true",
        default=None,
        help="seeded random weights for a preset that runs on released ones (timing and memory; the frames are noise)",
    )
    p.add_argument("--attention", choices=[b.value for b in AttentionBackend], help="DiT attention kernel (auto)")
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the DiT blocks at warm-up")
    p.add_argument("--deterministic", action="store_true", default=None, help="deterministic algorithms (slower)")
    p.add_argument("--max-sessions", type=int, help="concurrent sessions (default 2)")
    p.add_argument(
        "--gpu-memory-gib",
        "--device-memory-gib",
        dest="device_memory_gib",
        metavar="GIB",
        type=float,
        help="GPU memory the plan may use (default: the device's); savings are added until the model fits",
    )
    add_savings_arguments(p)
    p.add_argument("--host-memory-gib", type=float, help="host memory for CPU placements (default: available)")
    p.add_argument("--fps", type=int, help="video frame rate (default: the model's, 16)")
    p.add_argument(
        "--queue",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with every slot taken, creates wait in line for a ticket (202) rather than get 429 (default on)",
    )
    p.add_argument("--queue-max", type=int, help="tickets waiting at once (default 100)")
    p.add_argument("--queue-per-client", type=int, help="tickets one address may hold (default 2)")
    p.add_argument("--ticket-silence-s", type=float, help="a ticket not polled this long is dropped (default 30)")
    p.add_argument("--connect-window-s", type=float, help="a ready ticket's holder offers within this (default 60)")
    p.add_argument("--max-turn-s", type=float, help="while someone waits, a session ends after this (default: none)")
    p.add_argument("--turn-warning-s", type=float, help="turn_ending this long before a turn ends (default 10)")
    p.add_argument(
        "--turn-handover",
        choices=[h.value for h in TurnHandover],
        help="fresh: the next person starts their own world; continue: they take over this one (default fresh)",
    )
    p.add_argument(
        "--snapshot-dir",
        help=f"where saves outlive the server (default {default_snapshot_dir()}; WORLDRTC_SNAPSHOT_DIR= for none)",
    )
    p.add_argument("--api-token", help="require this bearer token (mandatory off loopback)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-format", default="text", choices=("text", "json"), help="json: one object per line")
    args = vars(p.parse_args(argv))
    preset = args.pop("preset")
    if preset is not None:
        if args["model"] not in (None, preset):
            p.error(f"the model is named twice: {preset} and --model {args['model']}")
        args["model"] = preset
    logging_opts = {"_log_level": args.pop("log_level"), "_log_format": args.pop("log_format")}
    return {k: v for k, v in args.items() if v is not None} | logging_opts


def main(argv: list[str] | None = None, prog: str = "python -m server") -> int:
    overrides = parse_args(argv, prog)
    log_level = str(overrides.pop("_log_level"))
    configure_logging(log_level, str(overrides.pop("_log_format")))
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
        if "snapshot_dir" not in overrides and "WORLDRTC_SNAPSHOT_DIR" not in os.environ:
            settings = settings.model_copy(update={"snapshot_dir": default_snapshot_dir()})
        if settings.model in PRESETS and not settings.random_weights:
            settings = with_weights(settings, PRESETS[settings.model])
    except (ValidationError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("worldrtc: interrupted; the same command resumes the download", file=sys.stderr)
        return 130
    import torch
    import uvicorn

    from server.http.app import create_app
    from server.http.lifecycle import serve
    from workers.runtime.channel import remove_orphaned_segments

    # This process runs no model: the stage workers compute, at their own thread counts. An intra-op
    # pool here would only spin on the cores they need (see `_host_copy` in workers/runtime/channel.py).
    torch.set_num_threads(1)

    # What an earlier server killed with all its workers at once (kill -9 of its process group, the
    # OOM killer) left in shared memory: its workers could not unlink their channel files.
    if orphans := remove_orphaned_segments():
        logging.getLogger("worldrtc.server").warning(
            "removed %d shared-memory files left by processes that no longer run", orphans
        )
    try:
        app = create_app(settings)
    except ValueError as exc:  # PlacementError included: placement, kernels, memory plan
        print(f"error: {exc}", file=sys.stderr)
        return 2
    state = app.state.worldrtc
    url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{settings.port}/"
    print(f"worldrtc: loading {state.preset.name} on placement {state.placement.name} …", flush=True)
    if state.savings != settings.savings:
        print(f"worldrtc: to fit the memory, savings: {state.savings.describe()}", flush=True)
    elif state.savings.names():
        print(f"worldrtc: savings: {state.savings.describe()}", flush=True)
    if settings.snapshot_dir is not None:
        print(f"worldrtc: saves in {settings.snapshot_dir}", flush=True)

    def announce() -> None:
        note = state.preset.weights_note
        print(f"worldrtc: ready in {state.ready_s:.1f} s ({state.preset.name}: {note})", flush=True)
        print(f"worldrtc: open {url}", flush=True)

    state.on_ready = announce
    code = serve(state, uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level))
    if code:
        why = state.engine.fatal_error or state.load_error or "see the log above"
        print(f"worldrtc: stopped with an engine failure: {why}", file=sys.stderr, flush=True)
    return code


def default_snapshot_dir() -> Path:
    """Saves of `worldrtc serve` when not told otherwise: the user's state directory (XDG)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "worldrtc" / "snapshots"


def with_weights(settings: Settings, preset: ModelPreset) -> Settings:
    """Settings whose checkpoint_dir is the one directory the workers load (workers/models/resolve.py):
    names are checked before torch loads, so a preset without its weights fails in a fraction of a
    second; files missing from the Hugging Face cache are downloaded once the placement is known to
    fit this machine."""

    def placement_fits(plan: FetchPlan) -> None:
        from workers.runtime.memory_plan import machine_capacity
        from workers.runtime.placement import get_placement
        from workers.runtime.savings_plan import fit_savings

        placement = get_placement(settings.placement)
        placement.validate_for(preset)  # the devices it names are on this machine
        capacity = machine_capacity(settings.device_memory_gib, settings.host_memory_gib)
        fit_savings(preset, placement, settings.max_sessions, capacity, settings.kernels, settings.savings)

    path = resolve_weights(
        preset, settings.checkpoint_dir, settings.assets_dir, download=True, before_download=placement_fits
    )
    if path is None or str(path) == settings.checkpoint_dir:
        return settings
    print(f"worldrtc: {preset.name} weights in {path}", flush=True)
    return settings.model_copy(update={"checkpoint_dir": str(path), "assets_dir": None})


def exit_now(code: int) -> None:
    """Exit without tearing down the interpreter: everything the server shares (workers, shared
    memory, sockets) is released by now, and unloading torch's modules takes a second for nothing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
