"""Rows 4-5: malformed offers and data-channel messages, thousands of them (benchmarks/reliability/fuzz.py).

4 SDP fuzz            mutated real offers through REST and WHEP (non-UTF-8 ones through WHEP)
5 data-channel fuzz   invalid messages by construction; then 1 MiB messages from a peer that
                      ignores the server's advertised max-message-size
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import Any

import httpx

from benchmarks.reliability.fuzz import control_messages, regressions, sdp_offers
from benchmarks.reliability.harness import (
    CaseResult,
    Lab,
    ServerConfig,
    at_least,
    at_most,
    below,
    case,
    equal,
    holds,
    wait_for,
)
from benchmarks.stats import summarize
from server.peers.sctp import MAX_MESSAGE_BYTES
from worldrtc import Session

SETTLE_S = 10.0  # for peer connections of answered offers to be closed after their DELETE


@case(
    4,
    "SDP fuzz",
    "mutated real offers (Chromium, aiortc): oversize, no fingerprint/ufrag, non-UTF-8, …",
    "0 × 5xx; 0 leaked peer connections; handler p99 < 50 ms",
)
def sdp_fuzz(lab: Lab, r: CaseResult) -> None:
    n = lab.pick(300, 5000)
    server = lab.server(ServerConfig().with_env(create_burst=1_000_000))
    base = server.resources()
    statuses: Counter[int] = Counter()
    by_mutation: dict[str, Counter[int]] = {}
    handler_s: list[float] = []
    http = server.http
    sdp_limit = int(http.get("/v1/model").json()["limits"]["sdp_max_bytes"])
    resets: list[tuple[str, int]] = []  # a body refused (413) while it was still being sent
    for i, offer in enumerate(sdp_offers(seed=lab.pick(1, 2), n=n, max_bytes=sdp_limit)):
        whep = not offer.utf8 or i % 2 == 1
        try:
            if whep:
                t0 = time.perf_counter()
                resp = http.post("/v1/whep", content=offer.body, headers={"content-type": "application/sdp"})
                handler_s.append(time.perf_counter() - t0)
                if resp.status_code == 201:
                    http.delete(resp.headers["location"])
            else:
                created = http.post("/v1/sessions", json={}).json()
                auth = {"authorization": f"Bearer {created['token']}"}
                body = {"sdp": offer.body.decode(), "type": "offer"}
                try:
                    t0 = time.perf_counter()
                    resp = http.post(f"/v1/sessions/{created['session_id']}/offer", json=body, headers=auth)
                    handler_s.append(time.perf_counter() - t0)
                finally:
                    http.delete(f"/v1/sessions/{created['session_id']}", headers=auth)
        except httpx.TransportError:
            resets.append((offer.mutation, len(offer.body)))
            continue
        statuses[resp.status_code] += 1
        by_mutation.setdefault(offer.mutation.split("+")[0], Counter())[resp.status_code] += 1
    settled = wait_for(lambda: server.resources().peer_connections == 0, SETTLE_S, 0.1)
    after = server.resources()
    timing = summarize(handler_s)
    unexplained = [x for x in resets if x[1] <= sdp_limit]
    r.figures = {
        "offers": n,
        "statuses": dict(statuses),
        "by_first_mutation": {k: dict(v) for k, v in sorted(by_mutation.items())},
        "handler_s": timing,
        "reset_while_sending": resets,
        "resources_delta": after.delta(base),
    }
    r.checks = [
        equal("5xx answers", sum(c for s, c in statuses.items() if s >= 500), 0),
        equal("connections reset, but for oversize bodies refused mid-send", unexplained, []),
        at_least("offers answered (2xx) among them", sum(c for s, c in statuses.items() if s < 300), 1),
        holds("peer connections back to 0", settled is not None, after.peer_connections),
        at_most("UDP sockets left", after.udp_sockets - base.udp_sockets, 0),
        below("offer handler p99", timing["p99"], 0.05, " s"),
        equal("readyz", http.get("/readyz").status_code, 200),
        equal("unhandled exceptions in the log", len(server.unhandled()), 0),
    ]


async def _fuzz_channel(url: str, n: int, seed: int, oversize_bytes: int, per_session: int) -> dict[str, Any]:
    """Send n invalid messages, `per_session` (the server's abuse limit) to a session, which the
    server must then close; a new session takes the next ones."""
    sent = sessions = 0
    done_codes: Counter[str] = Counter()
    error_codes: Counter[str] = Counter()
    applied: list[Any] = []
    counts: list[int] = []
    gaps = regressions()
    messages = itertools.chain(gaps, control_messages(seed, n - len(gaps), oversize_bytes=oversize_bytes))
    pending = next(messages, None)
    while pending is not None:
        s = await Session(url).start()
        sessions += 1
        assert s.channel is not None
        count = 0
        while pending is not None and count < per_session and s.run.done is None and s.channel.readyState == "open":
            s.channel.send(pending.payload)
            sent, count = sent + 1, count + 1
            pending = next(messages, None)
            await asyncio.sleep(0.002)  # under the session's message rate: every message is parsed
        t0 = time.monotonic()
        while s.run.done is None and time.monotonic() - t0 < 3:
            await asyncio.sleep(0.02)  # the answers and, if it came, the close
        counts.append(count)
        done_codes[(s.run.done or {}).get("code", "open")] += 1
        error_codes.update(e["code"] for e in s.run.errors)
        applied += [(c.get("applied_seq"), tuple(c.get("applied_keys", ()))) for c in s.run.chunks]
        await s.close()
    return {
        "sent": sent,
        "sessions": sessions,
        "per_session": counts,
        "done_codes": dict(done_codes),
        "error_codes": dict(error_codes),
        "applied": sorted(set(applied)),
    }


async def _oversize(url: str, count: int) -> dict[str, Any]:
    """1 MiB messages from a peer that ignores the advertised max-message-size."""
    ends: Counter[str] = Counter()
    for _ in range(count):
        s = await Session(url).start()
        assert s.channel is not None and s.pc.sctp is not None
        s.pc.sctp._remote_max_message_size = 0  # a hostile peer: send whatever size it likes
        s.channel.send('{"type":"ping","pad":"' + "x" * (1024 * 1024) + '"}')
        t0 = time.monotonic()
        while s.channel.readyState == "open" and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.05)
        ends[s.channel.readyState] += 1
        await s.close()
    return {"channel_states": dict(ends)}


@case(
    5,
    "data-channel fuzz",
    "invalid messages (bad JSON, wrong types, NaN/inf, unknown types, oversize, binary, deep nesting); "
    "then 1 MiB messages past the advertised limit",
    "never reaches a worker; counted; repeated abuse closes the session with a reason; 0 crashes",
)
def channel_fuzz(lab: Lab, r: CaseResult) -> None:
    n = lab.pick(600, 10_000)
    abuse_limit = 200
    config = ServerConfig().with_env(create_burst=1_000_000, control_rate_per_s=1000, abuse_limit=abuse_limit)
    server = lab.server(config)
    invalid0 = server.metric("worldrtc_control_messages_total", result="invalid")
    accepted0 = server.metric("worldrtc_control_messages_total", result="accepted")
    base = server.resources()
    # Oversize here means over the 4 KiB control limit and within what the server's SCTP accepts.
    fuzz = asyncio.run(
        _fuzz_channel(server.url, n, lab.pick(3, 4), oversize_bytes=MAX_MESSAGE_BYTES // 2, per_session=abuse_limit)
    )
    full = sum(c == abuse_limit for c in fuzz["per_session"])
    abused = fuzz["done_codes"].get("protocol_abuse", 0)
    answers = sum(c for code, c in fuzz["error_codes"].items() if code != "session_failed")
    invalid = server.metric("worldrtc_control_messages_total", result="invalid") - invalid0
    accepted = server.metric("worldrtc_control_messages_total", result="accepted") - accepted0
    rss_before_oversize = server.resources().rss_bytes
    big = asyncio.run(_oversize(server.url, lab.pick(2, 5)))
    settled = wait_for(lambda: server.resources().peer_connections == 0, SETTLE_S, 0.1)
    after = server.resources()
    unhandled = server.unhandled()
    r.figures = {
        "fuzz": fuzz,
        "server_counted_invalid": invalid,
        "server_counted_accepted": accepted,
        "abuse_limit": abuse_limit,
        "oversize": big,
        "rss_delta_oversize_bytes": after.rss_bytes - rss_before_oversize,
        "resources_delta": after.delta(base),
    }
    r.checks = [
        equal("messages sent", fuzz["sent"], n),
        equal("counted invalid by the server", invalid, n),
        equal("accepted by the server", accepted, 0),
        equal("controls applied to any chunk", [a for a in fuzz["applied"] if a != (None, ())], []),
        equal(f"sessions sent {abuse_limit} (the abuse limit) closed as protocol_abuse", abused, full),
        equal("error answers (besides each close's session_failed)", answers, n),
        equal("1 MiB messages: channels closed by the server", big["channel_states"].get("closed", 0), lab.pick(2, 5)),
        below("RSS growth over the 1 MiB messages", (after.rss_bytes - rss_before_oversize) / 1e6, 20.0, " MB"),
        holds("peer connections back to 0", settled is not None, after.peer_connections),
        equal("readyz", server.http.get("/readyz").status_code, 200),
        equal("unhandled exceptions in the log", len(unhandled), 0),
    ]
