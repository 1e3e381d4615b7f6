"""Viewers the suite runs in their own processes (a flood must not slow the process that measures,
and a crashed viewer is a killed process):

    python -m benchmarks.reliability.peer hang URL [--frames N]
        connect (REST, with a control channel), receive N frames, print one JSON line, wait to be killed
    python -m benchmarks.reliability.peer flood URL --rate R --duration-s D
        connect, print a line, send R valid control messages a second for D seconds, print what was sent
    python -m benchmarks.reliability.peer tamper URL
        offer with a DTLS fingerprint that is not this peer's certificate's, print what happened
    python -m benchmarks.reliability.peer watch URL --watch-url W --watch-token T [--frames N]
        watch a session as a spectator, receive N frames, print one JSON line, wait to be killed
    python -m benchmarks.reliability.peer crowd URL --watch-url W --watch-token T --spectators N
        print a line, and on SIGUSR1 start N spectators at once and print when each got its first
        frame; on SIGTERM end every watch (WHEP DELETE) and print what each received meanwhile

Each prints JSON lines on stdout: {"event": ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import time
from typing import Any

import httpx
from aiortc import RTCPeerConnection, RTCSessionDescription

from worldrtc import Session

KEYS = ("w", "a", "s", "d")


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


PING_EVERY_S = 0.02
DRAIN_TIMEOUT_S = 10.0


async def hang(url: str, frames: int) -> None:
    session = await Session(url).start()
    assert session.info is not None
    async for _ in session.frames(limit=frames):
        pass
    emit("streaming", session_id=session.info["session_id"], frames=len(session.run.frames))
    await asyncio.sleep(3600)  # until killed


async def flood(url: str, rate: float, duration_s: float) -> None:
    session = await Session(url).start()
    assert session.info is not None and session.channel is not None
    emit("connected", session_id=session.info["session_id"])
    sent = 0
    t0 = time.perf_counter()
    # Sent in batches per 10 ms tick: asyncio cannot time single messages 0.5 ms apart.
    while (elapsed := time.perf_counter() - t0) < duration_s:
        due = int(elapsed * rate)
        while sent < due:
            session.press(KEYS[sent % 4]) if sent % 2 == 0 else session.release(KEYS[sent % 4])
            sent += 1
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    # The server reads the channel in order: its first pong comes once it has read the whole flood,
    # which bounds the window over which the flood reached it. A ping that meets an empty bucket is
    # refused like the rest: one more every PING_EVERY_S until one is answered.
    pings = 0
    while not session.run.pongs and time.perf_counter() - t0 < duration_s + DRAIN_TIMEOUT_S:
        session.ping()
        pings += 1
        await asyncio.sleep(PING_EVERY_S)
    drained = session.run.pongs[0]["received_t"] - t0 if session.run.pongs else None
    emit(
        "sent",
        messages=sent + pings,
        seconds=elapsed,
        drained_s=drained,
        errors=len(session.run.errors),
        done=session.run.done,
    )
    await session.close()


async def tamper(url: str, wait_s: float) -> None:
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("control")
    await pc.setLocalDescription(await pc.createOffer())
    offer = pc.localDescription.sdp
    # Another certificate's fingerprint: same form, different bytes.
    tampered = re.sub(
        r"(a=fingerprint:sha-256 )([0-9A-F:]+)",
        lambda m: m.group(1) + ":".join("00" if b != "00" else "11" for b in m.group(2).split(":")),
        offer,
    )
    states: list[str] = []
    pc.on("connectionstatechange", lambda: states.append(pc.connectionState))
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.post("/v1/sessions", json={})
        r.raise_for_status()
        created = r.json()
        sid = created["session_id"]
        auth = {"authorization": f"Bearer {created['token']}"}
        r = await http.post(f"/v1/sessions/{sid}/offer", json={"sdp": tampered, "type": "offer"}, headers=auth)
        emit("answered", status=r.status_code, session_id=sid, tampered=tampered != offer)
        if r.status_code == 200:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=r.json()["sdp"], type="answer"))
        await asyncio.sleep(wait_s)
    emit("client_states", states=states)
    await pc.close()


async def watch(url: str, watch_url: str, token: str, frames: int) -> None:
    session = await Session.watching(url, watch_url, token).start()
    assert session.info is not None
    async for _ in session.frames(limit=frames):
        pass
    emit("watching", resource=session.info["resource"], frames=len(session.run.frames))
    await asyncio.sleep(3600)  # until killed


async def crowd(url: str, watch_url: str, token: str, n: int) -> None:
    loop = asyncio.get_running_loop()
    go, leave = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, go.set)
    loop.add_signal_handler(signal.SIGTERM, leave.set)
    emit("ready")
    await go.wait()
    spectators = [Session.watching(url, watch_url, token) for _ in range(n)]
    t0 = time.perf_counter()
    started = await asyncio.gather(*(s.start() for s in spectators), return_exceptions=True)
    failed = [f"{type(x).__name__}: {x}" for x in started if isinstance(x, BaseException)]
    first = [s.run.first_frame_t - t0 for s in spectators if s.run.first_frame_t is not None]
    joined_t = time.perf_counter()
    emit("joined", first_frame_s=first, failed=failed)
    await leave.wait()
    left_t = time.perf_counter()
    held = [
        len({f.stamp for f in s.run.frames if joined_t <= f.t <= left_t and f.stamp is not None}) for s in spectators
    ]
    ends = await asyncio.gather(*(s.close() for s in spectators), return_exceptions=True)
    emit(
        "left",
        held_s=left_t - joined_t,
        unique_frames=held,
        done=[(s.run.done or {}).get("code") for s in spectators],
        close_errors=[f"{type(x).__name__}: {x}" for x in ends if isinstance(x, BaseException)],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reliability.peer")
    p.add_argument("mode", choices=("hang", "flood", "tamper", "watch", "crowd"))
    p.add_argument("url")
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--wait-s", type=float, default=8.0)
    p.add_argument("--watch-url", default="")
    p.add_argument("--watch-token", default="")
    p.add_argument("--spectators", type=int, default=4)
    a = p.parse_args(argv)
    if a.mode == "hang":
        asyncio.run(hang(a.url, a.frames))
    elif a.mode == "flood":
        asyncio.run(flood(a.url, a.rate, a.duration_s))
    elif a.mode == "tamper":
        asyncio.run(tamper(a.url, a.wait_s))
    elif a.mode == "watch":
        asyncio.run(watch(a.url, a.watch_url, a.watch_token, a.frames))
    else:
        asyncio.run(crowd(a.url, a.watch_url, a.watch_token, a.spectators))
    return 0


if __name__ == "__main__":
    sys.exit(main())
