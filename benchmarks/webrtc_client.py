"""An aiortc client of the server, the way a browser uses it: REST session, offer/answer, a `control`
data channel, and the received video with each frame's identity (see `benchmarks/delivery.py`).

    client = WebRTCClient("http://127.0.0.1:8000")
    await client.start(scene="main-street", seed=0)      # or dispatch="chunk-synchronous"
    client.send({"type": "control", "key": "w", "action": "press"})
    ...
    await client.close()
    client.run.frames                                    # ReceivedFrame(t, pts, frame_id) per frame

Times are this process's perf_counter seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription

from benchmarks.delivery import ContentIds, ReceivedFrame
from benchmarks.trace import Trace
from server.ice import use_loopback_candidates
from workers.frame_stamp import read_stamp

SYNTHETIC = "synthetic"  # the model name whose frames carry stamps


@dataclass
class ClientRun:
    """What one client saw."""

    started_t: float = field(default_factory=time.perf_counter)
    frames: list[ReceivedFrame] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)
    ready: dict[str, Any] | None = None
    sent: dict[int, float] = field(default_factory=dict)  # control seq -> send time
    done: dict[str, Any] | None = None
    keep_images: int = 0  # decoded frames to keep as RGB arrays, e.g. for tests that look at them
    images: list[np.ndarray] = field(default_factory=list)

    @property
    def stamped(self) -> bool:
        return self.ready is not None and self.ready.get("model") == SYNTHETIC


def _luma(frame: Any) -> np.ndarray:
    """The Y plane of a decoded yuv420p frame, as a view (no conversion)."""
    plane = frame.planes[0]
    return np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, : plane.width]


class WebRTCClient:
    """One session against a server: REST + offer/answer + data channel + video receive."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30)
        self.pc = RTCPeerConnection()
        self.channel = self.pc.createDataChannel("control")
        self.run = ClientRun()
        self.session: dict[str, Any] | None = None
        self._seq = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._open = asyncio.Event()
        self._content_ids = ContentIds()

    async def start(
        self, scene: str = "main-street", prompt: str = "", seed: int = 0, dispatch: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"scene": scene, "prompt": prompt, "seed": seed}
        if dispatch is not None:
            body["dispatch"] = dispatch
        r = await self.http.post("/v1/sessions", json=body)
        if r.status_code != 201:
            raise RuntimeError(f"create session: {r.status_code} {r.text}")
        self.session = r.json()
        self.pc.addTransceiver("video", direction="recvonly")
        self.channel.on("message", self._on_message)
        self.channel.on("open", self._open.set)
        self.pc.on("track", lambda track: self._spawn(self._receive(track)))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sid, token = self.session["session_id"], self.session["token"]
        r = await self.http.post(
            f"/v1/sessions/{sid}/offer",
            json={"sdp": self.pc.localDescription.sdp, "type": "offer"},
            headers={"authorization": f"Bearer {token}"},
        )
        if r.status_code != 200:
            raise RuntimeError(f"offer: {r.status_code} {r.text}")
        await self.pc.setRemoteDescription(RTCSessionDescription(**r.json()))
        await asyncio.wait_for(self._open.wait(), 20)
        self._spawn(self._ping())
        return self.session

    def send(self, message: dict[str, Any]) -> int:
        self._seq += 1
        now = time.perf_counter()
        msg = {**message, "seq": self._seq, "t": now * 1000}
        if message.get("type") in ("control", "control_state", "look", "reset_pose"):
            self.run.sent[self._seq] = now
        self.channel.send(json.dumps(msg))
        return self._seq

    async def replay(self, trace: Trace, duration_s: float, loop: bool = True) -> None:
        """Send the trace's messages on its clock (its `stop` ends a pass); with `loop`, start over until done."""
        t0 = time.perf_counter()
        offset = 0.0
        period = trace.duration_s + 1.0
        while time.perf_counter() - t0 < duration_s:
            for event in trace.events:
                wait = t0 + offset + event.at_s - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                if time.perf_counter() - t0 > duration_s or event.message.get("type") == "stop":
                    break
                self.send({k: v for k, v in event.message.items() if k not in ("seq", "t")})
            if not loop:
                break
            offset += period
        rest = t0 + duration_s - time.perf_counter()
        if rest > 0:
            await asyncio.sleep(rest)

    async def server_session(self) -> dict[str, Any]:
        assert self.session is not None
        r = await self.http.get(f"/v1/sessions/{self.session['session_id']}")
        return r.json()

    async def close(self) -> dict[str, Any] | None:
        final = None
        if self.session is not None:
            sid = self.session["session_id"]
            r = await self.http.delete(
                f"/v1/sessions/{sid}", headers={"authorization": f"Bearer {self.session['token']}"}
            )
            final = r.json() if r.status_code == 200 else None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pc.close()
        await self.http.aclose()
        return final

    # ---- internals ----

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _receive(self, track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return  # track ended
            t = time.perf_counter()
            luma = _luma(frame)
            stamp = read_stamp(luma) if self.run.stamped else None
            self.run.frames.append(ReceivedFrame(t, int(frame.pts), stamp, self._content_ids(luma)))
            if len(self.run.images) < self.run.keep_images:
                self.run.images.append(frame.to_ndarray(format="rgb24"))

    async def _ping(self) -> None:
        while True:
            self.send({"type": "ping"})
            await asyncio.sleep(1.0)

    def _on_message(self, data: str) -> None:
        msg = json.loads(data)
        kind = msg.get("type")
        if kind == "chunk":
            msg["received_t"] = time.perf_counter()
            self.run.chunks.append(msg)
        elif kind == "ready":
            self.run.ready = msg
        elif kind == "stats":
            self.run.stats.append(msg)
        elif kind == "error":
            self.run.errors.append(msg)
        elif kind == "done":
            self.run.done = msg


def use_loopback_if_local(url: str) -> None:
    """A loopback server only accepts loopback candidates: gather ours on 127.0.0.1 too."""
    host = urlsplit(url).hostname or ""
    use_loopback_candidates(host in ("127.0.0.1", "localhost", "::1"))
