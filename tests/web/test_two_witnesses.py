"""Two witnesses of glass-to-glass control latency must agree: the benchmark's and the page's HUD.

The same figure is measured in two independent ways, and each could drift without the other noticing:

- `benchmarks/webrtc_replay.py` (a real aiortc client, run here as its command line against the
  server): control sent → first received frame of the first chunk whose `applied_seq` covers it
  (frames identified by their stamp on the synthetic model, `worldrtc/frames.py`);
- the page's HUD (`web/js/latency.js`, in Chromium): key press → `requestVideoFrameCallback`
  display time of the first presented frame whose RTP pts reaches that chunk's `pts_start`.

One server (the synthetic timing model: fixed stage times, steady on a loaded CPU, small frames that
decode cheaply) serves them one after the other. Both replay the same trace of single key presses
and releases, at the same offsets from the moment their control channel opened, with the random gaps
of the benchmark's own walk, so the changes land at random phases of the chunk schedule and both
sides sample the same phases. Their medians must agree within `AGREEMENT_S`; each needs
`MIN_SAMPLES` samples for its median to mean something. A disagreement means one witness is wrong
(its receive path, its match rule, or its sampling), not the server: that is what this test is for.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.local_server import ServerProcess, local_server, log_tail
from benchmarks.trace import Trace
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, hook, require_browser

pytestmark = [pytest.mark.browser, pytest.mark.long]
sync_api = require_browser()

FPS = 16  # the synthetic model's frame rate with the tiny geometry (16-frame chunks: 1 s each)
FRAME_S = 1 / FPS
SERVER_ARGS = [
    "--model", "synthetic",
    "--stage-ms", "20,150,80",  # encode, DiT, decode: well inside a 1 s chunk, even on a busy CPU
    "--synthetic-geometry", "tiny",  # 128×128 frames: cheap to encode, and to decode on both clients
    "--max-sessions", "1",  # the two witnesses cannot overlap: the second waits for the first's seat
]  # fmt: skip

# The trace: single key presses and releases (what a keyboard sends, and what the page can replay
# key for key), at the random gaps of the benchmark's own walk (Trace.random_walk's defaults).
TRACE_SEED = 7
KEY_CHANGES = 16  # a press and a release of 8 keys: MIN_SAMPLES with some to spare
FIRST_CHANGE_AT_S = 1.5  # after the first chunk is on screen: the schedule is steady by then
MIN_GAP_S, MAX_GAP_S = 0.6, 1.8
KEYS = "wadjlik"  # the model's camera keys that a page's KeyboardEvent.code maps one to one
# After the last change: its chunk starts within a chunk period (1 s) and shows ~0.3 s later; then
# leave time for the chunk's message and the frame to reach both clients.
TAIL_S = 2.5

MIN_SAMPLES = 10  # below this a median says little
# Agreement: two frame periods for what the two clients legitimately differ in (a browser shows a
# frame at its next vsync after decoding it, and the sampled phases differ by the ~tens of ms
# between the two runs' channel-open marks), plus one frame for aiortc's jitter buffer, which hands
# a frame over only when the next frame's first packet arrives (it holds every frame one period).
AGREEMENT_S = 2 * FRAME_S + FRAME_S

CHANNEL_OPEN_TIMEOUT_MS = 45_000
BENCHMARK_TIMEOUT_S = 120.0
OPEN_POLL_MS = 5  # how finely the channel opening is seen: the page's clock mark for the trace


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with local_server(SERVER_ARGS, tmp_path / "server.log") as srv:
        yield srv


def key_trace(path: Path) -> Trace:
    """Write the trace (the TeleFuser shape `benchmarks/trace.py` reads) and return it parsed.
    It ends with a `stop` after TAIL_S: the replay does not send it, it only ends the pass there."""
    rng = random.Random(TRACE_SEED)
    events, held, at_s, last_s = [], None, FIRST_CHANGE_AT_S, 0.0
    for _ in range(KEY_CHANGES):
        if held is None:
            held = rng.choice(KEYS)
            message = {"type": "control", "key": held, "action": "press"}
        else:
            message = {"type": "control", "key": held, "action": "release"}
            held = None
        events.append({"delay_s": at_s - last_s, "message": message})
        last_s = at_s
        at_s += rng.uniform(MIN_GAP_S, MAX_GAP_S)
    events.append({"delay_s": TAIL_S, "message": {"type": "stop"}})
    path.write_text(json.dumps({"events": events}))
    return Trace.load(path)


def benchmark_witness(url: str, trace_path: Path, trace: Trace, out: Path) -> dict[str, Any]:
    """The benchmark's viewer report, from its command line against the running server."""
    # Shorter than a pass plus the replay's 1 s pause between passes: the trace is sent once.
    duration_s = trace.duration_s + 0.5
    cmd = [sys.executable, "-m", "benchmarks.webrtc_replay", "--url", url, "--trace", str(trace_path)]
    cmd += ["--duration-s", f"{duration_s:.3f}", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=BENCHMARK_TIMEOUT_S)
    assert done.returncode == 0, f"benchmark failed:\n{done.stdout}\n{done.stderr}"
    viewer: dict[str, Any] = json.loads(out.read_text())["runs"][0]["viewers"][0]
    return viewer


def page_witness(url: str, trace: Trace, profile: Path) -> dict[str, Any]:
    """The page's hook.stats after Chromium pressed and released the trace's keys on its clock."""
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = context.new_page()
            page.goto(url + "/")
            page.locator("#start-btn").click()
            # The page sends its held keys as one control_state the moment its channel opens, as the
            # benchmark's client starts its replay then: that is the trace's zero for both.
            page.wait_for_function(
                "() => window.worldrtc.state === 'error' || window.worldrtc.lastSeq.control_state !== undefined",
                timeout=CHANNEL_OPEN_TIMEOUT_MS,
                polling=OPEN_POLL_MS,
            )
            t0 = time.perf_counter()
            assert hook(page)["state"] != "error", hook(page)["error"]
            for event in trace.events:
                wait = t0 + event.at_s - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                message = event.message
                if message["type"] == "control":
                    press = page.keyboard.down if message["action"] == "press" else page.keyboard.up
                    press(message["key"])
            state = hook(page)
        finally:
            context.close()
    assert state["state"] == "streaming", state["error"]
    stats: dict[str, Any] = state["stats"]
    return stats


def test_benchmark_and_hud_agree_on_glass_to_glass(server: ServerProcess, tmp_path: Path) -> None:
    trace = key_trace(tmp_path / "keys.json")
    t0 = time.monotonic()
    bench = benchmark_witness(server.url, tmp_path / "keys.json", trace, tmp_path / "webrtc.json")
    bench_s = time.monotonic() - t0
    page = page_witness(server.url, trace, tmp_path / "chromium-profile")
    page_s = time.monotonic() - t0 - bench_s

    g2g = bench["glass_to_glass_s"]
    bench_p50_s, bench_n = g2g["p50"], g2g["count"]
    page_samples_s = [ms / 1000 for ms in page["g2gRecentMs"]]
    page_p50_s, page_n = statistics.median(page_samples_s) if page_samples_s else None, page["g2gSamples"]
    print(
        f"\nglass-to-glass p50: benchmark (aiortc) {bench_p50_s} s of {bench_n} "
        f"({bench['controls_sent']} sent; {bench_s:.1f} s), page HUD {page_p50_s} s of {page_n} "
        f"({page['g2gMethod']}; HUD p50 {page['g2gP50Ms']} ms; {page_s:.1f} s); "
        f"tolerance {AGREEMENT_S:.3f} s\npage samples ms: {[round(ms) for ms in page['g2gRecentMs']]}"
    )
    assert bench_n >= MIN_SAMPLES, f"benchmark: {bench_n} samples of {bench['controls_sent']} controls"
    assert page_n >= MIN_SAMPLES, f"page: {page_n} samples\nserver log:\n{log_tail(server.log)}"
    # The hook's list is the window its own p50 is computed over: both must describe the same samples.
    assert len(page_samples_s) == page_n and page["g2gP50Ms"] == pytest.approx(1000 * page_p50_s)
    assert abs(bench_p50_s - page_p50_s) <= AGREEMENT_S, (
        f"benchmark p50 {bench_p50_s:.3f} s vs page p50 {page_p50_s:.3f} s: more than {AGREEMENT_S:.3f} s apart"
    )
