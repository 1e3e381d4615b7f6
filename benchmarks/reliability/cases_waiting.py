"""Rows 32-37: the waiting room (server/waiting_room/line.py, server/waiting_room/usher.py) under abuse, no-shows,
shutdown, a killed driver and a crowd that polls; and saves on disk through a crash.

32 ticket flood     30 creates and a poll flood from one address while the one slot is taken
33 no-show          a ticket's turn comes and its holder never offers
34 SIGTERM in line  SIGTERM with a driver streaming and the line full
35 driver killed    the driver's process is killed mid-turn while someone waits
36 polling crowd    50 tickets polling every second while two drivers stream
37 SIGKILL, saves   a server killed mid-save and restarted on its snapshot directory (server/snapshots/saves.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from typing import Any

import httpx
import psutil

from benchmarks.local_server import start_server
from benchmarks.reliability.cases_lifecycle import exit_within
from benchmarks.reliability.harness import (
    LAG_BOUND_S,
    CaseResult,
    Lab,
    PeerProcess,
    ServerConfig,
    alive,
    at_least,
    at_most,
    below,
    case,
    equal,
    holds,
    kill_group,
    lag_p99_bound_s,
    leak_checks,
    wait_for,
)
from workers.runtime.channel import leaked_segments
from worldrtc import Session

FPS = 16  # the synthetic model's frame rate (the harness's default server)
OTHER_CLIENT = "127.0.0.2"  # loopback too: a second address for the same server
# The harness's servers refuse when full (WORLDRTC_QUEUE=false): these rows turn the line on.
QUEUED = ServerConfig().with_env(queue="true", max_sessions=1, create_burst=100_000)


def _poll(http: httpx.Client, ticket: dict[str, Any]) -> httpx.Response:
    return http.get(ticket["poll_url"], headers={"authorization": f"Bearer {ticket['ticket_token']}"})


def _leave(http: httpx.Client, ticket: dict[str, Any]) -> None:
    http.delete(ticket["poll_url"], headers={"authorization": f"Bearer {ticket['ticket_token']}"})


@case(
    32,
    "ticket flood",
    "the one slot taken; 30 creates from one address, then 20 polls at once of one ticket",
    "2 tickets for the address, the rest 429 queue_full with Retry-After; another address still gets one; "
    "the poll flood meets 429 rate_limited; every refusal counted; nothing left once they leave",
)
def ticket_flood(lab: Lab, r: CaseResult) -> None:
    server = lab.server(QUEUED)
    holder = server.http.post("/v1/sessions", json={}).json()
    base = server.resources()  # a ticket costs no task, socket or thread: measured with the slot held
    replies = [server.http.post("/v1/sessions", json={}) for _ in range(30)]
    tickets = [x.json() for x in replies if x.status_code == 202]
    refused = [x for x in replies if x.status_code == 429]
    other = httpx.Client(base_url=server.url, timeout=30, transport=httpx.HTTPTransport(local_address=OTHER_CLIENT))
    other_reply = other.post("/v1/sessions", json={})
    polls = [_poll(server.http, tickets[0]).status_code for _ in range(20)] if tickets else []
    refused_metric = server.metric("worldrtc_sessions_refused_total", reason="queue_full")
    for ticket in tickets:
        _leave(server.http, ticket)
    if other_reply.status_code == 202:
        _leave(other, other_reply.json())
    other.close()
    settled = wait_for(lambda: server.resources().back_to(base), 10)
    end = server.resources()
    server.http.delete(f"/v1/sessions/{holder['session_id']}")
    r.figures = {
        "statuses": sorted(x.status_code for x in replies),
        "other_address": other_reply.status_code,
        "polls": polls,
        "settled_s": settled,
    }
    r.checks = [
        equal("tickets for the flooding address", len(tickets), 2),
        equal("creates refused", len(refused), 28),
        holds(
            "every refusal is 429 queue_full with Retry-After",
            all(x.json()["error"] == "queue_full" and x.headers.get("retry-after") for x in refused),
        ),
        equal("refusals counted (worldrtc_sessions_refused_total{reason=queue_full})", refused_metric, 28.0),
        equal("another address still gets a ticket", other_reply.status_code, 202),
        at_least("polls answered 429 in the flood", polls.count(429), 1),
        equal("polls answered otherwise than 200 or 429", [p for p in polls if p not in (200, 429)], []),
        equal("tickets waiting once they left", server.metric("worldrtc_queue_length"), 0.0),
        *leak_checks(base, end),
    ]


@case(
    33,
    "no-show",
    "the slot frees for a ticket whose holder polls but never offers (connect window 2 s)",
    "its poll says ready, then 410 no_show; the slot passes to the next ticket within the window + 1 s",
)
def no_show(lab: Lab, r: CaseResult) -> None:
    window_s = 2.0
    server = lab.server(QUEUED.with_env(connect_window_s=window_s, queue_per_client=5))
    holder = server.http.post("/v1/sessions", json={}).json()
    absent, next_one = (server.http.post("/v1/sessions", json={}).json() for _ in range(2))
    server.http.delete(f"/v1/sessions/{holder['session_id']}")
    became_ready = wait_for(lambda: _poll(server.http, absent).json()["state"] == "ready", 5, poll_s=0.6)
    ready_t = time.monotonic()
    absent_session = _poll(server.http, absent).json()["session"]["session_id"]
    passed_s = wait_for(lambda: _poll(server.http, next_one).json()["state"] == "ready", window_s + 5, poll_s=0.6)
    gone = _poll(server.http, absent)
    passed_after_s = time.monotonic() - ready_t if passed_s is not None else None
    ended = server.wait_ended(absent_session, 5)
    seated = _poll(server.http, next_one).json().get("session", {}).get("session_id")
    _leave(server.http, next_one)
    if seated:
        server.wait_ended(seated, 5)
    r.figures = {"ready_after_s": became_ready, "passed_on_after_s": passed_after_s, "gone": gone.json()}
    r.checks = [
        holds("the absent holder's ticket became ready", became_ready is not None),
        at_most("slot passed on after the ticket was ready", passed_after_s, window_s + 1.0, " s"),
        equal("the absent holder's next poll", [gone.status_code, gone.json().get("error")], [410, "ticket_gone"]),
        holds("it says why", "no offer within" in gone.json().get("message", ""), gone.json().get("message")),
        equal("its session's end", ended[1], "no_offer"),
        equal("no-shows counted", server.metric("worldrtc_queue_dropped_total", reason="no_show"), 1.0),
    ]


@case(
    34,
    "SIGTERM with a full line",
    "a driver streaming, 3 tickets (the line's most), one more create, then SIGTERM (drain 2 s)",
    "the 4th create 429 queue_full; while draining polls answer 503 draining with Retry-After; exit 0; "
    "no process or shared-memory segment left",
)
def sigterm_full_line(lab: Lab, r: CaseResult) -> None:
    config = QUEUED.with_env(queue_max=3, queue_per_client=5, drain_timeout_s=2)
    process = start_server(list(config.args), lab.log_dir / "sigterm-line.log", env=dict(config.env))
    figures: dict[str, Any] = {}
    try:

        async def run() -> None:
            driver = await Session(process.url).start()
            await asyncio.wait_for(driver.next_frame(), 60)
            async with httpx.AsyncClient(base_url=process.url, timeout=30) as http:
                tickets = [(await http.post("/v1/sessions", json={})).json() for _ in range(3)]
                fourth = await http.post("/v1/sessions", json={})
                figures["fourth"] = [fourth.status_code, fourth.json().get("error")]
                pids = [p.pid for p in psutil.Process(process.proc.pid).children(recursive=True)]
                figures["pids"] = [process.proc.pid, *pids]
                process.proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                auth = {"authorization": f"Bearer {tickets[0]['ticket_token']}"}
                during = await http.get(tickets[0]["poll_url"], headers=auth)
                figures["poll_while_draining"] = [during.status_code, during.json().get("error")]
                figures["retry_after"] = during.headers.get("retry-after")
            code, exit_s = await asyncio.get_running_loop().run_in_executor(None, exit_within, process, 30)
            figures["exit"] = [code, exit_s]
            # Read at once, before anything here kills what is left: an exit means all are gone.
            figures["left_at_exit"] = [pid for pid in figures["pids"] if alive(pid)]
            figures["driver_done"] = (driver.run.done or {}).get("code")
            await driver.close()

        asyncio.run(run())
    finally:
        kill_group(process)
    segments = sum(len(leaked_segments(pid)) for pid in figures.get("pids", []))
    r.figures = figures
    r.checks = [
        equal("the create past the line's most", figures.get("fourth"), [429, "queue_full"]),
        equal("a poll while draining", figures.get("poll_while_draining"), [503, "draining"]),
        holds("with Retry-After", bool(figures.get("retry_after"))),
        equal("exit status", (figures.get("exit") or [None])[0], 0),
        at_most("exited after the signal", (figures.get("exit") or [None, None])[1], 2 + 5, " s"),
        equal("the driver's done code", figures.get("driver_done"), "server_shutdown"),
        equal("processes left at the exit", figures.get("left_at_exit"), []),
        equal("shared-memory segments left", segments, 0),
    ]


@case(
    35,
    "driver killed mid-turn",
    "the driver (its own process) is killed with SIGKILL while a client waits in line",
    "the waiting client's first frame within peer_timeout_s + 4 s of the kill",
)
def driver_killed(lab: Lab, r: CaseResult) -> None:
    server = lab.server(QUEUED.with_env(max_turn_s=60))
    peer_s = float(server.http.get("/v1/model").json().get("limits", {}).get("peer_timeout_s", 4.5))
    driver = PeerProcess("hang", server.url, "--frames", "8")
    figures: dict[str, Any] = {}
    try:
        streaming = driver.event(60)

        async def run() -> None:
            waiting = Session(server.url, poll_s=0.5)
            start = asyncio.create_task(waiting.start())
            await asyncio.sleep(1.5)  # in line, polling
            figures["position"] = waiting.run.waits[-1][1].get("position") if waiting.run.waits else None
            killed_t = time.perf_counter()
            driver.kill()
            try:
                await asyncio.wait_for(start, 30)
                await asyncio.wait_for(waiting.next_frame(), 30)
                figures["first_frame_after_kill_s"] = waiting.run.frames[0].t - killed_t
            finally:
                await waiting.close()

        asyncio.run(run())
    finally:
        driver.kill()
    _, ended = server.wait_ended(streaming["session_id"], 10)
    r.figures = figures | {"driver_end": ended, "peer_timeout_s": peer_s}
    r.checks = [
        equal("the waiting client's place", figures.get("position"), 1),
        equal("the killed driver's end", ended, "peer_gone"),
        below("next driver's first frame after the kill", figures.get("first_frame_after_kill_s"), peer_s + 4, " s"),
    ]


@case(
    36,
    "polling crowd",
    "two drivers stream while 50 tickets poll every second",
    "every poll answered 200; the drivers keep their frame rate (unique frames ≥ 0.95 of it); "
    f"event-loop lag p99 < {LAG_BOUND_S * 1000:.0f} ms",
)
def polling_crowd(lab: Lab, r: CaseResult) -> None:
    server = lab.server(QUEUED.with_env(max_sessions=2, queue_per_client=60, queue_max=60))
    seconds = lab.pick(8.0, 30.0)
    figures: dict[str, Any] = {}

    async def run() -> None:
        drivers = [await Session(server.url).start() for _ in range(2)]
        for d in drivers:
            await asyncio.wait_for(d.next_frame(), 60)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            tickets = [(await http.post("/v1/sessions", json={})).json() for _ in range(50)]
            statuses: list[int] = []

            async def poll_every_second(ticket: dict[str, Any]) -> None:
                auth = {"authorization": f"Bearer {ticket['ticket_token']}"}
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    statuses.append((await http.get(ticket["poll_url"], headers=auth)).status_code)
                    await asyncio.sleep(1.0)

            lag_before = server.lag_histogram()
            counted = [len({f.content_id for f in d.run.frames}) for d in drivers]
            t0 = time.perf_counter()
            await asyncio.gather(*(poll_every_second(t) for t in tickets if "poll_url" in t))
            elapsed = time.perf_counter() - t0
            unique = [len({f.content_id for f in d.run.frames}) - c for d, c in zip(drivers, counted, strict=True)]
            figures["lag_p99_bound_s"] = lag_p99_bound_s(lag_before, server.lag_histogram())
            figures["tickets"] = sum("poll_url" in t for t in tickets)
            figures["polls"] = len(statuses)
            figures["not_200"] = [s for s in statuses if s != 200]
            figures["unique_fps"] = [u / elapsed for u in unique]
            for t in tickets:
                if "poll_url" in t:
                    await http.delete(t["poll_url"], headers={"authorization": f"Bearer {t['ticket_token']}"})
        for d in drivers:
            await d.close()

    asyncio.run(run())
    r.figures = figures
    r.checks = [
        equal("tickets", figures.get("tickets"), 50),
        at_least("polls answered", figures.get("polls"), int(50 * seconds * 0.8)),
        equal("polls answered otherwise than 200", figures.get("not_200"), []),
        *[at_least(f"driver {i} unique fps", v, 0.95 * FPS) for i, v in enumerate(figures.get("unique_fps", []))],
        below("event-loop lag p99 bound", figures.get("lag_p99_bound_s"), LAG_BOUND_S + 1e-9, " s"),
    ]


@case(
    37,
    "SIGKILL with saves on disk",
    "3 saves written; SIGKILL while a 4th is being saved; one save corrupted by a flipped byte and one left "
    "without its manifest (a crash mid-write); restart",
    "every save intact (GET 200, a branch streams) or reported corrupt by its checksum (410 saying so); "
    "none half-written: the interrupted one complete or removed",
)
def sigkill_with_saves(lab: Lab, r: CaseResult) -> None:
    saves = lab.log_dir / "saves-37"
    config = ServerConfig().with_env(snapshot_dir=saves)
    figures: dict[str, Any] = {}
    first = start_server(list(config.args), lab.log_dir / "saves-37-first.log", env=dict(config.env))
    try:

        async def save_then_kill() -> tuple[list[str], str]:
            driver = await Session(first.url).start()
            await asyncio.wait_for(driver.next_frame(), 60)
            assert driver.info is not None
            token = str(driver.info["token"])
            ids = [str((await driver.save())["snapshot_id"]) for _ in range(3)]
            # The 4th save is asked for and the server killed while it is under way.
            auth = {"authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=first.url, timeout=5) as http:
                pending = asyncio.create_task(
                    http.post(f"/v1/sessions/{driver.info['session_id']}/snapshots", headers=auth)
                )
                await asyncio.sleep(0.05)
                # The server process alone, as the kernel's OOM killer would: its workers see it go
                # and exit on their own (row 11), releasing their shared memory.
                workers = [p.pid for p in psutil.Process(first.proc.pid).children(recursive=True)]
                os.kill(first.proc.pid, signal.SIGKILL)
                with contextlib.suppress(httpx.HTTPError):
                    await pending
                await asyncio.get_running_loop().run_in_executor(
                    None, wait_for, lambda: not any(alive(p) for p in workers), 10.0
                )
            await driver.close()
            return ids, token

        ids, token = asyncio.run(save_then_kill())
    finally:
        kill_group(first)
    corrupted = ids[1]
    part = next((saves / corrupted).glob("*.safetensors"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    # What a crash between the workers' part files and the server's manifest leaves (the kill above
    # lands wherever the 4th save is; this makes the case certain): parts without a manifest.
    interrupted = saves / "0123456789abcdef"
    interrupted.mkdir()
    for f in (saves / ids[0]).glob("*.safetensors"):
        shutil.copy(f, interrupted / f.name)
    folders_before = sorted(p.name for p in saves.iterdir())
    second = start_server(list(config.args), lab.log_dir / "saves-37-second.log", env=dict(config.env))
    try:
        auth = {"authorization": f"Bearer {token}"}
        answers = {i: httpx.get(f"{second.url}/v1/snapshots/{i}", headers=auth, timeout=10) for i in ids}
        figures["answers"] = {
            i: [a.status_code, a.json().get("where") or a.json().get("message")] for i, a in answers.items()
        }
        half_written = [p.name for p in saves.iterdir() if not (p / "manifest.json").is_file()]
        figures["folders_before_restart"] = len(folders_before)
        figures["folders_after_restart"] = sorted(p.name for p in saves.iterdir())
        figures["interrupted_removed"] = "interrupted before it was complete" in second.log.read_text()

        async def branch() -> float | None:
            t0 = time.perf_counter()
            s = Session(second.url, snapshot=ids[0], token=token)
            try:
                await s.start()
                await asyncio.wait_for(s.next_frame(), 60)
                return time.perf_counter() - t0
            finally:
                await s.close()

        figures["branch_first_frame_s"] = asyncio.run(branch())
    finally:
        second.stop()  # its own clean stop: the workers release their shared memory
    intact = [i for i in ids if i != corrupted]
    gone = answers[corrupted]
    r.figures = figures
    r.checks = [
        equal("intact saves read back", [answers[i].status_code for i in intact], [200, 200]),
        equal("where they are", [answers[i].json().get("where") for i in intact], ["saved", "saved"]),
        equal("the corrupted save", [gone.status_code, gone.json().get("error")], [410, "snapshot_gone"]),
        holds("reported by its checksum", "checksum" in gone.json().get("message", ""), gone.json().get("message")),
        equal("half-written saves after the restart", half_written, []),
        holds("the interrupted save removed, and said so", figures["interrupted_removed"] and not interrupted.exists()),
        below("a branch of an intact save: its first frame", figures["branch_first_frame_s"], 30.0, " s"),
    ]
