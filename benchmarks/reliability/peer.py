"""Viewers the suite runs in their own processes (a flood must not slow the process that measures,
and a crashed viewer is a killed process):

    python -m benchmarks.reliability.peer hang URL [--frames N]
        connect (REST, with a control channel), receive N frames, print one JSON line, wait to be killed
    python -m benchmarks.reliability.peer flood URL --rate R --duration-s D
        connect, print a line, send R valid control messages a second for D seconds, print what was sent
    python -m benchmarks.reliability.peer tamper URL
        offer with a DTLS fingerprint that is not this peer's certificate's, print what happened

Each prints JSON lines on stdout: {"event": ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from typing import Any

import httpx
from aiortc import RTCPeerConnection, RTCSessionDescription

from worldrtc import Session

KEYS = ("w", "a", "s", "d")


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


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
    await asyncio.sleep(0.5)  # let the channel drain before the counts are read
    emit("sent", messages=sent, seconds=elapsed, errors=len(session.run.errors), done=session.run.done)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reliability.peer")
    p.add_argument("mode", choices=("hang", "flood", "tamper"))
    p.add_argument("url")
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--wait-s", type=float, default=8.0)
    a = p.parse_args(argv)
    if a.mode == "hang":
        asyncio.run(hang(a.url, a.frames))
    elif a.mode == "flood":
        asyncio.run(flood(a.url, a.rate, a.duration_s))
    else:
        asyncio.run(tamper(a.url, a.wait_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
