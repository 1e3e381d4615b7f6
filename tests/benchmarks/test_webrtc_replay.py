"""The WebRTC replay's command line and its engine window (the streaming itself: tests/server/test_e2e*)."""

from __future__ import annotations

import pytest

from benchmarks.webrtc_replay import engine_window, latency_breakdown, parse_args, server_is_here
from worldrtc.frames import ReceivedFrame, prompt_to_frame_s


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


def test_prompt_to_frame_is_send_to_the_first_frame_of_the_first_chunk_that_read_it() -> None:
    frames = [ReceivedFrame(t=1.0 + 0.1 * i, pts=0, stamp=i, content_id=i) for i in range(40)]

    def chunk(index: int, text: str, received_t: float) -> dict:
        return {"index": index, "first_frame": 10 * index, "prompt": {"text": text}, "received_t": received_t}

    chunks = [chunk(0, "day", 2.0), chunk(1, "day", 3.0), chunk(2, "snow", 4.0), chunk(3, "snow", 5.0)]
    # "snow" sent at 2.5 s: chunk 2 read it, its first frame (stamp 20) arrived at 3.0 s.
    got = prompt_to_frame_s(frames, chunks, [("snow", 2.5), ("never read", 2.6)], stamped=True)
    assert got == pytest.approx([0.5])
    # A chunk whose message came before the send is not the one that took the prompt.
    assert prompt_to_frame_s(frames, chunks, [("day", 3.5)], stamped=True) == []


def test_latency_breakdown_splits_each_controls_way_to_the_screen() -> None:
    def row(arrived: float, wait: float, compute: float, queue: float) -> dict:
        return {
            "arrived_s": arrived,
            "sampled_s": arrived + wait,
            "in_pacer_s": arrived + wait + compute,
            "shown_s": arrived + wait + compute + queue,
        }

    unseen = {"arrived_s": 0.5, "sampled_s": None, "in_pacer_s": 0.9, "shown_s": 1.0}  # a branch's first chunk
    timeline = {"controls": [row(1.0, 0.1, 0.2, 0.05), row(2.0, 0.2, 0.2, 0.05), row(3.0, 0.3, 0.2, 0.05), unseen]}
    b = latency_breakdown(timeline, glass_to_glass_p50_s=0.6)
    assert b["controls"] == 3
    assert b["wait_for_sample"] == pytest.approx(0.2) and b["compute"] == pytest.approx(0.2)
    assert b["pacer_queue"] == pytest.approx(0.05) and b["server"] == pytest.approx(0.45)
    assert b["network_and_client"] == pytest.approx(0.15)
    empty = latency_breakdown({"controls": []}, glass_to_glass_p50_s=None)
    assert empty["server"] is None and empty["network_and_client"] is None


def test_cpu_is_read_only_for_a_server_on_this_machine() -> None:
    """Worker pids from /v1/engine name processes here only when the server runs here."""
    assert server_is_here("http://127.0.0.1:8000") and server_is_here("http://localhost:8000/")
    assert server_is_here("http://[::1]:8000") and not server_is_here("https://gpu-box.example:8000")
