"""An async Python client for a worldrtc server: start a session, steer it, receive its frames.

    import asyncio
    import worldrtc

    async def main() -> None:
        async with worldrtc.Session("http://127.0.0.1:8000") as session:  # default scene, seed 0
            session.press("w")                       # walk forward
            async for frame in session.frames(limit=32):
                print(frame.pts, frame.image.shape)  # [H, W, 3] uint8 RGB
            print(session.glass_to_glass_s())        # control sent -> its first frame received

    asyncio.run(main())

A spectator watches someone else's session with the `watch_url` and `watch_token` of its create
response (the driver shares them): `Session.watching(url, watch_url, watch_token)` receives the same
video and the session's `chunk`/`stats`/`done` messages, and cannot steer.

It signals through the REST API (`POST /v1/sessions`, then the offer) or, with `whep=True`, through
the WHEP endpoint (`POST /v1/whep`, RFC 9725), and connects with stock aiortc: no patches, so it
works wherever any WebRTC client does. With `control=True` (the default) it opens the `control` data
channel to steer; without it, it only watches. It sends nothing it is not asked to (no heartbeat: the
server watches the connection itself). Every received frame is recorded (`run.frames`: time, pts,
and the frame number stamped into the picture by the synthetic model) for delivery figures; the
last `keep_frames` decoded images wait in `frames()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from workers.frame_stamp import read_stamp
from worldrtc.frames import ContentIds, ReceivedFrame, glass_to_glass_s, prompt_to_frame_s

SYNTHETIC = "synthetic"  # the model whose frames carry their own frame numbers
CONTROL_TYPES = ("control", "control_state", "look", "reset_pose")
OPEN_TIMEOUT_S = 20.0  # answer applied -> control channel open
FIRST_FRAME_TIMEOUT_S = 120.0  # watch-only: answer applied -> first frame (a big model's first chunk)
HEAD_POLL_S = 0.5  # the waiting room: how often the ticket at the head of the line polls


class ClientError(RuntimeError):
    """The server refused a request; `code` is its error code (see the table in docs/api.md)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Frame:
    image: np.ndarray  # [H, W, 3] uint8 RGB
    pts: int  # 90 kHz, on the session's clock (the first frame is 0)
    received_t: float  # this process's perf_counter seconds


@dataclass
class ClientRun:
    """What the client saw. Times are this process's perf_counter seconds."""

    started_t: float = field(default_factory=time.perf_counter)
    frames: list[ReceivedFrame] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)  # the server's `chunk` messages
    errors: list[dict[str, Any]] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)
    ready: dict[str, Any] | None = None
    sent: dict[int, float] = field(default_factory=dict)  # control seq -> send time
    prompts_sent: list[tuple[str, float]] = field(default_factory=list)  # (text, send time) of each prompt
    done: dict[str, Any] | None = None
    # The session pts of this viewer's first frame (`video_start`): a receiver counts pts from its own
    # first frame, so a spectator that joined late is offset. 0 for a driver.
    pts_origin: int | None = None
    first_frame_t: float | None = None
    rewinds: list[dict[str, Any]] = field(default_factory=list)  # `rewound` messages: restored to a snapshot
    # The waiting room: (time, what the poll said) for each poll of the ticket, and `turn_ending` messages.
    waits: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    turn_endings: list[dict[str, Any]] = field(default_factory=list)
    pongs: list[dict[str, Any]] = field(default_factory=list)  # answers to `ping`, each with its received_t

    def session_frames(self) -> list[ReceivedFrame]:
        """`frames` with pts on the session's clock (what the `chunk` messages' pts ranges use)."""
        origin = self.pts_origin or 0
        return [replace(f, pts=f.pts + origin) for f in self.frames] if origin else list(self.frames)

    @property
    def stamped(self) -> bool:
        return self.ready is not None and self.ready.get("model") == SYNTHETIC


def _luma(frame: Any) -> np.ndarray:
    """The Y plane of a decoded yuv420p frame, as a view (no conversion)."""
    plane = frame.planes[0]
    return np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)[:, : plane.width]


def _error(r: httpx.Response) -> ClientError:
    try:
        body = r.json()
        return ClientError(r.status_code, str(body.get("error")), str(body.get("message")))
    except (ValueError, AttributeError):
        return ClientError(r.status_code, "http_error", r.text[:200])


class Session:
    def __init__(
        self,
        url: str,
        *,
        scene: str | None = None,
        prompt: str = "",
        seed: int = 0,
        dispatch: str | None = None,
        token: str | None = None,
        whep: bool = False,
        control: bool = True,
        keep_frames: int = 16,
        watch: tuple[str, str] | None = None,
        snapshot: str | None = None,
        queue: bool = True,
        poll_s: float = 1.0,
    ) -> None:
        """`snapshot`: start a branch from it (its session's image, prompt and seed; `token` must be
        a token of its session's line, or the API token). `queue`: when every slot is taken, wait in
        the server's line (polling the ticket every `poll_s`; `run.waits` keeps what each poll said)
        rather than fail with 429 busy."""
        self.url = url.rstrip("/")
        self.request: dict[str, Any] = {"scene": scene, "prompt": prompt, "seed": seed, "dispatch": dispatch}
        if snapshot is not None:
            self.request = {"snapshot": snapshot, "dispatch": dispatch}
        if not queue:
            self.request["queue"] = False
        self.poll_s = poll_s
        self.ticket: dict[str, Any] | None = None  # the waiting room's 202, while waiting
        self.whep, self.control, self.watch = whep, control and watch is None, watch
        self._auth = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=self.url, headers=self._auth, timeout=30)
        self.pc = RTCPeerConnection()
        # A spectator's channel only receives: the session's ready, chunk, stats and done.
        label = "control" if self.control else "watch" if watch is not None else None
        self.channel = self.pc.createDataChannel(label) if label else None
        self.run = ClientRun()
        self.info: dict[str, Any] | None = None  # the server's session record (REST) or {"resource": …} (WHEP)
        self._images: asyncio.Queue[tuple[Any, int, float]] = asyncio.Queue(maxsize=keep_frames)  # decoded, unconverted
        self._seq = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ready = asyncio.Event()
        self._video = asyncio.Event()
        self._content_ids = ContentIds()

    @classmethod
    def watching(cls, url: str, watch_url: str, watch_token: str, *, keep_frames: int = 16) -> Session:
        """A spectator of the session whose create response gave `watch_url` and `watch_token`."""
        return cls(url, watch=(watch_url, watch_token), keep_frames=keep_frames)

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    # ---- connecting ----

    async def start(self) -> Session:
        """Create the session and connect; returns once it streams (steering channel open, or video)."""
        self.pc.addTransceiver("video", direction="recvonly")
        self.pc.on("track", self._on_track)
        if self.channel is not None:
            self.channel.on("message", self._on_message)
            self.channel.on("open", self._ready.set)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = self.pc.localDescription.sdp
        if self.watch is not None:
            answer = await self._offer_watch(offer)
        else:
            answer = await (self._offer_whep(offer) if self.whep else self._offer_rest(offer))
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        if self.control:
            await asyncio.wait_for(self._ready.wait(), OPEN_TIMEOUT_S)
        else:
            await asyncio.wait_for(self._video.wait(), FIRST_FRAME_TIMEOUT_S)
        return self

    async def _offer_rest(self, offer: str) -> str:
        body = {k: v for k, v in self.request.items() if v is not None}
        r = await self.http.post("/v1/sessions", json=body)
        if r.status_code == 202:
            self.info = await self._wait_in_line(r.json())
        elif r.status_code == 201:
            self.info = r.json()
        else:
            raise _error(r)
        sid, token = self.info["session_id"], self.info["token"]
        r = await self.http.post(
            self.info.get("offer_url") or f"/v1/sessions/{sid}/offer",  # the node that holds the session
            json={"sdp": offer, "type": "offer"},
            headers={"authorization": f"Bearer {token}"},
        )
        if r.status_code != 200:
            raise _error(r)
        return str(r.json()["sdp"])

    async def _wait_in_line(self, ticket: dict[str, Any]) -> dict[str, Any]:
        """Poll the ticket until its session is ready; that session's create answer."""
        self.ticket = ticket
        auth = {"authorization": f"Bearer {ticket['ticket_token']}"}
        while True:
            self.run.waits.append((time.perf_counter(), ticket))
            if ticket["state"] != "waiting":
                self.ticket = None
                session: dict[str, Any] = ticket["session"]
                return session
            # The head of the line polls faster (within the server's 2 a second): its seat may come any moment.
            await asyncio.sleep(self.poll_s if ticket["position"] > 1 else min(self.poll_s, HEAD_POLL_S))
            r = await self.http.get(self.ticket["poll_url"], headers=auth)
            if r.status_code == 429:  # polled too fast: the server says when to come back
                await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                continue
            if r.status_code != 200:
                raise _error(r)
            ticket = r.json()

    async def leave_queue(self) -> None:
        """Give up the place in line (a no-op once the ticket's session is ready)."""
        if self.ticket is not None:
            auth = {"authorization": f"Bearer {self.ticket['ticket_token']}"}
            await self.http.delete(self.ticket["poll_url"], headers=auth)
            self.ticket = None

    async def _offer_whep(self, offer: str) -> str:
        query = urlencode({k: v for k, v in self.request.items() if v not in (None, "")})
        r = await self.http.post(
            f"/v1/whep?{query}" if query else "/v1/whep", content=offer, headers={"content-type": "application/sdp"}
        )
        if r.status_code != 201:
            raise _error(r)
        self.info = {"resource": r.headers["location"], "links": r.headers.get_list("link")}
        return r.text

    async def _offer_watch(self, offer: str) -> str:
        assert self.watch is not None
        watch_url, token = self.watch
        r = await self.http.post(
            watch_url, content=offer, headers={"content-type": "application/sdp", "authorization": f"Bearer {token}"}
        )
        if r.status_code != 201:
            raise _error(r)
        self.info = {"resource": r.headers["location"], "links": r.headers.get_list("link"), "token": token}
        return r.text

    async def close(self) -> dict[str, Any] | None:
        """End the session (DELETE) and the connection; returns the server's final record, if any."""
        final = None
        with contextlib.suppress(httpx.HTTPError):
            await self.leave_queue()  # closed while waiting in line
        if self.info is not None:
            try:
                if "resource" in self.info:
                    own = {"authorization": f"Bearer {self.info['token']}"} if "token" in self.info else {}
                    r = await self.http.delete(self.info["resource"], headers=own)
                else:
                    token = {"authorization": f"Bearer {self.info['token']}"}
                    r = await self.http.delete(self._session_url(), headers=token)
                if r.status_code == 200 and r.headers.get("content-type", "").startswith("application/json"):
                    final = r.json()
            except httpx.TransportError:
                pass  # the server is gone: there is nothing to end there
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pc.close()
        await self.http.aclose()
        return final

    def _session_url(self) -> str:
        assert self.info is not None
        return str(self.info.get("session_url") or f"/v1/sessions/{self.info['session_id']}")

    async def save(self) -> dict[str, Any]:
        """Snapshot the world at its next chunk boundary (REST sessions): the server's SnapshotInfo."""
        return await self._post_own("/snapshots", None, 201)

    async def restore(self, snapshot_id: str) -> dict[str, Any]:
        """Rewind this session to a snapshot of its line, in place (REST sessions)."""
        return await self._post_own("/restore", {"snapshot": snapshot_id}, 200)

    async def _post_own(self, suffix: str, body: dict[str, Any] | None, status: int) -> dict[str, Any]:
        assert self.info is not None and "token" in self.info and "session_id" in self.info, "a REST session only"
        own = {"authorization": f"Bearer {self.info['token']}"}
        r = await self.http.post(self._session_url() + suffix, json=body, headers=own)
        if r.status_code != status:
            raise _error(r)
        return dict(r.json())

    async def server_info(self) -> dict[str, Any]:
        """The server's record of this session (REST sessions)."""
        return await self._get_own("")

    async def timeline(self) -> dict[str, Any]:
        """The session's recent stage timeline (REST sessions): `python -m benchmarks.timeline` draws it."""
        return await self._get_own("/timeline")

    async def recording(self) -> dict[str, Any]:
        """What regenerates the session so far (REST sessions): `python -m benchmarks.replay
        --recording` checks it. After `close()` it stays at `info["recording_url"]` while listed."""
        return await self._get_own("/recording")

    async def save_video(self, path: str) -> int:
        """The frames generated so far, as generated, into an MP4 at `path`; returns its bytes."""
        assert self.info is not None and "session_id" in self.info, "a WHEP session has no REST record"
        r = await self.http.get(self._session_url() + "/video.mp4")
        if r.status_code != 200:
            raise _error(r)
        with open(path, "wb") as f:
            f.write(r.content)
        return len(r.content)

    async def _get_own(self, suffix: str) -> dict[str, Any]:
        assert self.info is not None and "session_id" in self.info, "a WHEP session has no REST record"
        r = await self.http.get(self._session_url() + suffix)
        if r.status_code != 200:
            raise _error(r)
        return dict(r.json())

    # ---- steering ----

    def send(self, message: dict[str, Any]) -> int:
        """Send a data-channel message (adds `seq` and `t`); returns its seq."""
        assert self.channel is not None, "this session has no control channel (control=False)"
        self._seq += 1
        now = time.perf_counter()
        if message.get("type") in CONTROL_TYPES:
            self.run.sent[self._seq] = now
        elif message.get("type") == "prompt":
            self.run.prompts_sent.append((str(message.get("text", "")), now))
        self.channel.send(json.dumps({**message, "seq": self._seq, "t": now * 1000}))
        return self._seq

    def press(self, key: str) -> int:
        return self.send({"type": "control", "key": key, "action": "press"})

    def release(self, key: str) -> int:
        return self.send({"type": "control", "key": key, "action": "release"})

    def hold(self, *keys: str) -> int:
        """Hold exactly these keys (releases the others)."""
        return self.send({"type": "control_state", "controls": list(keys)})

    def look(self, dx_px: float, dy_px: float) -> int:
        return self.send({"type": "look", "dx": dx_px, "dy": dy_px})

    def reset_pose(self) -> int:
        return self.send({"type": "reset_pose"})

    def ping(self) -> int:
        """The server answers `pong` (in `run.pongs`) once it has read every message sent before."""
        return self.send({"type": "ping"})

    def prompt(self, text: str, transition_chunks: int = 1) -> int:
        """Change the world's prompt from the next chunk the DiT starts, blended over
        `transition_chunks` chunks; each chunk message's `prompt` says what its DiT read."""
        return self.send({"type": "prompt", "text": text, "transition_chunks": transition_chunks})

    # ---- receiving ----

    async def next_frame(self) -> Frame:
        """The oldest decoded frame not taken yet (a slow consumer gets the newest `keep_frames`)."""
        frame, pts, t = await self._images.get()
        return Frame(frame.to_ndarray(format="rgb24"), pts + (self.run.pts_origin or 0), t)

    async def latest_frame(self) -> Frame:
        """The newest decoded frame (older ones not taken yet are skipped); waits for one if none."""
        while self._images.qsize() > 1:
            self._images.get_nowait()
        return await self.next_frame()

    async def frames(self, limit: int | None = None) -> AsyncIterator[Frame]:
        """Decoded frames as they arrive, as `next_frame` gives them."""
        n = 0
        while limit is None or n < limit:
            yield await self.next_frame()
            n += 1

    def chunk_at(self, pts: int) -> dict[str, Any] | None:
        """The `chunk` message whose frames include `pts` (None for a repeated frame, or not yet known)."""
        step = 90_000 // (self.run.ready or {}).get("fps", 16)
        for chunk in self.run.chunks:
            for _, start, n in chunk.get("parts", ()):
                if start <= pts <= start + (n - 1) * step and (pts - start) % step == 0:
                    return chunk
        return None

    def glass_to_glass_s(self) -> list[float]:
        """Per control sent: seconds until the first frame of the first chunk that applied it arrived."""
        return glass_to_glass_s(self.run.session_frames(), self.run.chunks, self.run.sent, self.run.stamped)

    def prompt_to_frame_s(self) -> list[float]:
        """Per prompt sent: seconds until the first frame of the first chunk whose DiT read it arrived."""
        run = self.run
        return prompt_to_frame_s(run.session_frames(), run.chunks, run.prompts_sent, run.stamped)

    def _on_track(self, track: MediaStreamTrack) -> None:
        task = asyncio.get_running_loop().create_task(self._receive(track))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _receive(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return  # the track ended
            t = time.perf_counter()
            luma = _luma(frame)
            stamp = read_stamp(luma) if self.run.stamped else None
            pts = int(frame.pts or 0)
            self.run.frames.append(ReceivedFrame(t, pts, stamp, self._content_ids(luma)))
            if self.run.first_frame_t is None:
                self.run.first_frame_t = t
            self._video.set()
            if self._images.full():
                self._images.get_nowait()  # keep the newest
            self._images.put_nowait((frame, pts, t))

    def _on_message(self, data: str | bytes) -> None:
        msg = json.loads(data)
        msg["received_t"] = time.perf_counter()
        kind = msg.get("type")
        if kind == "chunk":
            self.run.chunks.append(msg)
        elif kind == "ready":
            self.run.ready = msg
        elif kind == "stats":
            self.run.stats.append(msg)
        elif kind == "error":
            self.run.errors.append(msg)
        elif kind == "done":
            self.run.done = msg
        elif kind == "video_start":
            self.run.pts_origin = int(msg["pts"])
        elif kind == "rewound":
            self.run.rewinds.append(msg)
        elif kind == "turn_ending":
            self.run.turn_endings.append(msg)
        elif kind == "pong":
            self.run.pongs.append(msg)
