"""Debian's Chromium driven by Playwright, as the page tests use it (tests/web).

No WebRTC flags: Chromium hides its host addresses behind mDNS names, as a user's browser does. The
flags keep a headless browser from reaching for the network (refused here) and from sandboxing as root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]
CHUNK_TIMEOUT_MS = 20_000


def require_browser() -> Any:
    """The playwright.sync_api module; skips the calling test module (with the reason) without one."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (install Debian's `chromium` package)", allow_module_level=True)
    return pytest.importorskip("playwright.sync_api", reason="the `playwright` Python package is not installed")


def hook(page: Any) -> dict:
    """The page's test hook (window.worldrtc), as plain data."""
    return page.evaluate("() => JSON.parse(JSON.stringify(window.worldrtc))")


def wait_for_chunk(page: Any, keys: list[str], min_seq: int = 0, exact: bool = False) -> dict:
    """Wait for a chunk that applied a control with seq >= `min_seq` and holds `keys` (exactly those
    with `exact`); fail early if the session errors."""
    cond = (
        "([keys, minSeq, exact]) => { const w = window.worldrtc; if (w.state === 'error') return true;"
        " const c = w.stats.lastChunk; if (!c || (c.applied_seq ?? -1) < minSeq) return false;"
        " const got = c.applied_keys || [];"
        " return keys.every((k) => got.includes(k)) && (!exact || got.length === keys.length); }"
    )
    page.wait_for_function(cond, arg=[keys, min_seq, exact], timeout=CHUNK_TIMEOUT_MS)
    state = hook(page)
    assert state["state"] == "streaming", f"session failed while waiting for keys {keys}: {state['error']}"
    return state["stats"]["lastChunk"]
