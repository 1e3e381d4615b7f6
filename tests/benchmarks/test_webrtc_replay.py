"""The WebRTC replay's command line and its engine window (the streaming itself: tests/server/test_e2e*)."""

from __future__ import annotations

import pytest

from benchmarks.webrtc_replay import engine_window, parse_args


def test_arguments(tmp_path) -> None:
    args = parse_args(["--serve", "--model synthetic", "--dispatch", "jit,chunk-synchronous", "--out", "r.json"])
    assert args.policies == ["jit", "chunk-synchronous"] and args.viewers == 1
    assert parse_args(["--out", "r.json"]).policies == [None]  # the server's default


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dispatch", "asap"], "--dispatch takes"),
        (["--viewers", "0"], "--viewers"),
        (["--url", "http://x", "--serve", ""], "not allowed with"),
    ],
)
def test_bad_arguments(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args([*argv, "--out", "r.json"])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_window_gives_the_dit_idle_fraction_between_two_readings() -> None:
    def reading(dit_busy: float, dit_idle: float) -> dict:
        stages = {"encode": (1.0, 9.0), "dit": (dit_busy, dit_idle), "decode": (5.0, 5.0)}
        return {"stage_busy_idle_s": {s: {"busy_s": b, "idle_s": i} for s, (b, i) in stages.items()}}

    w = engine_window(reading(10.0, 2.0), reading(18.0, 4.0), wall_s=10.0)
    assert w["dit_idle_fraction"] == pytest.approx(0.2) and w["stage_busy_s"]["dit"] == pytest.approx(8.0)
