"""WebRTC replay: a real aiortc client drives a running server the way a browser does.

    python -m benchmarks.webrtc_replay --url http://127.0.0.1:8000 --trace TRACE.json --duration-s 60 \
        --out runs/webrtc.json

It creates a session through the REST API, negotiates (offer with a recvonly video transceiver and
a "control" data channel), replays the trace's messages over the data channel on its own clock
(each with `seq` and `t`), pings every second, receives and decodes the video, and reports:
client FPS and frames received vs expected, frame-interval jitter p50/p99, first-frame seconds,
glass-to-glass control latency p50/p95 (a control's send time → arrival of the first decoded frame
of the first chunk that echoes its seq), plus the server's chunk metrics.

Glass-to-glass here ends at decode in this client (no display), which is the browser's minus its
render delay.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from aiortc import RTCPeerConnection, RTCSessionDescription

from benchmarks.stats import summarize
from benchmarks.trace import Trace
from server.ice import use_loopback_candidates

ASSETS = Path(__file__).parent / "assets"
VIDEO_CLOCK_HZ = 90_000


@dataclass
class ClientRun:
    """What one client saw. Times are this process's perf_counter seconds."""

    started_t: float = field(default_factory=time.perf_counter)
    frame_times: list[float] = field(default_factory=list)
    frame_pts: list[int] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)
    ready: dict[str, Any] | None = None
    sent: dict[int, float] = field(default_factory=dict)  # control seq -> send time
    done: dict[str, Any] | None = None
    keep_frames: int = 0  # decoded frames to keep (RGB arrays), e.g. for tests that look at them
    frames: list[Any] = field(default_factory=list)

    def glass_to_glass_s(self) -> list[float]:
        """Per control: send → first received frame at or after the pts_start of the first chunk echoing it."""
        out = []
        for seq, sent_t in self.sent.items():
            chunk = next((c for c in self.chunks if c.get("applied_seq") is not None and c["applied_seq"] >= seq), None)
            if chunk is None:
                continue
            shown = next(
                (t for t, p in zip(self.frame_times, self.frame_pts, strict=True) if p >= chunk["pts_start"]), None
            )
            if shown is not None and shown >= sent_t:
                out.append(shown - sent_t)
        return out


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

    async def start(self, scene: str = "main-street", prompt: str = "", seed: int = 0) -> dict[str, Any]:
        r = await self.http.post("/v1/sessions", json={"scene": scene, "prompt": prompt, "seed": seed})
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
            self.run.frame_times.append(time.perf_counter())
            self.run.frame_pts.append(int(frame.pts))
            if len(self.run.frames) < self.run.keep_frames:
                self.run.frames.append(frame.to_ndarray(format="rgb24"))

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


def report(run: ClientRun, fps: int, duration_s: float, server: dict[str, Any] | None) -> dict[str, Any]:
    times = run.frame_times
    first = times[0] - run.started_t if times else None
    intervals = [b - a for a, b in itertools.pairwise(times)]
    playing_s = times[-1] - times[0] if len(times) > 1 else 0.0
    expected = int(playing_s * fps) + 1 if times else 0
    g2g = run.glass_to_glass_s()
    received_fps = (len(times) - 1) / playing_s if playing_s > 0 else None
    return {
        "duration_s": duration_s,
        "frames_received": len(times),
        "frames_expected": expected,
        "client_fps": received_fps,
        "client_fps_over_target": received_fps / fps if received_fps else None,
        "frame_interval_s": summarize(intervals),
        "jitter_s": {
            "p50": abs(summarize(intervals)["p50"] - 1 / fps) if intervals else None,  # type: ignore[operator]
            "p99": abs(summarize(intervals)["p99"] - 1 / fps) if intervals else None,  # type: ignore[operator]
        },
        "first_frame_s": first,
        "glass_to_glass_s": summarize(g2g) | {"p95": sorted(g2g)[int(0.95 * (len(g2g) - 1))] if g2g else None},
        "controls_sent": len(run.sent),
        "chunks_received": len(run.chunks),
        "applied_seqs": [c.get("applied_seq") for c in run.chunks],
        "errors": run.errors,
        "server_session": server,
        "server_stats_last": run.stats[-1] if run.stats else None,
    }


def use_loopback_if_local(url: str) -> None:
    """A loopback server only accepts loopback candidates: gather ours on 127.0.0.1 too."""
    host = urlsplit(url).hostname or ""
    use_loopback_candidates(host in ("127.0.0.1", "localhost", "::1"))


async def run_replay(args: argparse.Namespace) -> dict[str, Any]:
    trace = Trace.load(args.trace)
    use_loopback_if_local(args.url)
    client = WebRTCClient(args.url, args.token)
    try:
        await client.start(args.scene, args.prompt, args.seed)
        print(f"session {client.session['session_id']} connected; replaying {args.duration_s:g} s", file=sys.stderr)  # type: ignore[index]
        await client.replay(trace, args.duration_s)
        server = await client.server_session()
    finally:
        await client.close()
    fps = client.run.ready["fps"] if client.run.ready else 16
    headers = {"authorization": f"Bearer {args.token}"} if args.token else {}
    async with httpx.AsyncClient(base_url=args.url, timeout=30, headers=headers) as http:
        engine = (await http.get("/v1/engine")).json()
    out = report(client.run, fps, args.duration_s, server)
    out["server_event_loop_lag_p99_s"] = engine.get("event_loop_lag_p99_s")
    out["server_stage_busy_idle_s"] = engine.get("stage_busy_idle_s")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.webrtc_replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--trace", type=Path, default=ASSETS / "default_trace.json")
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--scene", default="main-street")
    p.add_argument("--prompt", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token", default=None, help="API token, if the server requires one")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    result = asyncio.run(run_replay(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    g2g = result["glass_to_glass_s"]
    print(
        f"client FPS {result['client_fps'] or 0:.2f} ({result['frames_received']}/{result['frames_expected']} frames), "
        f"jitter p99 {1000 * (result['jitter_s']['p99'] or 0):.1f} ms, "
        f"first frame {result['first_frame_s'] or 0:.2f} s, "
        f"glass-to-glass p50 {g2g['p50'] or 0:.2f} s p95 {g2g['p95'] or 0:.2f} s, "
        f"server event-loop lag p99 {1000 * (result['server_event_loop_lag_p99_s'] or 0):.1f} ms"
    )
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
