"""The page on a phone, its errors and its accessibility, in Debian's Chromium against the real server.

One server for the module: the synthetic timing model (stage workers that hold 20, 120 and 80 ms per
chunk and stamp frame numbers), so the page, the server, WebRTC and the workers are the real ones
and only the world model is not; `--max-sessions 1`, so a second session waits in line, and turns of
60 s announced 60 s ahead, so that a driver sees its countdown as soon as someone waits.

- Touch: a phone viewport (390 × 844, touch events through Chromium's input pipeline) walks with the
  on-screen stick, turns with the hold button, looks by dragging the video and resets the camera;
  every gesture reaches the server (a later chunk's applied control sequence number and keys).
- Errors: files that are not PNG or JPEG, undecodable or too large are refused before upload with a
  sentence and no thumbnail; a scene the server no longer has offers "Pick a scene", which fixes it;
  a full server puts the page in line until the slot frees.
- The waiting room: a phone-sized page in line shows its place over the world the driver walks (a
  watch under the overlay); the driver's HUD counts its turn down; the phone streams once the driver
  stops.
- Accessibility: every control is reached with Tab and shows a focus ring, every control has an
  accessible name, and at 200 % zoom the HUD and its stage timeline (key T) fit inside the video.
- Controls help: built from what the served model accepts (GET /v1/model `accepts`), so a model
  without mouse look (Temple Run) offers no mouse, and keys a model ignores are not listed.
- Client modules: every ES module under web/js is named by index.html and served with a JavaScript
  type (browsers refuse to run a module script served as anything else).
- Spectators: the driver's share link opens a spectator's view (the video and the HUD, no controls,
  nothing created and no model description read); the driver sees who watches; Leave ends the watch
  on the server; a new link ends the old one's watch ("The driver stopped sharing"), and the old link
  is refused in the server's words; when the driver stops, the spectator is told the world has ended.
- Snapshots: Save (key P, which steers nothing) keeps the world and adds a thumbnail of the video to
  the strip; Branch starts a new session from it in place of the live one (the HUD names its parent)
  and the strip outlives the session it was saved in, and a reload of the page; Rewind takes the live session back to a
  snapshot on the same connection (the `rewound` message) and it plays on; × forgets one. A server
  without snapshots gets a sentence, and the session streams on.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.local_server import ServerProcess, local_server
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, CHUNK_TIMEOUT_MS, hook, require_browser, wait_for_chunk

pytestmark = pytest.mark.browser
sync_api = require_browser()

STREAM_TIMEOUT_MS = 30_000
WEB_MODULES = sorted((Path(__file__).resolve().parents[2] / "web" / "js").glob("*.js"))
PYTHON_INTERNALS = re.compile(r"<[\w.]+ object at 0x|\b[A-Z]\w*(Error|Exception)\b|Traceback|BytesIO")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("page") / "server.log"
    args = ["--model", "synthetic", "--stage-ms", "20,120,80", "--synthetic-geometry", "tiny", "--max-sessions", "1"]
    args += ["--max-turn-s", "60", "--turn-warning-s", "60"]
    with local_server(args, log) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def errors() -> list[str]:
    return []


@pytest.fixture(autouse=True)
def slot_freed(browser: Any, server: ServerProcess) -> Iterator[None]:
    """Each test leaves the server's one slot free, whether it passed or not: a test that fails with
    a session streaming must not make the next ones meet a busy server."""
    yield
    for context in browser.contexts:
        context.close()
    with httpx.Client(base_url=server.url, timeout=5.0) as client:
        for _ in range(100):
            if client.get("/capacityz").status_code == 200:
                return
            time.sleep(0.1)
    pytest.fail("the session slot was still taken 10 s after the test's pages closed")


def open_page(browser: Any, server: ServerProcess, errors: list[str], **context: Any) -> Any:
    page = browser.new_context(**context).new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(server.url + "/")
    page.locator(".scene[data-kind='scene'] input:checked").wait_for(state="attached", timeout=15_000)
    return page


def wait_streaming(page: Any) -> None:
    page.wait_for_function(
        "() => window.worldrtc.state === 'error' || window.worldrtc.stats.framesDisplayed >= 8",
        timeout=STREAM_TIMEOUT_MS,
    )
    state = hook(page)
    assert state["state"] == "streaming", state["error"]


def stop(page: Any, close: bool = True) -> None:
    page.locator("#stop-btn").click()
    page.wait_for_function("() => window.worldrtc.state === 'closed'", timeout=5_000)
    if close:
        page.context.close()


def no_page_errors(errors: list[str]) -> None:
    # A refused create is logged by Chromium as a failed resource load; nothing else may appear.
    real = [e for e in errors if "favicon" not in e and "status of 4" not in e]
    assert not real, f"errors in the page: {real}"


def centre(page: Any, selector: str, dx: float = 0.0, dy: float = 0.0) -> tuple[float, float]:
    box = page.locator(selector).bounding_box()
    assert box is not None, f"{selector} is not laid out"
    return box["x"] + box["width"] / 2 + dx * box["width"] / 2, box["y"] + box["height"] / 2 + dy * box["height"] / 2


class Finger:
    """One finger on the touch screen: Chromium's own touch input (CDP), so the page gets the touch
    and pointer events a phone's browser makes."""

    def __init__(self, page: Any) -> None:
        self.cdp = page.context.new_cdp_session(page)

    def _touch(self, kind: str, x: float, y: float) -> None:
        points = [] if kind == "touchEnd" else [{"x": x, "y": y, "id": 1}]
        self.cdp.send("Input.dispatchTouchEvent", {"type": kind, "touchPoints": points})

    def down(self, xy: tuple[float, float]) -> None:
        self._touch("touchStart", *xy)

    def move(self, xy: tuple[float, float]) -> None:
        self._touch("touchMove", *xy)

    def up(self) -> None:
        self._touch("touchEnd", 0, 0)


def last_seq(page: Any, kind: str) -> int:
    seq = hook(page)["lastSeq"].get(kind)
    assert isinstance(seq, int), f"no {kind} message was sent"
    return seq


def test_touch_walks_turns_looks_and_resets_on_a_phone(browser: Any, server: ServerProcess, errors: list[str]) -> None:
    page = open_page(browser, server, errors, viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    page.locator("#start-btn").tap()
    wait_streaming(page)
    assert hook(page)["touchUi"]
    assert page.locator("#touch-controls").is_visible() and not page.locator("#look-btn").is_visible()
    assert page.evaluate("() => document.scrollingElement.scrollWidth") <= 390  # nothing sticks out sideways
    finger = Finger(page)

    finger.down(centre(page, "#stick"))
    finger.move(centre(page, "#stick", dy=-0.8))  # push forward
    wait_for_chunk(page, ["w"], last_seq(page, "control"), exact=True)
    finger.move(centre(page, "#stick", dx=0.6, dy=-0.6))  # forward and right
    wait_for_chunk(page, ["d", "w"], last_seq(page, "control"), exact=True)
    finger.up()
    wait_for_chunk(page, [], last_seq(page, "control"), exact=True)  # let go: nothing held

    finger.down(centre(page, "#turn-right-btn"))
    wait_for_chunk(page, ["l"], last_seq(page, "control"), exact=True)
    finger.up()
    wait_for_chunk(page, [], last_seq(page, "control"), exact=True)

    x, y = centre(page, "#video-box", dy=-0.3)  # above the controls
    finger.down((x, y))
    for step in range(1, 6):
        finger.move((x + 12 * step, y + 4 * step))
        page.wait_for_timeout(40)
    finger.up()
    page.wait_for_function("() => window.worldrtc.lastSeq.look !== undefined", timeout=5_000)
    wait_for_chunk(page, [], last_seq(page, "look"))

    page.locator("#reset-btn").tap()
    wait_for_chunk(page, [], last_seq(page, "reset_pose"))
    assert page.locator("#hud-fps").is_visible()  # the phone HUD keeps the rows a viewer acts on
    stop(page)
    no_page_errors(errors)


def test_files_that_cannot_be_a_start_image_are_refused_before_upload(
    browser: Any, server: ServerProcess, errors: list[str], tmp_path: Path
) -> None:
    page = open_page(browser, server, errors, viewport={"width": 1280, "height": 800})
    message = page.locator("#message")
    huge = tmp_path / "huge.png"
    with huge.open("wb") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: refused on its size, never read
    cases = [
        ({"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hello"}, "is not a PNG or JPEG image"),
        ({"name": "broken.png", "mimeType": "image/png", "buffer": b"\x89PNG\r\n\x1a\n garbage"}, "could not be read"),
        (str(huge), "choose an image under 64.0 MiB"),
    ]
    for file, expected in cases:
        page.locator("#image-input").set_input_files(file)
        page.wait_for_function(
            "(text) => document.getElementById('message').textContent.includes(text)", arg=expected, timeout=5_000
        )
        text = message.inner_text()
        assert not PYTHON_INTERNALS.search(text), text
        assert page.locator(".scene[data-kind='image']").count() == 0  # no thumbnail for it
        assert page.locator(".scene[data-kind='scene'] input").first.is_checked()  # the choice stands

    scene_png = httpx.get(server.url + "/v1/scenes/main-street").content
    page.locator("#image-input").set_input_files({"name": "mine.png", "mimeType": "image/png", "buffer": scene_png})
    page.locator(".scene[data-kind='image'] input:checked").wait_for(state="attached", timeout=5_000)
    assert "Using" in message.inner_text()
    page.context.close()
    no_page_errors(errors)


def test_a_missing_scene_offers_a_fix_and_a_full_server_puts_the_page_in_line(
    browser: Any, server: ServerProcess, errors: list[str]
) -> None:
    page = open_page(browser, server, errors, viewport={"width": 1280, "height": 800})

    # A scene list that went stale (the server no longer has "atlantis"): the create is refused.
    def stale_list(route: Any) -> None:
        response = route.fetch()
        body = response.json()
        body["scenes"].insert(0, {"name": "atlantis", "url": body["scenes"][0]["url"]})
        route.fulfill(response=response, body=json.dumps(body))

    page.route("**/v1/model", stale_list)
    page.reload()
    page.locator(".scene[data-name='atlantis'] input:checked").wait_for(state="attached", timeout=15_000)
    page.unroute("**/v1/model")
    page.locator("#start-btn").click()
    page.wait_for_function("() => window.worldrtc.state === 'error'", timeout=10_000)
    state = hook(page)
    assert state["errorCode"] == "unknown_scene" and state["action"] == "scene", state
    overlay = page.locator("#overlay-text").inner_text()
    assert "atlantis" in overlay and not PYTHON_INTERNALS.search(overlay), overlay
    button = page.locator("#overlay-btn")
    assert button.is_visible() and button.inner_text() == "Pick a scene"  # not "Reconnect"
    assert page.locator("#message").inner_text() == ""  # said once, on the overlay
    button.click()
    page.wait_for_function("() => !document.querySelector(\".scene[data-name='atlantis']\")", timeout=10_000)
    assert page.evaluate("() => document.activeElement.matches('.scene input:checked')")

    # The only slot is taken: the page waits in line, says its place, and streams once the slot frees.
    with httpx.Client(base_url=server.url) as http:
        other = http.post("/v1/sessions", json={}).json()
        page.locator("#start-btn").click()
        page.wait_for_function("() => window.worldrtc.state === 'waiting'", timeout=10_000)
        page.wait_for_function("() => /You are next/.test(document.getElementById('overlay-text').textContent)")
        state = hook(page)
        assert state["queue"]["position"] == 1 and state["action"] is None and not button.is_visible()
        assert page.locator("#stop-btn").is_enabled()  # leaving the line is one click
        http.delete(f"/v1/sessions/{other['session_id']}")
    page.wait_for_function("() => window.worldrtc.state === 'streaming'", timeout=STREAM_TIMEOUT_MS)
    stop(page)
    no_page_errors(errors)


def test_a_phone_in_line_watches_the_world_and_the_driver_sees_its_turn_count_down(
    browser: Any, server: ServerProcess, errors: list[str]
) -> None:
    driver = open_page(browser, server, errors, viewport={"width": 1280, "height": 800})
    driver.locator("#start-btn").click()
    wait_streaming(driver)
    phone = open_page(browser, server, errors, viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    phone.locator("#start-btn").click()
    phone.wait_for_function("() => window.worldrtc.state === 'waiting'", timeout=10_000)
    # The world the driver walks plays under the overlay while the phone waits.
    phone.wait_for_function(
        "() => window.worldrtc.watchingWhileWaiting && document.querySelector('video').currentTime > 0.5",
        timeout=STREAM_TIMEOUT_MS,
    )
    overlay = phone.locator("#overlay-text")
    assert re.search(r"You are next", overlay.inner_text()) and overlay.is_visible()
    box = overlay.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    # The server's turns: 60 s, announced 60 s ahead, so the driver's countdown shows at once.
    driver.wait_for_function("() => window.worldrtc.turnEndsAt !== null", timeout=10_000)
    driver.wait_for_function("() => /ends in \\d+ s/.test(document.getElementById('hud-turn').textContent)")
    assert driver.locator("#hud-turn").is_visible()
    stop(driver)  # the driver leaves before its turn's end: the phone's turn comes
    phone.wait_for_function("() => window.worldrtc.state === 'streaming'", timeout=STREAM_TIMEOUT_MS)
    assert hook(phone)["queue"] is None and not hook(phone)["watchingWhileWaiting"]
    stop(phone)
    no_page_errors(errors)


FOCUS_RING = """() => {
  const el = document.activeElement;
  // Controls drawn by a proxy show the ring there: a scene's card, the upload button's label.
  const ring = el.closest('.scene') || (el.id === 'image-input' ? document.querySelector('.upload-btn') : el);
  const style = getComputedStyle(ring);
  const ringed = style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) >= 2;
  return {id: el.id || (el.name ? `${el.type}:${el.name}` : el.tagName.toLowerCase()), ring: ringed};
}"""

UNNAMED = """() => [...document.querySelectorAll('button, input, textarea, select, summary, [tabindex]')]
  .filter((el) => {
    const name = el.getAttribute('aria-label') || el.getAttribute('aria-labelledby') || el.title
      || (el.labels && el.labels.length && el.labels[0].textContent.trim()) || el.textContent.trim();
    return !name;
  }).map((el) => el.outerHTML.slice(0, 80))"""

HUD_FITS = """() => {
  const box = document.getElementById('video-box').getBoundingClientRect();
  const hud = document.getElementById('hud').getBoundingClientRect();
  const cut = [...document.querySelectorAll('#hud dt, #hud dd, #hud canvas')]
    .filter((el) => el.offsetParent !== null)
    .filter((el) => el.scrollWidth > el.clientWidth + 1 || el.getBoundingClientRect().right > box.right)
    .map((el) => el.id || el.textContent);
  return {inside: hud.bottom <= box.bottom && hud.right <= box.right, cut};
}"""


def test_keyboard_reaches_every_control_and_the_hud_reads_at_200_percent(
    browser: Any, server: ServerProcess, errors: list[str], tmp_path: Path
) -> None:
    # 200 % zoom of a 1280 × 800 window: half as many CSS pixels, each drawn twice as large.
    page = open_page(browser, server, errors, viewport={"width": 640, "height": 400}, device_scale_factor=2)
    assert page.evaluate(UNNAMED) == []
    reached: dict[str, bool] = {}
    for _ in range(25):
        page.keyboard.press("Tab")
        focus = page.evaluate(FOCUS_RING)
        if focus["id"] != "body":  # past the last control focus leaves the page, then comes round again
            reached[focus["id"]] = focus["ring"]
    wanted = ["video-box", "radio:scene", "image-input", "prompt", "seed", "summary", "start-btn", "timeline-btn"]
    assert all(w in reached for w in wanted), reached
    assert all(reached.values()), f"focused without a visible ring: {[k for k, v in reached.items() if not v]}"

    page.locator("#start-btn").focus()
    page.keyboard.press("Enter")
    wait_streaming(page)
    page.keyboard.press("t")  # focus is on the video now: T toggles the timeline
    assert page.locator("#timeline-btn").get_attribute("aria-pressed") == "true"
    page.wait_for_function("() => (window.worldrtc.timelineDrawn || {bars: 0}).bars >= 6", timeout=CHUNK_TIMEOUT_MS)
    drawn = hook(page)["timelineDrawn"]
    assert drawn["lanes"] == ["encode", "dit", "decode"], drawn
    label = page.locator("#hud-timeline").get_attribute("aria-label")
    assert "chunks" in label and "frames buffered" in label, label
    fits = page.evaluate(HUD_FITS)
    assert fits["inside"] and fits["cut"] == [], fits
    page.screenshot(path=str(tmp_path / "zoom-200.png"))
    stop(page)
    no_page_errors(errors)


def test_the_client_modules_are_served_as_javascript(server: ServerProcess) -> None:
    page = httpx.get(server.url + "/").text
    assert '<script type="module" src="/static/js/main.js">' in page
    assert WEB_MODULES, "no modules under web/js"
    for module in WEB_MODULES:
        path = f"/static/js/{module.name}"
        assert f'"{path}"' in page, f"index.html neither loads nor preloads {path}"
        response = httpx.get(server.url + path)
        assert response.status_code == 200, path
        assert re.match(r"(text|application)/javascript\b", response.headers["content-type"]), response.headers
        assert "innerHTML" not in response.text, path  # server strings go in as text


# A Temple Run model's vocabulary, plus a meaning for a key it does not accept (which must not show).
TEMPLERUN_ACCEPTS = {
    "keys": ["a", "d", "j", "l", "s", "w"],
    "look": False,
    "meanings": {
        "w": "jump",
        "s": "slide",
        "j": "turn left",
        "l": "turn right",
        "a": "left side",
        "d": "right side",
        "i": "look up",
    },
}


def key_help(page: Any) -> dict[str, Any]:
    lines = page.locator("#key-help li").all_inner_texts()
    caps = page.locator("#key-help .kbd").all_inner_texts()
    return {
        "lines": [" ".join(line.split()) for line in lines],
        "letters": {c for c in caps if c.isalpha()},
        "text": " ".join(page.locator(".help").inner_text().split()),  # visible text only
        "label": page.locator("#video-box").get_attribute("aria-label"),
    }


def test_the_controls_help_lists_what_the_model_accepts(browser: Any, server: ServerProcess, errors: list[str]) -> None:
    model = httpx.get(server.url + "/v1/model").json()
    accepts = model["accepts"]
    page = open_page(browser, server, errors, viewport={"width": 1280, "height": 800})
    shown = key_help(page)
    # One line per meaning, in the server's order, led by its key (then the arrow key aliasing it).
    assert [line.split(" or ")[0].split(":")[0] for line in shown["lines"]] == [k.upper() for k in accepts["meanings"]]
    assert [line.split(": ", 1)[1] for line in shown["lines"]] == list(accepts["meanings"].values())
    assert shown["letters"] == {k.upper() for k in accepts["keys"]}
    assert "W or \u2191: forward" in shown["lines"], shown  # the arrow keys alias W A S D
    assert accepts["look"] and "Mouse: click the video to look around" in shown["text"]
    assert "drag the video to look" in shown["text"]
    assert "arrow keys: move" not in shown["text"]  # the static fallback gave way
    assert "reset the camera pose" in shown["text"] and "the stage timeline" in shown["text"]
    assert "mouse" in shown["label"] and "forward" in shown["label"]

    def templerun(route: Any) -> None:
        response = route.fetch()
        body = response.json()
        body["accepts"] = TEMPLERUN_ACCEPTS
        route.fulfill(response=response, body=json.dumps(body))

    page.route("**/v1/model", templerun)
    page.reload()
    page.wait_for_function("() => (window.worldrtc.model || {}).accepts?.look === false", timeout=15_000)
    shown = key_help(page)
    assert shown["lines"][:2] == ["W or \u2191: jump", "S or \u2193: slide"], shown
    assert len(shown["lines"]) == 6 and shown["letters"] == {"A", "D", "J", "L", "S", "W"}  # no I: not accepted
    assert "Mouse" not in shown["text"] and "drag the video to look" not in shown["text"], shown["text"]
    assert "Touch: the stick walks, the buttons turn and reset" in shown["text"]
    assert "reset the camera pose" in shown["text"] and "the stage timeline" in shown["text"]
    assert "jump" in shown["label"] and "mouse" not in shown["label"] and "look up" not in shown["label"]
    page.context.close()
    no_page_errors(errors)


def test_the_session_downloads_as_video_and_recording(browser: Any, server: ServerProcess, errors: list[str]) -> None:
    page = open_page(browser, server, errors, accept_downloads=True)
    assert page.locator("#download-video-btn").is_disabled()  # nothing generated yet
    page.locator("#start-btn").click()
    wait_streaming(page)
    with page.expect_download() as got:
        page.locator("#download-recording-btn").click()
    record = json.loads(Path(got.value.path()).read_text())
    assert record["schema"] == "worldrtc.recording/1" and record["session_id"] == hook(page)["sessionId"]
    assert record["chunks"] and all(c["frames_sha256"] for c in record["chunks"])
    page.locator("#stop-btn").click()
    page.wait_for_function("() => window.worldrtc.state === 'closed'", timeout=5_000)
    # After the session, while it is listed: the video of every chunk it generated.
    with page.expect_download() as got:
        page.locator("#download-video-btn").click()
    assert got.value.suggested_filename.endswith(".mp4")
    assert Path(got.value.path()).read_bytes()[4:8] == b"ftyp"
    page.context.close()
    no_page_errors(errors)


# Everything a driver has that a spectator must not: the start form (scenes, prompt, seed, start and
# stop, downloads), the keys' help and the timeline, the touch controls and mouse look, sharing.
DRIVER_ONLY = [
    "#start-form",
    "#scenes",
    "#prompt",
    "#start-btn",
    "#stop-btn",
    "#download-video-btn",
    "#download-recording-btn",
    "#help",
    "#timeline-btn",
    "#touch-controls",
    "#look-btn",
    "#share",
    "#hud-latency",
    "#hud-predicted",
]


def open_spectator(browser: Any, link: str, errors: list[str], requests: list[str]) -> Any:
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("request", lambda r: requests.append(f"{r.method} {r.url}") if "/v1/" in r.url else None)
    page.goto(link)
    return page


def spectators_on_server(server: ServerProcess, session_id: str) -> int:
    return int(httpx.get(f"{server.url}/v1/sessions/{session_id}").json()["metrics"]["spectators"])


def wait_ended(page: Any, code: str) -> str:
    page.wait_for_function("(code) => (window.worldrtc.ended || {}).code === code", arg=code, timeout=10_000)
    return page.locator("#overlay-text").inner_text()


def test_a_spectator_link_shows_the_world_without_its_controls(
    browser: Any, server: ServerProcess, errors: list[str]
) -> None:
    clipboard = ["clipboard-read", "clipboard-write"]
    driver = open_page(browser, server, errors, viewport={"width": 1280, "height": 800}, permissions=clipboard)
    assert not driver.locator("#share").is_visible()  # nothing to share before a session
    driver.locator("#start-btn").click()
    wait_streaming(driver)
    session_id = hook(driver)["sessionId"]
    link = driver.locator("#share-link").input_value()
    assert link == hook(driver)["shareLink"] and link.startswith(server.url + "/#watch="), link
    assert "token=" in link.split("#", 1)[1]  # in the fragment: never sent to the server
    driver.locator("#share-copy-btn").click()
    driver.wait_for_function("() => /^Copied/.test(document.getElementById('share-note').textContent)", timeout=5_000)
    assert driver.evaluate("() => navigator.clipboard.readText()") == link

    requests: list[str] = []
    spectator = open_spectator(browser, link, errors, requests)
    wait_streaming(spectator)
    state = hook(spectator)
    assert state["role"] == "spectator" and state["sessionId"] is None, state  # it created nothing
    shown = [sel for sel in DRIVER_ONLY if spectator.locator(sel).is_visible()]
    assert shown == [], f"a spectator sees the driver's {shown}"
    assert "Spectator's view" in spectator.locator("#watch-badge").inner_text()
    assert spectator.locator("#leave-btn").is_visible()
    assert spectator.locator("#video").evaluate("v => v.videoWidth > 0 && !v.paused")
    spectator.wait_for_function("() => document.getElementById('hud-spectators').textContent === '1'", timeout=5_000)
    assert float(spectator.locator("#hud-fps").inner_text()) > 0
    driver.wait_for_function("() => /^1 spectator/.test(document.getElementById('share-count').textContent)")
    assert spectators_on_server(server, session_id) == 1

    # The driver's keys show in the spectator's HUD; the spectator's own keys send nothing.
    driver.locator("#video-box").focus()
    driver.keyboard.down("w")
    spectator.wait_for_function(
        "() => document.getElementById('hud-keys').textContent === 'W'", timeout=CHUNK_TIMEOUT_MS
    )
    driver.keyboard.up("w")
    spectator.locator("#video-box").focus()
    spectator.keyboard.press("d")
    assert hook(spectator)["lastSeq"] == {}

    # Leave ends the watch on the server (DELETE), and the link still opens it again.
    spectator.locator("#leave-btn").click()
    wait_ended(spectator, "left")
    assert hook(spectator)["state"] == "closed" and spectator.locator("#overlay-btn").inner_text() == "Watch again"
    driver.wait_for_function("() => /^Nobody/.test(document.getElementById('share-count').textContent)")
    assert spectators_on_server(server, session_id) == 0
    spectator.locator("#overlay-btn").click()
    spectator.wait_for_function("() => window.worldrtc.state === 'streaming'", timeout=STREAM_TIMEOUT_MS)

    # A new link ends the old one's watch, and the old link is refused in the server's words.
    driver.locator("#share-new-btn").click()
    assert wait_ended(spectator, "revoked") == "The driver stopped sharing."
    assert not spectator.locator("#overlay-btn").is_visible()  # watching again cannot help
    # The old watch can end before the driver's page has read the new link from its response.
    driver.wait_for_function("old => document.getElementById('share-link').value !== old", arg=link, timeout=5_000)
    new_link = driver.locator("#share-link").input_value()
    assert new_link != link and new_link == hook(driver)["shareLink"]
    spectator.reload()
    spectator.wait_for_function("() => window.worldrtc.state === 'error'", timeout=10_000)
    assert hook(spectator)["errorCode"] == "forbidden"
    assert "revoked" in spectator.locator("#overlay-text").inner_text()

    # With the new link: watching until the driver stops, which ends the world for its spectators.
    spectator.context.close()
    spectator = open_spectator(browser, new_link, errors, requests)
    wait_streaming(spectator)
    stop(driver)
    assert wait_ended(spectator, "driver_left") == "The driver left; the world has ended."
    assert not spectator.locator("#leave-btn").is_enabled()
    spectator.context.close()
    # A spectator asks for ICE servers and watches; it creates no session and reads no model.
    paths = {" ".join([r.split()[0], "/" + r.split("/", 3)[3].split("?")[0]]) for r in requests}
    watch = f"/v1/sessions/{session_id}/watch"
    left = {p for p in paths if p.startswith(f"DELETE {watch}/")}  # Leave
    assert len(left) == 1 and paths - left == {"GET /v1/ice-servers", f"POST {watch}"}, paths
    no_page_errors(errors)


SNAPSHOT_TIMEOUT_MS = 15_000  # a snapshot is taken at the next chunk boundary: a few seconds at most
MESSAGE_IS_ERROR = "document.getElementById('message').classList.contains('error')"
SAVE_LABELS = """() => {
  const b = document.getElementById('save-btn');
  window.saveLabels = [];
  new MutationObserver(() => window.saveLabels.push([b.textContent, b.disabled]))
    .observe(b, {attributes: true, childList: true, characterData: true, subtree: true});
}"""
THUMBNAIL_PIXELS = """(i) => {
  const c = document.querySelectorAll('#snap-strip .snap canvas')[i];
  const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let lit = 0;
  for (let p = 0; p < data.length; p += 4) if (data[p] + data[p + 1] + data[p + 2] > 48) lit += 1;
  return {width: c.width, height: c.height, lit};
}"""


def save_snapshot(page: Any, count: int) -> dict:
    """Press P on the video and wait for the strip's `count`th thumbnail: that snapshot, as the hook has it."""
    page.locator("#video-box").focus()
    page.keyboard.press("p")
    page.wait_for_function(
        f"(n) => window.worldrtc.snapshots.length >= n || {MESSAGE_IS_ERROR}",
        arg=count,
        timeout=SNAPSHOT_TIMEOUT_MS,
    )
    snaps = hook(page)["snapshots"]
    assert len(snaps) == count, page.locator("#message").inner_text()
    assert page.locator("#snap-strip .snap").count() == count
    return snaps[-1]


def thumbnail(page: Any, i: int, action: str) -> None:
    """Open the `i`th thumbnail's actions and press `action` (branch, rewind)."""
    snap = page.locator("#snap-strip .snap").nth(i)
    snap.locator(".snap-pick").click()
    assert snap.locator(".snap-pick").get_attribute("aria-expanded") == "true"
    snap.locator(f".snap-{action}").click()


def parent_of(snap: dict) -> dict:
    """The parent a session that goes on from `snap` names (ready, rewound, the HUD)."""
    return {k: snap[k] for k in ("snapshot_id", "session_id", "chunk_index")}


def parent_row(page: Any) -> str:
    return " ".join(page.locator("#hud-parent-row").inner_text().split())


def frames_go_on(page: Any, frames: int = 8) -> None:
    """More frames are shown, and the session still streams."""
    start = hook(page)["stats"]["framesDisplayed"]
    page.wait_for_function(
        "(n) => window.worldrtc.state === 'error' || window.worldrtc.stats.framesDisplayed >= n",
        arg=start + frames,
        timeout=STREAM_TIMEOUT_MS,
    )
    state = hook(page)
    assert state["state"] == "streaming", state["error"]
    assert page.locator("#video").evaluate("v => v.videoWidth > 0 && !v.paused")


def wait_rewound(page: Any, snap: dict) -> dict:
    page.wait_for_function(
        f"(id) => (window.worldrtc.rewound || {{}}).snapshot_id === id || window.worldrtc.state === 'error'"
        f" || {MESSAGE_IS_ERROR}",
        arg=snap["snapshot_id"],
        timeout=SNAPSHOT_TIMEOUT_MS,
    )
    state = hook(page)
    assert state["rewound"] is not None, page.locator("#message").inner_text() or state["error"]
    return state


def test_snapshots_branch_a_new_session_and_rewind_the_live_one(
    browser: Any, server: ServerProcess, errors: list[str]
) -> None:
    page = open_page(browser, server, errors, viewport={"width": 1280, "height": 800})
    assert page.locator("#save-btn").is_disabled() and not page.locator("#snapshots").is_visible()
    page.locator("#start-btn").click()
    wait_streaming(page)
    first = hook(page)["sessionId"]
    assert not page.locator("#hud-parent-row").is_visible()  # a world of its own
    assert page.locator("#save-btn").is_enabled()

    # Save with P: the button says so while the server copies the state, and P steers nothing.
    page.evaluate(SAVE_LABELS)
    snap = save_snapshot(page, 1)
    assert snap["session_id"] == first and snap["chunk_index"] >= 1, snap
    assert ["Saving\u2026", True] in page.evaluate("() => window.saveLabels")
    assert page.locator("#save-btn").inner_text() == "Save" and page.locator("#save-btn").is_enabled()
    assert "control" not in hook(page)["lastSeq"]  # no camera key was pressed
    label = page.locator("#snap-strip .snap-label").first.inner_text()
    assert re.fullmatch(rf"chunk {snap['chunk_index']} \u00b7 [\d.]+ (B|kB|MB|GB)", label), label
    picture = page.evaluate(THUMBNAIL_PIXELS, 0)
    assert picture["width"] == 96 and 0 < picture["height"] <= 96, picture  # 96 px wide, the video's aspect
    assert picture["lit"] > 0, "the thumbnail has no picture of the world in it"
    assert page.locator("#snapshots").is_visible()

    # Branch: a new session from the snapshot, in place of this one; the HUD names where it came from.
    thumbnail(page, 0, "branch")
    page.wait_for_function(
        "(old) => window.worldrtc.state === 'error' || (window.worldrtc.sessionId || old) !== old",
        arg=first,
        timeout=STREAM_TIMEOUT_MS,
    )
    wait_streaming(page)
    state = hook(page)
    branch = state["sessionId"]
    assert branch != first and state["parent"] == parent_of(snap), state["parent"]
    assert page.locator("#hud-parent-row").is_visible()
    assert parent_row(page) == f"branch of {first[:6]} @ chunk {snap['chunk_index']}"
    assert page.locator("#snap-strip .snap").count() == 1  # the strip outlives the session it was saved in
    frames_go_on(page)

    # A snapshot of the branch, then Rewind to it: the same session, the same connection, plays on.
    mine = save_snapshot(page, 2)
    assert mine["session_id"] == branch, mine
    thumbnail(page, 1, "rewind")
    state = wait_rewound(page, mine)
    assert state["sessionId"] == branch and state["state"] == "streaming"
    assert state["rewound"] == parent_of(mine) and state["parent"] == parent_of(mine)
    assert f"Rewound to chunk {mine['chunk_index']}" in page.locator("#message").inner_text()
    assert parent_row(page) == f"rewound to chunk {mine['chunk_index']}"
    frames_go_on(page)

    # Rewind to the first session's snapshot: the same line, so the branch may go back to it too.
    thumbnail(page, 0, "rewind")
    state = wait_rewound(page, snap)
    assert state["sessionId"] == branch and state["rewound"] == parent_of(snap)
    assert parent_row(page) == f"branch of {first[:6]} @ chunk {snap['chunk_index']}"
    frames_go_on(page)

    # × forgets one; the other stays.
    page.locator("#snap-strip .snap").nth(0).locator(".snap-delete").click()
    page.wait_for_function("() => window.worldrtc.snapshots.length === 1", timeout=5_000)
    assert hook(page)["snapshots"][0]["snapshot_id"] == mine["snapshot_id"]
    assert not page.locator("#message").evaluate("m => m.classList.contains('error')")
    stop(page, close=False)

    # A reload keeps the strip: the page remembers its lines' tokens and lists their snapshots.
    page.reload()
    page.wait_for_function("() => window.worldrtc.snapshots.length === 1", timeout=10_000)
    assert hook(page)["snapshots"][0]["snapshot_id"] == mine["snapshot_id"]
    assert page.locator("#snapshots").is_visible()
    page.context.close()
    no_page_errors(errors)


def test_a_server_without_snapshots_says_so_and_streams_on(
    browser: Any, server: ServerProcess, errors: list[str]
) -> None:
    page = open_page(browser, server, errors, viewport={"width": 1280, "height": 800})
    # An older server has no snapshot routes: FastAPI's own 404.
    page.route(
        "**/snapshots",
        lambda route: route.fulfill(status=404, json={"error": "not_found", "message": "Not Found"}),
    )
    page.locator("#start-btn").click()
    wait_streaming(page)
    page.locator("#save-btn").click()
    page.wait_for_function(f"() => {MESSAGE_IS_ERROR}", timeout=5_000)
    assert page.locator("#message").inner_text() == "This server does not save snapshots."
    assert page.locator("#save-btn").is_enabled() and page.locator("#save-btn").inner_text() == "Save"
    assert not page.locator("#snapshots").is_visible() and hook(page)["snapshots"] == []
    frames_go_on(page)
    stop(page)
    no_page_errors(errors)


def test_a_prompt_typed_while_walking_takes_effect_and_says_when(
    browser: Any, server: ServerProcess, errors: list[str]
) -> None:
    page = open_page(browser, server, errors)
    page.locator("#start-btn").click()
    wait_streaming(page)
    box = page.locator("#live-prompt")
    assert page.locator("#live-prompt-form").is_visible() and box.is_enabled()
    box.fill("it starts to snow")
    page.locator("#live-transition").select_option("3")
    box.press("Enter")
    # The chunks' receipts: the transition's steps, then the prompt whole; the HUD says both.
    page.wait_for_function(
        "() => { const c = window.worldrtc.stats.lastChunk; return c && c.prompt && c.prompt.text === "
        "'it starts to snow' && c.prompt.weight === undefined && window.worldrtc.stats.promptMs !== null; }",
        timeout=STREAM_TIMEOUT_MS,
    )
    state = hook(page)
    assert state["promptSent"] == {
        "text": "it starts to snow",
        "transitionChunks": 3,
        "seq": state["lastSeq"]["prompt"],
    }
    assert 0 < state["stats"]["promptMs"] < STREAM_TIMEOUT_MS
    # The HUD redraws on its own clock: wait for it to show the whole prompt.
    page.wait_for_function("() => document.getElementById('hud-prompt').textContent === 'it starts to snow'")
    assert page.locator("#hud-prompt-latency").text_content().endswith(" ms")
    # Typing in the box steers nothing: the keys W and D went into the text, not to the world.
    controls_before = hook(page)["lastSeq"].get("control")
    box.fill("")
    box.type("wd")
    assert hook(page)["lastSeq"].get("control") == controls_before and box.input_value() == "wd"
    stop(page)
    no_page_errors(errors)


def test_the_events_a_model_learned_are_chips_that_send_their_prompt(
    browser: Any, server: ServerProcess, errors: list[str]
) -> None:
    # The synthetic model learned no events; a stand-in /v1/model answer (the server's own, with the
    # embedded world's card `events` added) gives the page some, so the chips meet the real server.
    events = [{"name": "night", "prompt": "night falls"}, {"name": "day", "prompt": ""}]

    def with_events(route: Any) -> None:
        answer = route.fetch()
        route.fulfill(response=answer, json=answer.json() | {"events": events})

    page = browser.new_context().new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.route("**/v1/model", with_events)
    page.goto(server.url + "/")
    page.locator(".scene[data-kind='scene'] input:checked").wait_for(state="attached", timeout=15_000)
    chips = page.locator("#event-chips .chip")
    assert chips.all_text_contents() == ["night", "day"]
    page.locator("#start-btn").click()
    wait_streaming(page)
    assert chips.nth(0).is_enabled()
    chips.nth(0).click()
    page.wait_for_function(
        "() => { const c = window.worldrtc.stats.lastChunk; return c && c.prompt && c.prompt.text === 'night falls'; }",
        timeout=STREAM_TIMEOUT_MS,
    )
    assert hook(page)["promptSent"]["text"] == page.locator("#live-prompt").input_value() == "night falls"
    chips.nth(1).click()  # the day: no prompt
    page.wait_for_function(
        "() => { const c = window.worldrtc.stats.lastChunk; return c && c.prompt && c.prompt.text === ''; }",
        timeout=STREAM_TIMEOUT_MS,
    )
    stop(page)
    no_page_errors(errors)
