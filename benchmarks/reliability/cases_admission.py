"""Rows 1-3: who gets a session, how fast the rest are told no, and bodies refused before they cost.

1 admission       max_sessions 2, 10 concurrent creates
2 create rate     50 creates in 10 s from one address; another address meanwhile
3 body limits     a declared 10 MiB body, the same chunked, a decompression bomb, a 1 MiB prompt
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import select
import socket
import struct
import time
import zlib

import httpx

from benchmarks.reliability.harness import (
    CaseResult,
    Lab,
    ServerConfig,
    ServerUnderTest,
    at_least,
    at_most,
    below,
    case,
    equal,
    holds,
)
from benchmarks.stats import summarize

# Creation is limited per address (row 2): rows that create many sessions lift the limit.
UNLIMITED = ServerConfig().with_env(create_burst=100_000)
OTHER_CLIENT = "127.0.0.2"  # loopback too: a second address for the same server


def _delete_all(server: ServerUnderTest) -> None:
    for s in server.sessions():
        if s["state"] in ("created", "connecting", "streaming"):
            server.http.delete(f"/v1/sessions/{s['session_id']}")


@case(1, "admission", "max_sessions 2, 10 concurrent creates", "exactly 2 admitted; 429 + Retry-After in < 100 ms p99")
def admission(lab: Lab, r: CaseResult) -> None:
    server = lab.server(UNLIMITED)
    _delete_all(server)
    base = server.resources()

    async def create(http: httpx.AsyncClient) -> tuple[int, float, str | None]:
        t0 = time.perf_counter()
        resp = await http.post("/v1/sessions", json={})
        return resp.status_code, time.perf_counter() - t0, resp.headers.get("retry-after")

    async def burst() -> list[tuple[int, float, str | None]]:
        limits = httpx.Limits(max_connections=10)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as http:
            await http.get("/healthz")  # connections open before the burst
            return await asyncio.gather(*(create(http) for _ in range(10)))

    replies = asyncio.run(burst())
    admitted = [x for x in replies if x[0] == 201]
    refused = [x for x in replies if x[0] == 429]
    refusal_s = summarize([x[1] for x in refused])
    live = [s for s in server.sessions() if s["state"] == "created"]
    after = server.resources()
    # Re-admission: close one, then create until admitted.
    victim = live[0]["session_id"] if live else None
    readmit_s = None
    if victim is not None:
        t0 = time.perf_counter()
        server.http.delete(f"/v1/sessions/{victim}")
        while time.perf_counter() - t0 < 5:
            if server.http.post("/v1/sessions", json={}).status_code == 201:
                readmit_s = time.perf_counter() - t0
                break
    _delete_all(server)
    r.figures = {"statuses": sorted(x[0] for x in replies), "refusal_s": refusal_s, "readmit_s": readmit_s}
    r.checks = [
        equal("sessions admitted", len(admitted), 2),
        equal("creates refused with 429", len(refused), 8),
        holds("every 429 carries Retry-After", all(x[2] for x in refused)),
        below("429 latency p99", refusal_s["p99"], 0.1, " s"),
        equal("sessions the server holds", len(live), 2),
        equal("peer connections allocated", after.peer_connections - base.peer_connections, 0),
        below("re-admitted after a close", readmit_s, 1.0, " s"),
    ]


@case(
    2,
    "create rate per client",
    "50 creates in 10 s from one address",
    "token bucket: 429 + Retry-After; other clients unaffected",
)
def create_rate(lab: Lab, r: CaseResult) -> None:
    server = lab.server(ServerConfig())  # the default limits: 10 at once, then 30 a minute
    model = server.http.get("/v1/model").json()["limits"]
    burst, per_min = model["create_burst"], model["create_rate_per_min"]
    attempts, spread_s = 50, lab.pick(2.0, 10.0)
    other = httpx.Client(base_url=server.url, timeout=30, transport=httpx.HTTPTransport(local_address=OTHER_CLIENT))
    statuses: list[int] = []
    retry_after: list[str | None] = []
    other_statuses: list[int] = []
    t0 = time.monotonic()
    for i in range(attempts):
        time.sleep(max(0.0, t0 + i * spread_s / attempts - time.monotonic()))
        resp = server.http.post("/v1/sessions", json={})
        statuses.append(resp.status_code)
        if resp.status_code == 201:
            server.http.delete(f"/v1/sessions/{resp.json()['session_id']}")
        else:
            retry_after.append(resp.headers.get("retry-after"))
            if resp.status_code == 429 and resp.json()["error"] == "rate_limited" and len(other_statuses) < 3:
                # Meanwhile, another address is not held back.
                o = other.post("/v1/sessions", json={})
                other_statuses.append(o.status_code)
                if o.status_code == 201:
                    other.delete(f"/v1/sessions/{o.json()['session_id']}")
    elapsed_s = time.monotonic() - t0
    other.close()
    admitted = statuses.count(201)
    allowed = burst + elapsed_s * per_min / 60 + 1
    r.figures = {"admitted": admitted, "refused": statuses.count(429), "elapsed_s": elapsed_s, "allowed": allowed}
    r.checks = [
        at_least("creates refused by the bucket", statuses.count(429), 1),
        at_most("creates admitted", admitted, allowed),
        at_least("creates admitted (the burst)", admitted, burst),
        holds("every refusal is 429 with Retry-After ≥ 1 s", all(ra and int(ra) >= 1 for ra in retry_after)),
        holds("another address is admitted meanwhile", bool(other_statuses) and set(other_statuses) == {201}),
    ]


def _raw_request(url: str, head: str, body_chunks: list[bytes], timeout_s: float) -> tuple[int, int]:
    """Send a request by hand, as an uploader on a real link would: a chunk, then a short look for
    an answer; stop as soon as one arrives (or the server stops reading). The send buffer is kept
    small, so that what counts as sent is what the server could have read, not what loopback's
    kernel buffers (megabytes) soaked up. (status, body bytes sent)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.settimeout(timeout_s)
        sock.connect((host, int(port)))
        sock.sendall(head.encode())
        sent = 0
        for chunk in body_chunks:
            if select.select([sock], [], [], 0.005)[0]:
                break  # answered already
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                break
            sent += len(chunk)
        response = b""
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            while b"\r\n\r\n" not in response:
                data = sock.recv(65536)
                if not data:
                    break
                response += data
    status_line = response.split(b"\r\n", 1)[0]
    return (int(status_line.split(b" ")[1]) if status_line else 0), sent


def _png_bomb(side_px: int) -> bytes:
    """A grayscale PNG of `side_px`² zero pixels: a few hundred KiB that decode to side² bytes."""
    row = b"\x00" * (side_px + 1)  # filter byte + pixels
    z = zlib.compressobj(9)
    data = b"".join(z.compress(row) for _ in range(side_px)) + z.flush()

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", side_px, side_px, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


@case(
    3,
    "body limits",
    "declared 10 MiB body; the same chunked; a decompression bomb; a 1 MiB prompt",
    "413/400 before the body is read or decoded; RSS delta < 5 MB",
)
def body_limits(lab: Lab, r: CaseResult) -> None:
    server = lab.server(UNLIMITED)
    _delete_all(server)
    ten_mib = 10 * 1024 * 1024
    hostport = server.url.removeprefix("http://")
    rss0 = server.resources().rss_bytes
    limits = server.http.get("/v1/model").json()["limits"]
    # A create carries its start image as a base64 data URL: the route's body limit is that plus the rest.
    create_limit = limits["image_max_bytes"] * 4 // 3 + limits["rest_body_max_bytes"]

    # A declared length over the limit: answered from the headers, with no body sent at all.
    head = f"POST /v1/sessions HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n"
    declared = _raw_request(server.url, head + f"Content-Length: {ten_mib}\r\n\r\n", [], timeout_s=5)
    # The same without a length: refused once the route's limit is crossed, long before 10 MiB are read.
    piece = 64 * 1024
    chunks = [f"{piece:x}\r\n".encode() + b"x" * piece + b"\r\n" for _ in range(ten_mib // piece)]
    chunked = _raw_request(server.url, head + "Transfer-Encoding: chunked\r\n\r\n", chunks, timeout_s=10)
    bomb_side = 6_000  # 36 Mpx: over the server's cap, under Pillow's own (it would refuse first)
    bomb = "data:image/png;base64," + base64.b64encode(_png_bomb(bomb_side)).decode()
    bomb_r = server.http.post("/v1/sessions", json={"image": bomb})
    prompt_r = server.http.post("/v1/sessions", json={"prompt": "x" * (1024 * 1024)})
    rss1 = server.resources().rss_bytes
    _delete_all(server)

    r.figures = {
        "declared": {"status": declared[0], "body_sent_bytes": declared[1]},
        "chunked": {"status": chunked[0], "body_sent_bytes": chunked[1], "route_limit_bytes": create_limit},
        "bomb": {"status": bomb_r.status_code, "pixels": bomb_side**2, "body": bomb_r.json()},
        "prompt": {"status": prompt_r.status_code, "body": prompt_r.json()},
        "rss_delta_bytes": rss1 - rss0,
    }
    r.checks = [
        equal("declared 10 MiB: status (no body sent)", declared[0], 413),
        equal("chunked 10 MiB: status", chunked[0], 413),
        at_most("chunked: bytes sent before the 413 (route limit + 1 MiB)", chunked[1], create_limit + 2**20),
        equal("decompression bomb: status", bomb_r.status_code, 400),
        holds("bomb refused from its header", "pixels" in bomb_r.json().get("message", ""), bomb_r.json()["message"]),
        equal("1 MiB prompt: status", prompt_r.status_code, 400),
        below("server RSS delta", (rss1 - rss0) / 1e6, 5.0, " MB"),
    ]
