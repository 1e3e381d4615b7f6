"""Rows 12-15 and 22: how sessions and the server end.

12 SIGTERM drain       2 live sessions: one ends during the drain, one outlasts it
13 SIGTERM idle/twice  an idle server; a second signal during a drain
14 abandoned sessions  no offer; ICE that never connects; a viewer killed mid-stream
15 DTLS tampered       an offer whose fingerprint is not the client's certificate's
22 session lifetime    defaults off loopback; both limits enforced and announced
39 group SIGTERM       every process of the tree signalled at once (2 live sessions)
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from typing import Any

import httpx
import psutil
from aiortc import RTCPeerConnection

from benchmarks.local_server import ServerProcess, start_server
from benchmarks.reliability.harness import (
    CaseResult,
    Lab,
    PeerProcess,
    ServerConfig,
    ServerUnderTest,
    alive,
    all_ended,
    at_most,
    below,
    case,
    equal,
    holds,
    kill_group,
    wait_for,
)
from server.common.settings import DEFAULT_MAX_SESSION_S
from workers.runtime.channel import leaked_segments
from worldrtc import Session

POLL_S = 0.02


def _status(server: ServerUnderTest, path: str) -> tuple[int, str | None]:
    try:
        r = server.http.get(path)
        return r.status_code, r.json().get("error") if r.status_code >= 400 else None
    except httpx.HTTPError:
        return 0, None


def exit_within(process: ServerProcess, timeout_s: float) -> tuple[int | None, float | None]:
    t0 = time.monotonic()
    try:
        code = process.proc.wait(timeout=timeout_s)
    except Exception:
        return None, None
    return code, time.monotonic() - t0


@case(
    12,
    "SIGTERM drain",
    "SIGTERM with 2 live sessions (one ends itself during the drain)",
    "/readyz 503 at once; creates 503; sessions go on until they end or drain_timeout_s, then "
    "close with server_shutdown; exit 0 within drain + 5 s",
)
def sigterm_drain(lab: Lab, r: CaseResult) -> None:
    drain_s = lab.pick(4.0, 10.0)
    config = ServerConfig().with_env(drain_timeout_s=drain_s)
    process = start_server(list(config.args), lab.log_dir / "drain.log", env=dict(config.env))
    server = ServerUnderTest(process)
    try:

        async def run() -> dict[str, Any]:
            a, b = await Session(server.url).start(), await Session(server.url).start()
            for s in (a, b):
                await asyncio.wait_for(s.next_frame(), 60)
            process.proc.send_signal(signal.SIGTERM)
            t0 = time.perf_counter()
            loop = asyncio.get_running_loop()
            draining = await loop.run_in_executor(
                None, wait_for, lambda: _status(server, "/readyz") == (503, "draining"), 2.0, 0.01
            )
            create = await loop.run_in_executor(None, lambda: server.http.post("/v1/sessions", json={}))
            frames_at = {id(s): len(s.run.frames) for s in (a, b)}
            await asyncio.sleep(drain_s / 2)
            a_frames_mid = len(a.run.frames) - frames_at[id(a)]
            final_a = await a.close()  # ends itself during the drain
            while b.run.done is None and time.perf_counter() - t0 < drain_s + 10:
                await asyncio.sleep(POLL_S)
            b_done_s = None if b.run.done is None else b.run.done["received_t"] - t0
            b_frames = len(b.run.frames) - frames_at[id(b)]
            code, exit_s = await loop.run_in_executor(None, exit_within, process, drain_s + 10)
            exit_after_s = None if exit_s is None else time.perf_counter() - t0
            await b.close()
            return {
                "readyz_503_s": draining,
                "create_during_drain": [create.status_code, create.json().get("error")],
                "a_frames_during_drain": a_frames_mid,
                "a_ended": None if final_a is None else final_a.get("ended"),
                "b_frames_during_drain": b_frames,
                "b_done": b.run.done,
                "b_done_s": b_done_s,
                "exit_code": code,
                "exit_after_s": exit_after_s,
            }

        f = asyncio.run(run())
    finally:
        server.close()
        kill_group(process)
    fps = 16
    r.figures = f
    r.checks = [
        below("/readyz 503 draining after the signal", f["readyz_503_s"], 0.5, " s"),
        equal("a create during the drain", f["create_during_drain"], [503, "draining"]),
        holds("session A streams during the drain, then ends itself", f["a_frames_during_drain"] > 0),
        equal("session A's end", f["a_ended"], "deleted"),
        holds("session B streams until the drain timeout", f["b_frames_during_drain"] >= 0.8 * fps * drain_s),
        equal("session B's done code", (f["b_done"] or {}).get("code"), "server_shutdown"),
        at_most("session B closed after", f["b_done_s"], drain_s + 2, " s"),
        equal("exit status", f["exit_code"], 0),
        at_most("exited after the signal", f["exit_after_s"], drain_s + 5, " s"),
    ]


@case(
    13,
    "SIGTERM idle / twice",
    "SIGTERM to an idle server; SIGTERM twice with a live session",
    "idle exit < 1 s; the second signal forces exit < 2 s",
)
def sigterm_idle_twice(lab: Lab, r: CaseResult) -> None:
    idle = start_server(list(ServerConfig().args), lab.log_dir / "sigterm-idle.log")
    try:
        idle.proc.send_signal(signal.SIGTERM)
        idle_code, idle_s = exit_within(idle, 30)
    finally:
        kill_group(idle)
    config = ServerConfig().with_env(drain_timeout_s=60)
    busy = start_server(list(config.args), lab.log_dir / "sigterm-twice.log", env=dict(config.env))
    try:

        async def twice() -> tuple[int | None, float | None, dict[str, Any] | None]:
            s = await Session(busy.url).start()
            await asyncio.wait_for(s.next_frame(), 60)
            busy.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)  # draining now: the session goes on
            busy.proc.send_signal(signal.SIGTERM)
            code, exit_s = await asyncio.get_running_loop().run_in_executor(None, exit_within, busy, 30)
            done = s.run.done
            await s.close()
            return code, exit_s, done

        twice_code, twice_s, done = asyncio.run(twice())
    finally:
        kill_group(busy)
    r.figures = {"idle": [idle_code, idle_s], "twice": [twice_code, twice_s], "done": done}
    r.checks = [
        equal("idle: exit status", idle_code, 0),
        below("idle: exited after", idle_s, 1.0, " s"),
        equal("twice: exit status", twice_code, 0),
        below("twice: exited after the second signal", twice_s, 2.0, " s"),
        equal("twice: the session's done code", (done or {}).get("code"), "server_shutdown"),
    ]


async def _unreachable_offer() -> str:
    """A real offer whose only candidate is a loopback port nothing listens on."""
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("control")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    sdp = re.sub(r"a=candidate:[^\r\n]*\r\n", "", sdp)
    return sdp.replace(
        "a=end-of-candidates", "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\na=end-of-candidates"
    )


@case(
    14,
    "abandoned sessions",
    "no offer; an offer whose ICE never connects; a viewer SIGKILLed mid-stream",
    "each reaped within its timeout + 1 s; its slot back",
)
def abandoned(lab: Lab, r: CaseResult) -> None:
    offer_s, ice_s = 2.0, 2.0
    config = ServerConfig().with_env(offer_timeout_s=offer_s, ice_timeout_s=ice_s, create_burst=1000)
    server = lab.server(config)
    peer_s = float(server.http.get("/v1/model").json()["limits"]["peer_timeout_s"])

    def create() -> tuple[str, str]:
        body = server.http.post("/v1/sessions", json={}).json()
        return body["session_id"], body["token"]

    sid, _ = create()
    no_offer = server.wait_ended(sid, offer_s + 10)

    sid, token = create()
    offer = asyncio.run(_unreachable_offer())
    auth = {"authorization": f"Bearer {token}"}
    answered = server.http.post(f"/v1/sessions/{sid}/offer", json={"sdp": offer, "type": "offer"}, headers=auth)
    no_ice = server.wait_ended(sid, ice_s + 10)

    peer = PeerProcess("hang", server.url, "--frames", "8")
    try:
        streaming = peer.event(60)
        peer.kill()
    finally:
        peer.kill()
    sid = streaming["session_id"]
    # The peer's token died with it: the server's own listing shows the session's end.
    killed_s, killed_end = server.wait_ended(sid, peer_s + 10)
    active = [s for s in server.sessions() if s["state"] in ("created", "connecting", "streaming")]
    slots_back = server.http.post("/v1/sessions", json={})
    if slots_back.status_code == 201:
        server.http.delete(f"/v1/sessions/{slots_back.json()['session_id']}")
    r.figures = {
        "no_offer": no_offer,
        "ice_never": {"answer": answered.status_code, "ended": no_ice},
        "viewer_killed": {"after_s": killed_s, "ended": killed_end},
        "timeouts_s": {"offer": offer_s, "ice": ice_s, "peer": peer_s},
    }
    r.checks = [
        equal("no offer: end reason", no_offer[1], "no_offer"),
        at_most("no offer: reaped after", no_offer[0], offer_s + 1, " s"),
        equal("ICE never connects: offer answered", answered.status_code, 200),
        holds(
            "ICE never connects: ended as ice_timeout or peer_gone",
            no_ice[1] in ("ice_timeout", "peer_gone"),
            no_ice[1],
        ),
        at_most("ICE never connects: reaped after", no_ice[0], ice_s + 1, " s"),
        equal("viewer killed: end reason", killed_end, "peer_gone"),
        at_most("viewer killed: reaped after", killed_s, peer_s + 1, " s"),
        equal("sessions still holding a slot", len(active), 0),
        equal("a new session is admitted", slots_back.status_code, 201),
    ]


@case(
    15,
    "DTLS fingerprint tampered",
    "an offer whose a=fingerprint is not the client's certificate",
    "session closed ≤ 5 s; no unhandled exception",
)
def dtls_tampered(lab: Lab, r: CaseResult) -> None:
    with lab.own_server(ServerConfig()) as server:
        peer = PeerProcess("tamper", server.url, "--wait-s", "8")
        try:
            answered = peer.event(60)
            closed_s, ended = server.wait_ended(answered["session_id"], 15)
            client = peer.event(30)
        finally:
            peer.kill()
        time.sleep(0.5)  # anything the close set off has been logged
        unhandled = server.unhandled()
    r.figures = {"answer": answered, "closed_s": closed_s, "ended": ended, "client": client}
    r.checks = [
        holds("the offer was tampered and answered", answered["tampered"] and answered["status"] == 200),
        at_most("session closed after", closed_s, 5.0, " s"),
        holds("ended as a failed connection", ended == "peer_gone", ended),
        equal("unhandled exceptions in the server log", len(unhandled), 0),
    ]


@case(
    22,
    "session lifetime",
    "a server bound off loopback with defaults; short limits to watch them act",
    f"max_session_s defaults to {DEFAULT_MAX_SESSION_S:g} s off loopback, the idle limit applies; both announced",
)
def session_lifetime(lab: Lab, r: CaseResult) -> None:
    token = "reliability-suite-token"
    wide = ServerConfig(("--host", "0.0.0.0", *ServerConfig().args)).with_env(api_token=token)
    with lab.own_server(wide) as server:
        limits = server.http.get("/v1/model").json()["limits"]

        async def announced() -> dict[str, Any] | None:
            s = await Session(server.url, token=token).start()
            await asyncio.wait_for(s.next_frame(), 60)
            await s.close()
            return s.run.ready

        ready = asyncio.run(announced())
    short = ServerConfig().with_env(max_session_s=3, idle_timeout_s=2)
    with lab.own_server(short) as server:

        async def watch(steer: bool) -> tuple[float | None, str | None]:
            s = await Session(server.url).start()
            t0 = time.perf_counter()
            while s.run.done is None and time.perf_counter() - t0 < 15:
                if steer:
                    s.press("w")
                await asyncio.sleep(0.5)
            done = s.run.done
            await s.close()
            return (None if done is None else done["received_t"] - t0), (done or {}).get("code")

        max_run = asyncio.run(watch(steer=True))
        idle_run = asyncio.run(watch(steer=False))
    r.figures = {"limits": limits, "ready": ready, "max_run": max_run, "idle_run": idle_run}
    r.checks = [
        equal("off loopback: max_session_s in /v1/model", limits["max_session_s"], DEFAULT_MAX_SESSION_S),
        equal(
            "off loopback: max_duration_s announced in ready",
            (ready or {}).get("max_duration_s"),
            DEFAULT_MAX_SESSION_S,
        ),
        holds(
            "the idle limit announced in ready",
            bool((ready or {}).get("idle_timeout_s")),
            (ready or {}).get("idle_timeout_s"),
        ),
        equal("a steered session ends at max_session_s (3 s)", max_run[1], "max_duration"),
        at_most("  … after", max_run[0], 4.0, " s"),
        equal("an idle session ends at idle_timeout_s (2 s)", idle_run[1], "idle"),
        at_most("  … after", idle_run[0], 3.5, " s"),
    ]


@case(
    39,
    "group SIGTERM",
    "SIGTERM to every process of the server's tree at once (kill -TERM -- -PGID, as a service manager "
    "does) under 2 live sessions; drain 2 s",
    "the workers stay the server's (they keep streaming through the drain); both sessions close with "
    "server_shutdown; exit 0 within drain + 5 s; 0 processes at the exit; 0 channel files",
)
def group_sigterm(lab: Lab, r: CaseResult) -> None:
    drain_s = 2.0
    config = ServerConfig().with_env(drain_timeout_s=drain_s)
    process = start_server(list(config.args), lab.log_dir / "group-sigterm.log", env=dict(config.env))
    server = ServerUnderTest(process)
    tree = [process.proc.pid, *(c.pid for c in psutil.Process(process.proc.pid).children(recursive=True))]
    try:

        async def run() -> dict[str, Any]:
            viewers = [await Session(server.url).start() for _ in range(2)]
            for v in viewers:
                await asyncio.wait_for(v.next_frame(), 60)
            before = [len(v.run.frames) for v in viewers]
            os.killpg(process.proc.pid, signal.SIGTERM)
            loop = asyncio.get_running_loop()
            code, exit_s = await loop.run_in_executor(None, exit_within, process, drain_s + 30)
            left = [pid for pid in tree if alive(pid)]  # read at once, before anything here kills what is left
            await all_ended(viewers, 5.0)
            figures = {
                "tree": tree,
                "exit": [code, exit_s],
                "processes_left_at_exit": left,
                "frames_during_drain": [len(v.run.frames) - b for v, b in zip(viewers, before, strict=True)],
                "done_codes": [(v.run.done or {}).get("code") for v in viewers],
            }
            for v in viewers:
                await v.close()
            return figures

        f = asyncio.run(run())
    finally:
        server.close()
        kill_group(process)
    files = sum(len(leaked_segments(pid)) for pid in tree)
    r.figures = f | {"channel_files_left": files}
    fps = 16
    r.checks = [
        equal("exit status", f["exit"][0], 0),
        at_most("exited after the signal", f["exit"][1], drain_s + 5, " s"),
        holds(
            "both sessions streamed through the drain",
            min(f["frames_during_drain"]) >= 0.8 * fps * drain_s,
            f["frames_during_drain"],
        ),
        equal("the sessions' done codes", f["done_codes"], ["server_shutdown"] * 2),
        equal("processes left at the exit", f["processes_left_at_exit"], []),
        equal("channel files left", files, 0),
    ]
