"""`worldrtc COMMAND --help` names the command as people type it, and each idea has one flag name
across the commands (older names parse to the same setting)."""

from __future__ import annotations

import pytest

from benchmarks.replay import parse_args as replay_args
from worldrtc.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_usage_line_says_worldrtc_and_the_command(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: worldrtc {command} ")


def _flags(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


def test_one_name_per_idea_across_serve_plan_verify_and_replay(capsys: pytest.CaptureFixture[str]) -> None:
    helps = {command: _flags(command, capsys) for command in ("serve", "plan", "verify", "replay")}
    for flag, commands in {
        "--gpu-memory-gib": ("serve", "plan"),
        "--host-memory-gib": ("serve", "plan"),
        "--checkpoint-dir": ("serve", "verify", "replay"),
        "--attention": ("serve", "plan", "replay"),
        "--quantization": ("serve", "plan", "replay"),
    }.items():
        assert [c for c in commands if flag not in helps[c]] == [], flag
    assert "--host-gib HOST_GIB" not in helps["plan"]  # an alias, not a flag of its own


def test_replay_takes_the_model_as_its_first_word_and_its_old_flag_names() -> None:
    args = replay_args(["tiny", "--chunk-frames", "2", "--checkpoint", "unused", "--random-weights", "--out", "x.json"])
    assert (args.model, args.chunk_frames) == ("tiny", 2)
    assert replay_args(["--model", "tiny", "--chunk-latent-frames", "2", "--out", "x.json"]).chunk_frames == 2
    with pytest.raises(SystemExit):
        replay_args(["tiny", "--model", "gridworld", "--out", "x.json"])
