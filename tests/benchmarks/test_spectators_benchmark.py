"""The spectators benchmark: its command line, its CPU window, a late spectator's frame identity, the
figures against their targets, and a short run against the synthetic model."""

from __future__ import annotations

import json

import pytest

from benchmarks.spectators import Reading, cpu_window, figures, headline, main, parse_args, spectator_figures
from worldrtc.client import ClientRun
from worldrtc.frames import ReceivedFrame

STEP = 90_000 // 16  # one frame at 16 FPS on the 90 kHz clock


def test_arguments() -> None:
    args = parse_args(["--out", "r.json"])
    assert (args.spectators, args.spectator_processes, args.duration_s, args.warmup_s) == (8, 2, 60.0, 10.0)
    assert args.serve == "--placement cpu"
    assert parse_args(["--out", "r.json", "--duration-s", "15"]).warmup_s == pytest.approx(2.5)
    assert parse_args(["--child"]).out is None  # a spectator process writes no report


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--out"),
        (["--out", "r.json", "--spectators", "-1"], "must not be negative"),
        (["--out", "r.json", "--duration-s", "10", "--warmup-s", "10"], "--warmup-s"),
    ],
)
def test_bad_arguments(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def _reading(t: float, server: float, workers: dict[int, float], machine: float) -> Reading:
    return Reading(
        t=t,
        server_cpu_s=server,
        descendants_cpu_s=workers,
        descendant_names={7: "resource tracker"},
        bench_cpu_s=t / 10,
        watchers_cpu_s=0.0,
        machine_busy_s=machine,
        engine={"workers": {"encode": [5], "dit": [6]}},
    )


def test_cpu_window_is_per_wall_second_with_workers_by_stage() -> None:
    before = _reading(10.0, 1.0, {5: 1.0, 6: 2.0, 7: 0.0}, 100.0)
    after = _reading(20.0, 3.0, {5: 2.0, 6: 7.0, 7: 0.0, 8: 1.0}, 115.0)  # pid 8 started in the window
    w = cpu_window(before, after)
    assert w["window_s"] == 10.0 and w["server_cores"] == pytest.approx(0.2)
    assert w["workers_cores"] == pytest.approx({"encode": 0.1, "dit": 0.5, "resource tracker": 0.0, "pid 8": 0.1})
    # the machine's 1.5 cores less the server's 0.2, the workers' 0.7 and this process's 0.1
    assert w["others_cores"] == pytest.approx(0.5)


def _chunk(index: int, first_frame: int, pts_start: int, n: int) -> dict:
    return {"index": index, "first_frame": first_frame, "num_frames": n, "pts_start": pts_start, "applied_seq": None}


def test_a_late_spectator_is_identified_by_the_sessions_chunk_messages() -> None:
    # The session: frames 0–12 and 13–28 at pts 0–28, a repeat at pts 29, then frames 29–44 at pts 30–45.
    driver_chunks = [_chunk(0, 0, 0, 13), _chunk(1, 13, 13 * STEP, 16), _chunk(2, 29, 30 * STEP, 16)]
    # A spectator whose first frame was frame 20: its pts count from there; the message of chunk 1,
    # sent before it joined, came again as it connected.
    # It lost the frame at pts 40 (frame 39) in delivery; the driver received every frame.
    session_pts = [p for p in range(20, 46) if p != 40]
    frames = [[100.0 + k / 16, (p - 20) * STEP, None, k] for k, p in enumerate(session_pts)]
    ready = {"fps": 16, "chunk_frames": 16, "model": "gridworld"}
    driver = ClientRun(
        frames=[ReceivedFrame(90.0 + p / 16, p * STEP, None, p) for p in range(46)], chunks=driver_chunks, ready=ready
    )
    record = {
        "index": 0,
        "started_t": 99.0,
        "post_t": 99.5,
        "first_frame_t": 100.0,
        "frames": frames,
        "chunks": driver_chunks[1:],
        "ready": ready,
        "pts_origin": 20 * STEP,
        "errors": [],
        "done": None,
        "stats_last": None,
    }
    s = spectator_figures(record, driver)
    assert (s["unique_frames"], s["repeated_frames"], s["out_of_order_frames"]) == (24, 1, 0)
    assert s["frames_not_in_its_chunk_messages"] == 1  # the repeat at pts 29
    assert s["frames_missed_first"] == [39] and s["frames_missed_that_the_driver_received"] == 1
    assert s["join_s"] == pytest.approx(0.5) and s["start_s"] == pytest.approx(1.0)
    assert s["glass_to_glass_s"]["count"] == 0  # a spectator sends no controls


def _phase(n: int, fractions: list[float], g2g_p50: float, cpu: float, joins: list[float | None]) -> dict:
    driver, *spectators = ({"client_unique_fps_over_target": f} for f in fractions)
    return {
        "spectators_requested": n,
        "driver": driver | {"glass_to_glass_s": {"p50": g2g_p50}},
        "spectators": spectators,
        "cpu": {"server_cores": cpu},
        "joins": [
            {"event": "joined", "join_s": j} if j is not None else {"event": "failed", "error": "x"} for j in joins
        ],
    }


def test_figures_against_their_targets() -> None:
    alone = _phase(0, [1.0], 1.00, 0.10, [])
    f = figures(alone, _phase(3, [1.0, 0.99, 0.985, 0.98], 1.05, 0.12, [0.3, 0.5, 2.0]))
    assert all(v["pass"] for v in f.values())
    assert f["server_cpu_ratio"]["value"] == pytest.approx(1.2)
    assert f["driver_glass_to_glass_p50_increase"]["value"] == pytest.approx(0.05)
    assert f["join_to_first_frame_p50_s"]["value"] == pytest.approx(0.5)

    f = figures(alone, _phase(3, [1.0, 0.99, 0.97], 1.2, 0.14, [0.3, None, 0.4]))
    assert not any(v["pass"] for v in f.values())  # a spectator missing, +20 %, 1.4x, one join failed
    assert f["unique_fps_fraction_min"]["value"] == 0.0


@pytest.mark.long
@pytest.mark.processes
def test_short_run_against_the_synthetic_model(tmp_path, capsys) -> None:
    out = tmp_path / "spectators.json"
    serve = "--model synthetic --stage-ms 20,150,100 --synthetic-geometry gridworld"
    argv = ["--serve", serve, "--duration-s", "8", "--spectators", "2", "--spectator-processes", "1"]
    assert main([*argv, "--warmup-s", "1", "--join-interval-s", "0.2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    crowd = result["phases"]["with_spectators"]
    assert [j["event"] for j in crowd["joins"]] == ["joined", "joined"]
    assert crowd["server_session"]["metrics"]["spectators"] == 2
    for viewer in [crowd["driver"], *crowd["spectators"]]:
        assert viewer["identity"] == "frame stamps" and viewer["unique_frames"] > 16
        assert viewer["out_of_order_frames"] == 0
    assert result["phases"]["driver_alone"]["cpu"]["server_cores"] > 0
    assert result["figures"]["join_to_first_frame_p50_s"]["value"] is not None
    assert "spectator join -> first frame" in capsys.readouterr().out
    assert headline(result)[0].startswith("every viewer (driver + 2 spectators)")
