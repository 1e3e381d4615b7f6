"""The waiting-room benchmark: its command line, and a rehearsal (`--short`, the synthetic model) whose
people drive in the order they came, each after the last, watching the world while they wait."""

from __future__ import annotations

import json

import pytest

from benchmarks.waiting_room import FULL, SHORT, main, parse_args

GAP_BOUND_S = 5.0  # a hand-over on the synthetic model takes under a second; generous for a loaded machine


def test_arguments() -> None:
    cfg = parse_args([])
    assert cfg == FULL and cfg.serve == ("--model", "gridworld") and cfg.modes == ("fresh", "continue")
    assert (cfg.turns.clients, cfg.turns.max_turn_s, cfg.crowd.pollers, cfg.crowd.window_s) == (6, 20.0, 50, 15.0)
    short = parse_args(["--short", "--modes", "fresh", "--max-turn-s", "4"])
    assert short.serve == SHORT.serve and short.modes == ("fresh",) and short.turns.max_turn_s == 4.0
    assert short.turns.clients == 3
    assert "--queue-per-client" in cfg.turns.server_args("continue") and "continue" in cfg.turns.server_args("continue")
    assert cfg.crowd.server_env() == {"WORLDRTC_CREATE_BURST": "60"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--modes", "fresh,later"], "--modes"), (["--clients", "1"], "--clients"), (["--window-s", "0"], "positive")],
)
def test_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.long
@pytest.mark.processes
def test_short_rehearsal(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "waiting_room.json"
    assert main(["--short", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    clients = SHORT.turns.clients
    assert set(result["modes"]) == {"fresh", "continue"}
    for mode, m in result["modes"].items():
        assert m["order"]["drove"] == list(range(clients)) and m["order"]["equal"], m["order"]
        turns = m["turns"]
        assert [t["done"] for t in turns[:-1]] == ["turn_over"] * (clients - 1) and turns[-1]["done"] != "turn_over"
        assert all(t["turn_ending_seconds_left"] is not None for t in turns[:-1])
        gaps = m["handover_gap_s"]["values"]
        assert len(gaps) == clients - 1 and all(0 < g < GAP_BOUND_S for g in gaps), gaps
        # Everyone after the first waited, was told an estimate, and watched the world meanwhile.
        assert all(t["waited_s"] > 0 and t["first_estimate_s"] is not None and t["watches"] for t in turns[1:])
        live = m["live_view"]
        assert live["watches"] >= clients - 1 and live["unique_fps_over_target"]["min"] > 0.5
        assert m["first_estimate_error_s"]["max"] is not None
        continued = [t["parent"] is not None for t in turns[1:]]
        assert all(continued) if mode == "continue" else not any(continued)
    crowd = result["crowd"]
    assert crowd["ratio"]["value"] > 0.5 and crowd["with_pollers"]["client_unique_fps"] > 0
    assert crowd["polls"]["in_window"]["polls"] >= SHORT.crowd.pollers * (SHORT.crowd.window_s - 1)
    assert crowd["polls"]["answered_200"] == crowd["polls"]["polls"] and not crowd["polls"]["non_200"]
    assert "hand-over gap" in capsys.readouterr().out
