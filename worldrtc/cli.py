"""`worldrtc`: one command for serving, weights and replays (the console script in pyproject.toml).

    worldrtc serve [MODEL] [flags]     the server (default: the embedded world); prints the URL to open
    worldrtc fetch MODEL [--dry-run]   a released preset's files into the Hugging Face cache, ahead of time
    worldrtc verify [MODEL] [--checkpoint-dir DIR [--assets-dir DIR]]   weights against the preset's shapes
    worldrtc plan MODEL --placement P [--max-sessions N]   memory per device, before anything loads
    worldrtc describe MODEL            shapes and parameter counts
    worldrtc replay [MODEL] [flags]    headless: a control trace in, a video and figures out

Each subcommand is the command line of a module that also runs as `python -m` (server,
workers.models, benchmarks.replay): this module sits above every layer, dispatches to them and
names itself in their usage lines (`usage: worldrtc plan ...`). Every command takes the model as a
positional word, as `vllm serve MODEL` takes it, and one name per idea across them (the README
lists the older names they still accept).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from workers.models.presets import DEFAULT_PRESET, PRESETS

USAGE = __doc__.split("\n\n")[1]


def _serve(argv: list[str]) -> int:
    from server.__main__ import exit_now
    from server.__main__ import main as serve

    exit_now(serve(argv, prog="worldrtc serve"))
    return 0  # not reached: exit_now ends the process


def _models(command: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from workers.__main__ import main as models

        if command == "verify" and (not argv or argv[0].startswith("-")):
            argv = [DEFAULT_PRESET, *argv]
        return models([command, *argv], prog="worldrtc")

    return run


def _replay(argv: list[str]) -> int:
    from benchmarks.replay import main as replay

    return replay(argv, prog="worldrtc replay")


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "serve": _serve,
    "fetch": _models("fetch"),
    "verify": _models("verify"),
    "plan": _models("plan"),
    "describe": _models("describe"),
    "replay": _replay,
}


def help_text() -> str:
    from workers.runtime.placement import PLACEMENTS

    width = max(len(name) for name in PRESETS)

    def weights(name: str) -> str:
        p = PRESETS[name]
        if p.hub is not None:
            repos = " + ".join(r.repo_id for r in p.hub.repos)
            return f"{repos} (about {p.hub.approx_bytes / 1e9:.0f} GB)"
        return p.weights_note + (" (default)" if name == DEFAULT_PRESET else "")

    models = "\n".join(f"  {name:<{width}}  {weights(name)}" for name in PRESETS)
    return (
        f"usage: worldrtc COMMAND [ARGS]   (worldrtc COMMAND --help for its flags)\n\n{USAGE}\n\n"
        f"models:\n{models}\n\nplacements: {', '.join(PLACEMENTS)}, or a placement .json\n"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(help_text(), end="")
        return 0 if args else 2
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"worldrtc: unknown command {args[0]!r}; one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return command(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
