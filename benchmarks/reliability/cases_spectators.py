"""Rows 24-26: spectators, who watch a session over its WHEP endpoint with its watch token.

24 watch-token abuse     no token, wrong, the driver's, another session's, revoked, after the session
                         ended; a spectator's resource deleted twice; the driver streaming throughout
25 spectator SIGKILL     a spectator in its own process killed while a second one and the driver watch
26 spectators at once    the per-session maximum (16) joins at once from 2 processes, the 17th refused
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
from aiortc import RTCPeerConnection

from benchmarks.reliability.harness import (
    CaseResult,
    Lab,
    PeerProcess,
    Resources,
    ServerConfig,
    ServerUnderTest,
    at_least,
    at_most,
    case,
    equal,
    holds,
    leak_checks,
    percentile,
    wait_for,
)
from benchmarks.stats import summarize
from server.common.settings import Settings
from worldrtc import Session

FPS = 16
# A closed session stays listed (with a task that forgets it) for closed_session_keep_s: 3 s here,
# long enough to be refused as `ended`, short enough that what is left after it is a leak.
KEEP_S = 3.0
SPECTATE = ServerConfig().with_env(create_burst=1000, closed_session_keep_s=KEEP_S)
REFUSED = "worldrtc_watch_refused_total"
REASONS = ("missing", "wrong", "driver_token", "other_session", "revoked", "ended", "full", "node_full")
STALL_BOUND_S = 1.0  # the longest wait for a new frame a driver or spectator may see
DELIVERY_BOUND = 0.8  # new frames received / the target's, over a row's window (a loaded 2-core box)
SETTLE_S = 10.0  # for closed connections' tasks to finish after the last leaves
POLL_S = 0.05


# ---------------------------------------------------------------- what the rows share


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def _offer() -> str:
    """A real spectator's SDP offer (video receive-only, a data channel), for the raw requests."""
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("watch")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = str(pc.localDescription.sdp)
    await pc.close()
    return sdp


def _refusals(server: ServerUnderTest) -> dict[str, float]:
    samples = server.metrics()
    return {reason: samples.get((REFUSED, (("reason", reason),)), 0.0) for reason in REASONS}


def _counted(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {k: int(after[k] - before[k]) for k in REASONS if after[k] != before[k]}


def _watching(server: ServerUnderTest, session_id: str) -> tuple[int, int]:
    """(spectators watching now, spectators ever admitted) from the session's record."""
    m = server.http.get(f"/v1/sessions/{session_id}").json()["metrics"]
    return int(m["spectators"]), int(m["spectators_joined"])


def _delivery(session: Session, t0: float, t1: float) -> dict[str, Any]:
    """New frames (by their stamped number) received between t0 and t1: their rate against the
    target, and the longest wait for one (counting from t0 and up to t1)."""
    seen: set[int] = set()
    arrivals = [t0]
    for f in session.run.frames:
        if f.stamp is not None and f.stamp not in seen:
            seen.add(f.stamp)
            if t0 <= f.t <= t1:
                arrivals.append(f.t)
    arrivals.append(t1)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    new = len(arrivals) - 2
    return {
        "seconds": round(t1 - t0, 2),
        "new_frames": new,
        "unique_fps_over_target": new / max(t1 - t0, 1e-9) / FPS,
        "max_wait_s": max(gaps),
    }


async def _settled(
    server: ServerUnderTest, base: Resources, spectators_done: Callable[[], bool]
) -> tuple[float | None, Resources]:
    """Seconds until `spectators_done()` and the server's connections, tasks, sockets and threads are
    back to `base`, and the resources then (or at the timeout)."""
    seen: list[Resources] = []

    def back() -> bool:
        res = server.resources()
        seen.append(res)
        return spectators_done() and res.back_to(base)

    took = await asyncio.to_thread(wait_for, back, SETTLE_S, 0.2)
    return took, seen[-1]


# ---------------------------------------------------------------- 24


# (what is tried, the status, the error code, the reason it is counted under)
EXPECTED: dict[str, tuple[int, str, str | None]] = {
    "no token": (401, "unauthorized", "missing"),
    "a wrong token": (401, "unauthorized", "wrong"),
    "a wrong token, no such session": (401, "unauthorized", "wrong"),
    "the driver's token": (403, "forbidden", "driver_token"),
    "another session's watch token": (403, "forbidden", "other_session"),
    "the revoked watch token": (403, "forbidden", "revoked"),
    "a spectator's resource deleted twice": (404, "not_found", None),
    "the watch token after the session's DELETE": (409, "session_closed", "ended"),
}


@case(
    24,
    "watch-token abuse",
    "against one live session: no token, a wrong one (also for a session that does not exist), the "
    "driver's token, another session's watch token, a revoked one (with a spectator watching on it), "
    "one after the driver's DELETE; a spectator's resource deleted twice",
    "each refused with its status and a JSON error, counted once under its reason; the revoked token's "
    "spectator ends `revoked`; the driver streams on throughout; peer connections and tasks back",
)
def watch_abuse(lab: Lab, r: CaseResult) -> None:
    server = lab.server(SPECTATE)

    async def run() -> dict[str, Any]:
        base = await asyncio.to_thread(server.resources)
        offer = await _offer()
        driver = await Session(server.url).start()
        await asyncio.wait_for(driver.next_frame(), 60)
        t0 = time.perf_counter()
        assert driver.info is not None
        sid, token = driver.info["session_id"], driver.info["token"]
        watch_path = f"/v1/sessions/{sid}/watch"
        other = (await asyncio.to_thread(server.http.post, "/v1/sessions", json={})).json()
        got: dict[str, dict[str, Any]] = {}
        http = httpx.AsyncClient(base_url=server.url, timeout=30)

        async def attempt(what: str, method: str, path: str, credential: str | None) -> None:
            before = await asyncio.to_thread(_refusals, server)
            headers = {"content-type": "application/sdp"} | (_bearer(credential) if credential else {})
            resp = await http.request(method, path, content=offer if method == "POST" else None, headers=headers)
            after = await asyncio.to_thread(_refusals, server)
            try:
                body = resp.json()
            except ValueError:
                body = None
            got[what] = {
                "status": resp.status_code,
                "json": resp.headers.get("content-type", "").startswith("application/json"),
                "error": body.get("error") if isinstance(body, dict) else None,
                "message": bool(isinstance(body, dict) and body.get("message")),
                "counted": _counted(before, after),
            }

        first = await Session.watching(server.url, driver.info["watch_url"], driver.info["watch_token"]).start()
        await attempt("no token", "POST", watch_path, None)
        await attempt("a wrong token", "POST", watch_path, "not-a-watch-token-0123456789abcdef")
        await attempt(
            "a wrong token, no such session",
            "POST",
            "/v1/sessions/0123456789abcdef/watch",
            "not-a-watch-token-0123456789abcdef",
        )
        await attempt("the driver's token", "POST", watch_path, token)
        await attempt("another session's watch token", "POST", watch_path, other["watch_token"])
        tr = time.perf_counter()
        revoke = await http.delete(f"/v1/sessions/{sid}/watch-token", headers=_bearer(token))
        while first.run.done is None and time.perf_counter() - tr < 10:
            await asyncio.sleep(POLL_S)
        revoked_done_s = None if first.run.done is None else first.run.done["received_t"] - tr
        await attempt("the revoked watch token", "POST", watch_path, driver.info["watch_token"])
        rotated = (await http.post(f"/v1/sessions/{sid}/watch-token", headers=_bearer(token))).json()
        second = await Session.watching(server.url, rotated["watch_url"], rotated["watch_token"]).start()
        second_frames = len(second.run.frames)
        assert second.info is not None
        resource = second.info["resource"]
        first_delete = await http.delete(resource, headers=_bearer(rotated["watch_token"]))
        await attempt("a spectator's resource deleted twice", "DELETE", resource, rotated["watch_token"])
        for s in (first, second):
            await s.close()
        t1 = time.perf_counter()
        mid = await asyncio.to_thread(server.resources)
        watching = await asyncio.to_thread(_watching, server, sid)
        driver_done = driver.run.done
        driver_delivery = _delivery(driver, t0, t1)
        await driver.close()
        await attempt("the watch token after the session's DELETE", "POST", watch_path, rotated["watch_token"])
        await http.delete(f"/v1/sessions/{other['session_id']}", headers=_bearer(other["token"]))
        await http.aclose()
        await asyncio.sleep(KEEP_S + 0.5)  # both sessions forgotten
        settled, end = await _settled(server, base, lambda: server.metric("worldrtc_spectators") == 0)
        return {
            "attempts": got,
            "revoke": [revoke.status_code, revoke.json()],
            "revoked_spectator_done": first.run.done,
            "revoked_done_s": revoked_done_s,
            "rotated": sorted(rotated),
            "rotated_token_watched_frames": second_frames,
            "first_delete": first_delete.status_code,
            "second_spectator_done": (second.run.done or {}).get("code"),
            "watching_after": watching,
            "driver_done_before_its_delete": driver_done,
            "driver": driver_delivery,
            "mid": mid,
            "settled_s": settled,
            "base": base,
            "end": end,
        }

    f = asyncio.run(run())
    unhandled = server.unhandled()
    attempts = f["attempts"]
    mid, base, end = f["mid"], f["base"], f["end"]
    r.figures = {k: v for k, v in f.items() if k not in ("mid", "base", "end")} | {
        "base": base.__dict__,
        "with_driver_only": mid.__dict__,
        "end": end.__dict__,
    }
    wrong = {}
    for what, (status, code, reason) in EXPECTED.items():
        a = attempts.get(what)
        expected = {
            "status": status,
            "json": True,
            "error": code,
            "message": True,
            "counted": {reason: 1} if reason else {},
        }
        if a != expected:
            wrong[what] = a
    r.checks = [
        equal("answers otherwise than expected (status, JSON error, counted once under its reason)", wrong, {}),
        equal("attempts", len(attempts), len(EXPECTED)),
        equal("the driver's revoke", f["revoke"], [200, {"spectators_ended": 1}]),
        equal("its spectator's done", (f["revoked_spectator_done"] or {}).get("code"), "revoked"),
        at_most("  … after the revoke", f["revoked_done_s"], 2.0, " s"),
        holds("a rotated token watches", f["rotated_token_watched_frames"] > 0, f["rotated_token_watched_frames"]),
        equal("the first DELETE of a spectator's resource", f["first_delete"], 200),
        equal("spectators watching, admitted (from the session's record)", list(f["watching_after"]), [0, 2]),
        equal("the driver's session ended meanwhile", f["driver_done_before_its_delete"], None),
        at_least("the driver's new frames / target", f["driver"]["unique_fps_over_target"], DELIVERY_BOUND),
        at_most("the driver's longest wait for a new frame", f["driver"]["max_wait_s"], STALL_BOUND_S, " s"),
        equal("peer connections with the driver alone", mid.peer_connections - base.peer_connections, 1),
        *leak_checks(base, end),
        equal("unhandled exceptions in the server log", len(unhandled), 0),
    ]


# ---------------------------------------------------------------- 25


def _spectator_end(server: ServerUnderTest, spectator_id: str) -> str | None:
    """How the server's log says a spectator ended (its state and reason), None if it has not."""
    for line in server.log_text().splitlines():
        if f"spectator {spectator_id} of session" in line:
            return line.split(": ", 1)[-1].rsplit(" session=", 1)[0]
    return None


def _peer_gone(end: str | None) -> bool:
    """The spectator's close says `peer_gone`: silence (no RTCP reports) or a failed connection."""
    return end is not None and "failed" in end and ("no RTCP receiver report" in end or "connection failed" in end)


@case(
    25,
    "spectator SIGKILL",
    "a spectator in its own process SIGKILLed mid-stream, while the driver and a second spectator watch",
    "it ends peer_gone within peer_timeout_s + 1 s; the driver and the other spectator get new frames "
    f"throughout (no wait over {STALL_BOUND_S:g} s); 1 spectator left; peer connections and tasks back; "
    "when the driver leaves, the other gets `done` driver_left and its connection closes",
)
def spectator_sigkill(lab: Lab, r: CaseResult) -> None:
    server = lab.server(SPECTATE)
    peer_s = float(server.http.get("/v1/model").json()["limits"]["peer_timeout_s"])

    async def run() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        driver = await Session(server.url).start()
        await asyncio.wait_for(driver.next_frame(), 60)
        assert driver.info is not None
        sid, watch_url, watch_token = (driver.info[k] for k in ("session_id", "watch_url", "watch_token"))
        other = await Session.watching(server.url, watch_url, watch_token).start()
        base = await asyncio.to_thread(server.resources)
        peer = PeerProcess("watch", server.url, "--watch-url", watch_url, "--watch-token", watch_token)
        try:
            watching = await loop.run_in_executor(None, peer.event, 60)
            before = await asyncio.to_thread(_watching, server, sid)
            t_kill = time.perf_counter()
            peer.kill()
        finally:
            peer.kill()
        spectator_id = watching["resource"].rsplit("/", 1)[-1]
        reaped_s = await asyncio.to_thread(wait_for, lambda: _watching(server, sid)[0] == 1, peer_s + 10, POLL_S)
        end_line = await asyncio.to_thread(_spectator_end, server, spectator_id)
        await asyncio.sleep(2.0)  # and on after it was reaped
        t_end = time.perf_counter()
        settled, end = await _settled(server, base, lambda: _watching(server, sid)[0] == 1)
        delivery = {"driver": _delivery(driver, t_kill, t_end), "other spectator": _delivery(other, t_kill, t_end)}
        driver_done = driver.run.done
        t_leave = time.perf_counter()
        await driver.close()
        while other.run.done is None and time.perf_counter() - t_leave < 5:
            await asyncio.sleep(POLL_S)
        while other.pc.connectionState != "closed" and time.perf_counter() - t_leave < 10:
            await asyncio.sleep(POLL_S)
        other_end = {
            "done": (other.run.done or {}).get("code"),
            "done_s": None if other.run.done is None else other.run.done["received_t"] - t_leave,
            "connection": other.pc.connectionState,
            "closed_s": time.perf_counter() - t_leave,
        }
        await other.close()
        return {
            "spectator": spectator_id,
            "killed_after_frames": watching["frames"],
            "watching_before": before,
            "reaped_s": reaped_s,
            "server_says": end_line,
            "delivery": delivery,
            "driver_done": driver_done,
            "settled_s": settled,
            "base": base,
            "end": end,
            "driver_left": other_end,
        }

    f = asyncio.run(run())
    base, end = f.pop("base"), f.pop("end")
    r.figures = f | {"peer_timeout_s": peer_s, "base": base.__dict__, "end": end.__dict__}
    delivery = f["delivery"]
    r.checks = [
        equal("spectators watching before the kill", f["watching_before"][0], 2),
        holds("ended peer_gone (the server's log)", _peer_gone(f["server_says"]), f["server_says"]),
        at_most("  … after the kill", f["reaped_s"], peer_s + 1, " s"),
        *(
            check
            for who, d in delivery.items()
            for check in (
                at_least(
                    f"{who}: new frames / target, kill to reaped + 2 s", d["unique_fps_over_target"], DELIVERY_BOUND
                ),
                at_most(f"{who}: longest wait for a new frame", d["max_wait_s"], STALL_BOUND_S, " s"),
            )
        ),
        equal("the driver's session ended meanwhile", f["driver_done"], None),
        *leak_checks(base, end),
        equal("when the driver leaves: the other spectator's done", f["driver_left"]["done"], "driver_left"),
        equal("  … and its connection", f["driver_left"]["connection"], "closed"),
    ]


# ---------------------------------------------------------------- 26


CROWD_PROCESSES = 2  # the receivers' own work (decode, stamp reading) off the measuring process, one per core
MAX_PER_SESSION = int(Settings.model_fields["max_spectators_per_session"].default)
FIRST_FRAME_BOUND_S = 10.0
JOIN_WINDOW_S = 2.0  # "during the join": from the start until all have video, and at least this long


@case(
    26,
    "spectators at once",
    f"{MAX_PER_SESSION} spectators (the per-session maximum) start at once from {CROWD_PROCESSES} processes on "
    "one driver's session; a 17th tries while they watch; then all leave",
    f"every one gets video (join → first frame ≤ {FIRST_FRAME_BOUND_S:g} s); the 17th refused 429 busy, counted "
    f"`full`; the driver's new frames ≥ {DELIVERY_BOUND} of target during the join and while they watch; all back "
    "to the count before once they leave",
)
def spectators_at_once(lab: Lab, r: CaseResult) -> None:
    server = lab.server(SPECTATE)
    before_s, hold_s = lab.pick(3.0, 5.0), lab.pick(3.0, 10.0)
    per_process = MAX_PER_SESSION // CROWD_PROCESSES

    async def run() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        offer = await _offer()
        driver = await Session(server.url).start()
        await asyncio.wait_for(driver.next_frame(), 60)
        assert driver.info is not None
        sid, watch_url, watch_token = (driver.info[k] for k in ("session_id", "watch_url", "watch_token"))
        base = await asyncio.to_thread(server.resources)
        args = ("--watch-url", watch_url, "--watch-token", watch_token, "--spectators", str(per_process))
        crowd = [PeerProcess("crowd", server.url, *args) for _ in range(CROWD_PROCESSES)]
        try:
            await asyncio.gather(*(loop.run_in_executor(None, p.event, 60) for p in crowd))  # ready
            await asyncio.sleep(before_s)
            t_go = time.perf_counter()
            for p in crowd:
                p.proc.send_signal(signal.SIGUSR1)
            joined = await asyncio.gather(*(loop.run_in_executor(None, p.event, 120) for p in crowd))
            t_joined = time.perf_counter()
            join_end = max(t_joined, t_go + JOIN_WINDOW_S)
            watching = await asyncio.to_thread(_watching, server, sid)
            refused0 = await asyncio.to_thread(_refusals, server)
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                headers = {"content-type": "application/sdp"} | _bearer(watch_token)
                extra = await http.post(watch_url, content=offer, headers=headers)
            refused1 = await asyncio.to_thread(_refusals, server)
            await asyncio.sleep(max(0.0, join_end + hold_s - time.perf_counter()))
            t_leave = time.perf_counter()
            for p in crowd:
                p.proc.send_signal(signal.SIGTERM)
            left = await asyncio.gather(*(loop.run_in_executor(None, p.event, 60) for p in crowd))
            exits = [await asyncio.to_thread(p.proc.wait, 30) for p in crowd]
            t_left = time.perf_counter()
        finally:
            for p in crowd:
                p.kill()
        settled, end = await _settled(server, base, lambda: _watching(server, sid)[0] == 0)
        after = await asyncio.to_thread(_watching, server, sid)
        driver_done = driver.run.done
        delivery = {
            "before": _delivery(driver, t_go - before_s, t_go),
            "join": _delivery(driver, t_go, join_end),
            "watched": _delivery(driver, join_end, t_leave),
            "leave": _delivery(driver, t_leave, t_left),
        }
        await driver.close()
        try:
            extra_body = extra.json()
        except ValueError:
            extra_body = None
        return {
            "joined": joined,
            "join_s": t_joined - t_go,
            "watching": watching,
            "extra": {
                "status": extra.status_code,
                "error": extra_body.get("error") if isinstance(extra_body, dict) else None,
                "retry_after": extra.headers.get("retry-after"),
                "counted": _counted(refused0, refused1),
            },
            "left": left,
            "exits": exits,
            "leave_s": t_left - t_leave,
            "after": after,
            "driver": delivery,
            "driver_done": driver_done,
            "settled_s": settled,
            "base": base,
            "end": end,
        }

    t0 = time.perf_counter()
    f = asyncio.run(run())
    base, end = f.pop("base"), f.pop("end")
    first = [s for j in f["joined"] for s in j["first_frame_s"]]
    failed = [x for j in f["joined"] for x in j["failed"]]
    held = [n / max(j["held_s"], 1e-9) / FPS for j in f["left"] for n in j["unique_frames"]]
    d = f["driver"]
    r.figures = f | {
        "first_frame_s": summarize(first) | {"p50": percentile(first, 50)},
        "spectators_unique_fps_over_target": held,
        "row_s": time.perf_counter() - t0,
        "base": base.__dict__,
        "end": end.__dict__,
    }
    r.checks = [
        equal("spectators that got video", len(first), MAX_PER_SESSION),
        equal("spectators that failed to join", failed, []),
        at_most("join → first frame, max", max(first, default=None), FIRST_FRAME_BOUND_S, " s"),
        equal("spectators watching, admitted (from the session's record)", list(f["watching"]), [16, 16]),
        equal(
            "the 17th: status, error, counted",
            [f["extra"]["status"], f["extra"]["error"], f["extra"]["counted"]],
            [429, "busy", {"full": 1}],
        ),
        holds("  … with Retry-After", bool(f["extra"]["retry_after"]), f["extra"]["retry_after"]),
        at_least("every spectator's new frames / target while watching (min)", min(held, default=None), DELIVERY_BOUND),
        at_least("the driver's new frames / target before", d["before"]["unique_fps_over_target"], DELIVERY_BOUND),
        at_least(
            f"  … during the join (at least its first {JOIN_WINDOW_S:g} s)",
            d["join"]["unique_fps_over_target"],
            DELIVERY_BOUND,
        ),
        at_least("  … while they watch", d["watched"]["unique_fps_over_target"], DELIVERY_BOUND),
        at_most(
            "the driver's longest wait for a new frame (join to leave)",
            max(d[k]["max_wait_s"] for k in ("join", "watched", "leave")),
            STALL_BOUND_S,
            " s",
        ),
        equal("the driver's session ended meanwhile", f["driver_done"], None),
        equal("spectator processes' exit status", f["exits"], [0] * CROWD_PROCESSES),
        equal("spectators watching after they left", f["after"][0], 0),
        *leak_checks(base, end),
    ]
