"""Row 31: prompts as a weapon. A driver floods the data channel with prompts and sends ones that
are too long, binary or not Unicode; each gets an `error` and nothing else moves.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from benchmarks.reliability.cases_spectators import DELIVERY_BOUND, STALL_BOUND_S, _delivery
from benchmarks.reliability.harness import CaseResult, Lab, ServerConfig, at_least, at_most, case, equal, holds
from server.wire.protocol import MAX_CONTROL_MESSAGE_BYTES, MAX_PROMPT_CHARS
from worldrtc import Session

FLOOD = 300  # prompts sent back to back: past the control rate (120/s) and the prompt rate (60/s)
WAIT_S = 30.0
# Each refused kind, as sent, and the error code it must get.
BAD_PROMPTS: dict[str, tuple[str | bytes, str]] = {
    "text over the prompt limit": (json.dumps({"type": "prompt", "text": "x" * (MAX_PROMPT_CHARS + 1)}), "bad_message"),
    "message over the 4 KiB limit": (
        json.dumps({"type": "prompt", "text": "x" * MAX_CONTROL_MESSAGE_BYTES}),
        "message_too_large",
    ),
    "a lone surrogate (\\ud800)": ('{"type": "prompt", "text": "snow \\ud800"}', "bad_message"),
    "binary, not UTF-8": (b'{"type": "prompt", "text": "\xff\xfe"}', "bad_message"),
    "transition_chunks 0": ('{"type": "prompt", "text": "fog", "transition_chunks": 0}', "bad_message"),
}


async def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {WAIT_S:g} s")
        await asyncio.sleep(0.05)


def _texts(session: Session) -> list[str]:
    return [c["prompt"]["text"] for c in sorted(session.run.chunks, key=lambda c: c["index"]) if c.get("prompt")]


@case(
    31,
    "prompt abuse",
    f"a driver sends {FLOOD} prompts back to back, then prompts that are too long (text, message), a lone "
    "surrogate, binary bytes and a transition of 0 chunks",
    f"the flood answered at most once a second per limit, the latest accepted prompt read; each bad one its "
    f"`error`, none read by the DiT; the session streams on (≥ {DELIVERY_BOUND} of target, no wait over "
    f"{STALL_BOUND_S:g} s), keys still steer, no unhandled exception",
)
def prompt_abuse(lab: Lab, r: CaseResult) -> None:
    server = lab.server(ServerConfig().with_env(create_burst=1000))

    async def run() -> dict[str, Any]:
        driver = await Session(server.url, prompt="day").start()
        assert driver.channel is not None
        await _wait(lambda: len(driver.run.chunks) >= 2, "two chunks")
        t0 = time.perf_counter()
        for i in range(FLOOD):
            driver.prompt(f"night {i}")
        flood_s = time.perf_counter() - t0
        await asyncio.sleep(1.1)  # past the rate notices' second, so each bad prompt gets its own answer
        errors_before_bad = len(driver.run.errors)
        for payload, _ in BAD_PROMPTS.values():
            driver.channel.send(payload)
            await asyncio.sleep(0.05)
        await _wait(lambda: len(driver.run.errors) >= errors_before_bad + len(BAD_PROMPTS), "answers to the bad ones")
        seq = driver.press("w")
        await _wait(lambda: any((c.get("applied_seq") or 0) >= seq for c in driver.run.chunks), "the key applied")
        await asyncio.sleep(lab.pick(2.0, 5.0))
        t1 = time.perf_counter()
        flood_codes = [e["code"] for e in driver.run.errors[:errors_before_bad]]
        result = {
            "flood_s": flood_s,
            "flood_answers": {code: flood_codes.count(code) for code in set(flood_codes)},
            "bad_answers": [e["code"] for e in driver.run.errors[errors_before_bad:]],
            "texts_read": sorted(set(_texts(driver))),
            "last_read": _texts(driver)[-1],
            "delivery": _delivery(driver, t0, t1),
            "done": driver.run.done,
        }
        await driver.close()
        return result

    f = asyncio.run(run())
    unhandled = server.unhandled()
    r.figures = f
    nights = [t for t in f["texts_read"] if t.startswith("night ")]
    d = f["delivery"]
    seconds = int(f["flood_s"]) + 1
    r.checks = [
        equal("flood answers' codes", sorted(f["flood_answers"]), ["prompt_rate_limited", "rate_limited"]),
        at_most("  … each at most once a second", max(f["flood_answers"].values()), seconds),
        holds("the last prompt read is one of the flood's", f["last_read"] in nights, f["last_read"]),
        equal("bad prompts' answers", f["bad_answers"], [code for _, code in BAD_PROMPTS.values()]),
        equal("prompts read other than day and the flood's", [t for t in f["texts_read"] if t not in nights], ["day"]),
        at_least("the driver's new frames / target from the flood on", d["unique_fps_over_target"], DELIVERY_BOUND),
        at_most("  … its longest wait for a new frame", d["max_wait_s"], STALL_BOUND_S, " s"),
        equal("the session's end during the row", f["done"], None),
        equal("unhandled exceptions in the server log", len(unhandled), 0),
    ]
