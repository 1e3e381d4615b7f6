"""End to end in a real browser: Debian's Chromium (driven by Playwright) against the real server.

Starts `python -m server --model tiny --placement cpu` on a free loopback port, opens the page,
starts a session from the first built-in scene, waits for 2 s of displayed video, holds W then J
and checks that chunks come back with those keys applied and that the HUD shows live numbers, then
stops the session and shuts the server down with SIGINT.

Skipped (with the reason) where /usr/bin/chromium or the playwright module is missing.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.local_server import ServerProcess, local_server, log_tail
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, CHUNK_TIMEOUT_MS, hook, require_browser, wait_for_chunk

FIRST_VIDEO_TIMEOUT_MS = 45_000
MIN_FRAMES = 32  # 2 s at 16 FPS
SERVER_EXIT_TIMEOUT_S = 30.0

pytestmark = pytest.mark.browser
sync_api = require_browser()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with local_server(["--model", "tiny", "--placement", "cpu"], tmp_path / "server.log") as srv:
        yield srv


def _number(text: str) -> float:
    match = re.search(r"-?\d+(?:\.\d+)?", text)
    assert match, f"expected a number in {text!r}"
    return float(match.group())


def test_browser_session_end_to_end(server: ServerProcess, tmp_path: Path) -> None:
    base, proc, log = server.url, server.proc, server.log
    t0 = time.monotonic()
    page_errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh --user-data-dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            page = context.new_page()
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            page.on("console", lambda m: page_errors.append(m.text) if m.type == "error" else None)
            page.goto(base + "/")

            first_scene = page.locator(".scene[data-kind='scene']").first
            first_scene.wait_for(timeout=15_000)
            first_scene.click()
            assert page.locator(".scene[data-kind='scene'] input").first.is_checked()
            weights = page.locator("#weights-note")
            model = hook(page)["model"]
            if "random" in (model.get("weights") or "").lower():
                assert weights.is_visible() and "random" in weights.inner_text().lower()

            page.locator("#start-btn").click()
            page.wait_for_function(
                f"() => window.worldrtc.state === 'error' || window.worldrtc.stats.framesDisplayed >= {MIN_FRAMES}",
                timeout=FIRST_VIDEO_TIMEOUT_MS,
            )
            state = hook(page)
            assert state["state"] == "streaming", f"no video: {state['error']}\nserver log:\n{log_tail(log)}"
            assert state["stats"]["firstFrameS"] is not None and state["stats"]["firstFrameS"] > 0
            assert page.locator("#video").evaluate("v => v.videoWidth > 0 && !v.paused")

            page.keyboard.down("w")
            chunk_w = wait_for_chunk(page, ["w"])
            page.keyboard.down("j")
            chunk_wj = wait_for_chunk(page, ["w", "j"])
            assert chunk_wj["index"] >= chunk_w["index"]
            page.keyboard.up("j")
            page.keyboard.up("w")
            page.wait_for_function(
                "() => window.worldrtc.state === 'error' || window.worldrtc.stats.g2gP50Ms !== null",
                timeout=CHUNK_TIMEOUT_MS,
            )
            state = hook(page)
            stats = state["stats"]
            assert state["state"] == "streaming", state["error"]
            assert stats["chunksReceived"] >= 2
            assert 0 < stats["g2gP50Ms"] < 20_000
            assert stats["fps"] > 0
            assert _number(page.locator("#hud-fps").inner_text()) > 0
            latency = page.locator("#hud-latency").inner_text()
            assert _number(latency) > 0
            # A median of a few presses says little: the HUD shows the last one and the count until 10.
            n = stats["g2gSamples"]
            assert latency.startswith("last ") if n < 10 else " ms p50 of " in latency, (n, latency)
            assert page.locator("#hud-state").inner_text() == "streaming"
            assert page.locator("#hud-buffered").inner_text().endswith(" ms")  # from the server's stats
            assert _number(page.locator("#hud-predicted").inner_text()) > 0
            assert _number(page.locator("#hud-repeats").inner_text()) >= 0
            page.screenshot(path=str(tmp_path / "worldrtc.png"))
            print("worldrtc browser stats:", json.dumps({k: v for k, v in stats.items() if k != "lastChunk"}))

            page.locator("#stop-btn").click()
            page.wait_for_function("() => window.worldrtc.state === 'closed'", timeout=5_000)
            assert page.locator("#start-btn").is_enabled()
        finally:
            context.close()

    assert not [e for e in page_errors if "favicon" not in e], f"errors in the page: {page_errors}"
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=SERVER_EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"server still running {SERVER_EXIT_TIMEOUT_S:.0f} s after SIGINT:\n{log_tail(log)}")
    assert code is not None
    print(f"browser test body took {time.monotonic() - t0:.1f} s; server exit code {code}")
