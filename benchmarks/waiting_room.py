"""The waiting room: people taking turns at one slot, what they see while they wait, and what a crowd
of tickets costs the driver.

    # the default model (gridworld, 128×128 at 16 FPS, cpu placement): both hand-over modes, 6 people,
    # 20 s turns, then the driver alone vs with 50 tickets polling
    python -m benchmarks.waiting_room --out runs/waiting_room.json
    # one mode, another server configuration (arguments of `python -m server`)
    python -m benchmarks.waiting_room --modes continue --serve "--model gridworld --dispatch jit"
    # a rehearsal in under a minute: the synthetic model, 3 people, 5 s turns, 10 pollers, 3 s windows
    python -m benchmarks.waiting_room --short --out runs/waiting_room-short.json

Phase 1, turns (one server per hand-over mode, `--max-sessions 1 --max-turn-s … --turn-handover MODE`).
`--clients` people arrive `--arrival-interval-s` apart on average (seeded, 0.1 to 1.9 times it),
each a `worldrtc.Session(url, poll_s=…)` that waits in line (polling its ticket) and then connects.
Once streaming, each holds W and drives until its `done` (turn_over: someone waits), except the
last, who drives `--last-drive-s` and leaves. While in line, a person watches the world: from the
first answer of its ticket that carries a `watch_url`, a spectator (`Session.watching`) of that
session; when a later answer names another session (the previous turn ended and the next driver
streams), a new spectator of that one; all closed when the ticket is ready. Every client runs in
this process. They all come from 127.0.0.1, where real people come from addresses of their own, so
the server is started with `--queue-per-client` at the number of clients.

Per mode:

- order: the order people drove in (their driving session's first frame) against their arrival;
- hand-over gap, per turn: the previous driver's `done` received → the next driver's first frame,
  split into done → the next ticket's `ready` answer (the usher seats it, then the client's next
  poll, up to `--poll-s` later) and ready → first frame (offer, ICE, the first chunk; in `continue`
  the world's snapshot comes before the `done`);
- live view: each spectator's unique frames per second (`benchmarks/delivery.py`: frames told apart
  by the session's chunk messages, a repeat is no frame) over its first to last frame, over the frame
  rate; and how much of each person's time in line had video at all (hand-overs have none);
- the first estimate: |the 202's `estimated_wait_s` − the actual wait| (arrival → `ready` answer);
  beside it, every answer's estimate against the wait left when it came;
- the turns: held (ready → `done`), driving (first frame → `done`), the `turn_ending` lead (received →
  `done`, against its `seconds_left`), and each driver's own unique FPS (what any spectator can get
  at most); in `continue`, how many chunks the last driver saw after the snapshot its successor's
  world starts from (the successor's world generates them again).

Phase 2, a crowd in line (one more server, `fresh`, no turns, `--queue-per-client` and
`WORLDRTC_CREATE_BURST` above `--pollers`): a driver holds W; once its video is steady, its unique FPS
over `--window-s` with nobody waiting, then `--pollers` tickets are made (202s) and each polls its
ticket once a second (plain httpx, phases spread over the second), and once all have polled, the
driver's unique FPS over another `--window-s`. The figure is their ratio, within one run; beside it,
the polls answered, any answer other than 200 and the polls' latency.

Targets: hand-over gap p50 ≤ 1.5 s in both modes; the live view's mean ≥ 0.98 of the frame rate;
the driver's unique FPS with the pollers ≥ 0.98 of without.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from benchmarks.delivery import analyze
from benchmarks.local_server import local_server
from benchmarks.stats import environment, summarize
from benchmarks.webrtc_replay import wait_steady
from workers.chunk_geometry import VAE_TIME_STRIDE
from worldrtc import Session
from worldrtc.client import HEAD_POLL_S, ClientRun

HANDOVER_GAP_P50_S = 1.5
LIVE_VIEW_FRACTION = 0.98
CROWD_FPS_RATIO = 0.98

MODES = ("fresh", "continue")
KEY = "w"
LOOK_S = 0.05  # how often a person in line looks at its ticket's latest answer
SETTLE_S = 1.0  # after every poller's first poll, before the crowd's window opens
TURN_SLACK_S = 60.0  # beyond the turns' own length: servers warming sessions, connects, snapshots


@dataclass(frozen=True)
class TurnsConfig:
    clients: int
    arrival_interval_s: float
    max_turn_s: float
    turn_warning_s: float
    last_drive_s: float
    poll_s: float
    seed: int = 0  # of the arrival intervals

    def server_args(self, mode: str) -> list[str]:
        return [
            "--max-sessions",
            "1",
            "--max-turn-s",
            f"{self.max_turn_s:g}",
            "--turn-warning-s",
            f"{self.turn_warning_s:g}",
            "--turn-handover",
            mode,
            "--queue-per-client",
            str(self.clients),
        ]

    @property
    def timeout_s(self) -> float:
        """Every turn at its longest (a warning that comes late pushes the end back), and some."""
        turn = max(self.max_turn_s, self.turn_warning_s) + self.turn_warning_s
        return self.clients * (turn + self.poll_s) + self.last_drive_s + TURN_SLACK_S


@dataclass(frozen=True)
class CrowdConfig:
    pollers: int
    window_s: float
    poll_every_s: float = 1.0

    def server_args(self) -> list[str]:
        per_client, most = str(self.pollers + 10), str(max(100, self.pollers))
        return ["--max-sessions", "1", "--queue-per-client", per_client, "--queue-max", most]

    def server_env(self) -> dict[str, str]:
        """Every ticket is a create from 127.0.0.1: the per-address creation burst must let them all in."""
        return {"WORLDRTC_CREATE_BURST": str(self.pollers + 10)}


@dataclass(frozen=True)
class Config:
    serve: tuple[str, ...]  # arguments of `python -m server`: the model
    modes: tuple[str, ...]
    turns: TurnsConfig
    crowd: CrowdConfig
    out: Path


FULL = Config(
    ("--model", "gridworld"),
    MODES,
    TurnsConfig(6, 0.5, 20.0, 10.0, 5.0, 1.0),
    CrowdConfig(50, 15.0),
    Path("runs/waiting_room.json"),
)
SHORT = replace(
    FULL,
    serve=("--model", "synthetic", "--stage-ms", "10,60,40", "--synthetic-geometry", "tiny"),
    turns=TurnsConfig(3, 0.5, 5.0, 2.0, 2.0, 1.0),
    crowd=CrowdConfig(10, 3.0),
)


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(prog="python -m benchmarks.waiting_room", description=__doc__.split("\n\n")[0])
    p.add_argument("--short", action="store_true", help="a rehearsal: synthetic model, 3 people, 5 s turns, 10 pollers")
    p.add_argument("--serve", default=None, help=f"arguments of `python -m server` (default {' '.join(FULL.serve)!r})")
    p.add_argument("--modes", default=None, help="hand-over modes, comma-separated (default fresh,continue)")
    p.add_argument("--clients", type=int, default=None, help="people who arrive and take turns (default 6)")
    p.add_argument("--arrival-interval-s", type=float, default=None, help="mean between two arrivals (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="of the arrival intervals (0.1 to 1.9 times the mean)")
    p.add_argument("--max-turn-s", type=float, default=None, help="the server's turn (default 20)")
    p.add_argument("--turn-warning-s", type=float, default=None, help="turn_ending this long before (default 10)")
    p.add_argument("--last-drive-s", type=float, default=None, help="how long the last person drives (default 5)")
    p.add_argument("--poll-s", type=float, default=None, help="the clients' ticket polling period (default 1)")
    p.add_argument("--pollers", type=int, default=None, help="tickets polling in phase 2 (default 50)")
    p.add_argument("--window-s", type=float, default=None, help="phase 2's two windows (default 15)")
    p.add_argument("--out", type=Path, default=None, help=f"the JSON report (default {FULL.out})")
    args = p.parse_args(argv)
    base = SHORT if args.short else FULL
    modes = tuple(args.modes.split(",")) if args.modes is not None else base.modes
    if not modes or any(m not in MODES for m in modes):
        p.error(f"--modes takes {', '.join(MODES)}, comma-separated")

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    t, c = base.turns, base.crowd
    turns = TurnsConfig(
        pick(args.clients, t.clients),
        pick(args.arrival_interval_s, t.arrival_interval_s),
        pick(args.max_turn_s, t.max_turn_s),
        pick(args.turn_warning_s, t.turn_warning_s),
        pick(args.last_drive_s, t.last_drive_s),
        pick(args.poll_s, t.poll_s),
        args.seed,
    )
    crowd = CrowdConfig(pick(args.pollers, c.pollers), pick(args.window_s, c.window_s))
    if turns.clients < 2 or crowd.pollers < 1:
        p.error("--clients must be at least 2 (a turn to hand over) and --pollers at least 1")
    if min(turns.max_turn_s, turns.last_drive_s, turns.poll_s, crowd.window_s) <= 0 or turns.turn_warning_s < 0:
        p.error("the durations must be positive (--turn-warning-s: not negative)")
    serve = tuple(shlex.split(args.serve)) if args.serve is not None else base.serve
    return Config(serve, modes, turns, crowd, pick(args.out, base.out))


# ---- phase 1: turns ----


def _viewer(run: ClientRun, frames_from: float = -np.inf, frames_to: float = np.inf) -> dict[str, Any]:
    """Delivery figures (`benchmarks.delivery.analyze`) of the frames received within [from, to]."""
    ready = run.ready or {}
    fps = int(ready.get("fps", 16))
    first = int(ready.get("chunk_frames", 16)) - (VAE_TIME_STRIDE - 1)  # the first chunk is 3 frames short
    frames = [f for f in run.session_frames() if frames_from <= f.t <= frames_to]
    return analyze(frames, run.chunks, {}, fps, first, run.stamped) | {"fps": fps}


class Watch:
    """A person in line watching one driver's session."""

    def __init__(self, url: str, answer: dict[str, Any]) -> None:
        self.watch_url = str(answer["watch_url"])
        self.session = Session.watching(url, self.watch_url, str(answer["watch_token"]))
        self.asked_t = time.perf_counter()
        self.starting = asyncio.create_task(self.session.start())

    async def close(self) -> dict[str, Any]:
        if not self.starting.done():
            self.starting.cancel()
        await asyncio.wait([self.starting])
        error = None  # an ended session (409), a stream that never came: told in the report
        if not self.starting.cancelled() and (exc := self.starting.exception()) is not None:
            error = f"{type(exc).__name__}: {exc}"
        await self.session.close()
        run = self.session.run
        times = [f.t for f in run.frames]
        figures = _viewer(run) if len(times) > 1 else {}
        return {
            "watch_url": self.watch_url,
            "error": error,
            "frames": len(times),
            "join_s": None if run.first_frame_t is None else run.first_frame_t - self.asked_t,
            "span_s": times[-1] - times[0] if times else 0.0,
            "unique_fps": figures.get("client_unique_fps"),
            "unique_fps_over_target": figures.get("client_unique_fps_over_target"),
            "repeated_frames": figures.get("repeated_frames"),
            "done": run.done and run.done.get("code"),
        }


@dataclass
class Person:
    index: int  # arrival order, from 0
    arrival_t: float
    session: Session
    watches: list[dict[str, Any]] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)  # its session's record at the end of its turn
    left_t: float | None = None  # the last one: when it closed

    @property
    def ready_t(self) -> float:
        """When its session was given: the ticket's `ready` answer, or the 201 (no wait)."""
        answered = [t for t, a in self.session.run.waits if a["state"] != "waiting"]
        return answered[0] if answered else self.arrival_t

    @property
    def end_t(self) -> float | None:
        """When its turn ended: its `done` received, or (the last) when it left."""
        done = self.session.run.done
        if self.left_t is not None or done is None:
            return self.left_t
        return float(done["received_t"])


async def watch_while_waiting(
    url: str, person: Session, starting: asyncio.Task[Session], watches: list[dict[str, Any]]
) -> None:
    """While `person` waits for its session (`starting`: its start), watch the world its ticket's
    latest answer names; each watch's figures go to `watches`."""
    current: Watch | None = None
    try:
        while person.info is None and not starting.done():
            answer = person.run.waits[-1][1] if person.run.waits else None
            named = None if answer is None else answer.get("watch_url")
            if answer is not None and named and (current is None or named != current.watch_url):
                if current is not None:
                    watches.append(await current.close())
                current = Watch(url, answer)
            await asyncio.sleep(LOOK_S)
    finally:
        if current is not None:
            watches.append(await current.close())


async def take_a_turn(url: str, cfg: TurnsConfig, index: int) -> Person:
    person = Person(index, time.perf_counter(), Session(url, poll_s=cfg.poll_s))
    session = person.session
    starting = asyncio.create_task(session.start())
    try:
        await watch_while_waiting(url, session, starting, person.watches)
        await starting
        session.press(KEY)
        if index == cfg.clients - 1:  # the last: nobody waits behind it, it drives a while and leaves
            while session.run.first_frame_t is None:
                await asyncio.sleep(LOOK_S)
            await asyncio.sleep(cfg.last_drive_s)
            person.server = await session.server_info()
            person.left_t = time.perf_counter()
        else:
            while session.run.done is None:
                await asyncio.sleep(LOOK_S)
            person.server = await session.server_info()
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await session.close()
    return person


async def run_turns(url: str, cfg: TurnsConfig) -> list[Person]:
    async def arrive(index: int, at_s: float) -> Person:
        await asyncio.sleep(at_s)
        return await take_a_turn(url, cfg, index)

    # Arrival intervals of 0.1 to 1.9 times the mean, seeded: each client's polls then fall at a phase
    # of their own, as people's do. At equal intervals the phases are locked to each other and to the
    # chunk clock (a 1 s chunk, a 1 s poll), and every hand-over would wait the same part of a poll.
    rng = random.Random(cfg.seed)
    steps = [0.0] + [cfg.arrival_interval_s * rng.uniform(0.1, 1.9) for _ in range(cfg.clients - 1)]
    people = [asyncio.create_task(arrive(i, at)) for i, at in enumerate(itertools.accumulate(steps))]
    try:
        return list(await asyncio.wait_for(asyncio.gather(*people), cfg.timeout_s))
    finally:
        for task in people:
            task.cancel()
        await asyncio.gather(*people, return_exceptions=True)


def _spread(values: list[float]) -> dict[str, float | None]:
    s = summarize(values)
    return {"p50": s["p50"], "mean": s["mean"], "min": min(values) if values else None, "max": s["max"]}


def turn_record(p: Person, t0: float) -> dict[str, Any]:
    run = p.session.run
    endings = run.turn_endings
    done_t = p.end_t
    first = run.first_frame_t
    driving = _viewer(run)
    return {
        "index": p.index,
        "arrived_s": p.arrival_t - t0,  # after the first
        "waited_s": p.ready_t - p.arrival_t,
        "first_estimate_s": run.waits[0][1]["estimated_wait_s"] if run.waits else None,
        "polls": len(run.waits),
        "first_frame_after_ready_s": None if first is None else first - p.ready_t,
        "held_s": None if done_t is None else done_t - p.ready_t,
        "driving_s": None if done_t is None or first is None else done_t - first,
        "done": run.done and run.done.get("code"),
        "turn_ending_seconds_left": endings[0]["seconds_left"] if endings else None,
        "turn_ending_lead_s": done_t - endings[0]["received_t"] if endings and done_t is not None else None,
        "parent": (run.ready or {}).get("parent"),
        "last_chunk_index": max((int(c["index"]) for c in run.chunks), default=None),
        "unique_fps": driving["client_unique_fps"],
        "unique_fps_over_target": driving["client_unique_fps_over_target"],
        "repeated_frames": driving["repeated_frames"],
        "server_frames_repeated": p.server.get("metrics", {}).get("frames_repeated"),
        "server_ended": p.server.get("ended"),
        "watches": p.watches,
    }


def turns_figures(people: list[Person], mode: str, poll_s: float) -> dict[str, Any]:
    """The figures of one mode's turns, from what each person's client saw."""
    drove = sorted(
        (p for p in people if p.session.run.first_frame_t is not None), key=lambda p: p.session.run.first_frame_t or 0
    )
    order = [p.index for p in drove]
    gaps, to_ready, ready_to_frame, replayed = [], [], [], []
    for prev, nxt in itertools.pairwise(drove):
        done_t, first = prev.end_t, nxt.session.run.first_frame_t
        if done_t is not None and first is not None:
            gaps.append(first - done_t)
            to_ready.append(nxt.ready_t - done_t)
            ready_to_frame.append(first - nxt.ready_t)
        parent = (nxt.session.run.ready or {}).get("parent")
        if parent is not None and prev.session.run.chunks:  # continue: the world goes on from the snapshot
            replayed.append(max(int(c["index"]) for c in prev.session.run.chunks) + 1 - int(parent["chunk_index"]))
    watches = [w for p in people for w in p.watches]
    rates = [w["unique_fps_over_target"] for w in watches if w["unique_fps_over_target"] is not None]
    in_line = [p for p in people if p.session.run.waits]
    watched = [sum(w["span_s"] for w in p.watches) / max(1e-9, p.ready_t - p.arrival_t) for p in in_line]
    errors = [
        abs(p.session.run.waits[0][1]["estimated_wait_s"] - (p.ready_t - p.arrival_t))
        for p in in_line
        if p.session.run.waits[0][1]["state"] == "waiting"
    ]
    every = [
        abs(a["estimated_wait_s"] - (p.ready_t - t))
        for p in in_line
        for t, a in p.session.run.waits
        if a["state"] == "waiting"
    ]
    t0 = min(p.arrival_t for p in people)
    turns = [turn_record(p, t0) for p in sorted(people, key=lambda p: p.index)]
    gap_p50 = summarize(gaps)["p50"]
    live_mean = float(np.mean(rates)) if rates else None
    return {
        "mode": mode,
        "order": {
            "arrival": list(range(len(people))),
            "drove": order,
            "equal": order == list(range(len(people))),
            "every_client_drove": len(order) == len(people),
        },
        "handover_gap_s": {
            "values": gaps,
            "p50": gap_p50,
            "max": max(gaps) if gaps else None,
            "done_to_ready_s": _spread(to_ready),
            "ready_to_first_frame_s": _spread(ready_to_frame),
            # done -> ready is mostly where the slot freed within the next driver's poll period (the
            # head of the line polls every HEAD_POLL_S at most): with a phase of its own, half a period
            # on average (a few turns' draws vary around it)
            "expected_with_a_random_poll_phase_s": float(np.mean(ready_to_frame)) + min(poll_s, HEAD_POLL_S) / 2
            if gaps
            else None,
            "target": f"p50 <= {HANDOVER_GAP_P50_S}",
            "pass": gap_p50 is not None and gap_p50 <= HANDOVER_GAP_P50_S,
        },
        "live_view": {
            "unique_fps_over_target": _spread(rates),
            "watches": len(watches),
            "watches_without_a_rate": len(watches) - len(rates),
            "watch_errors": [w["error"] for w in watches if w["error"]],
            "join_s": _spread([w["join_s"] for w in watches if w["join_s"] is not None]),
            "time_in_line_with_video": _spread(watched),
            "target": f"mean >= {LIVE_VIEW_FRACTION}",
            "pass": live_mean is not None and live_mean >= LIVE_VIEW_FRACTION,
        },
        "first_estimate_error_s": _spread(errors),
        # every answer's estimate against the wait left then: turns measured by then inform it
        "every_estimate_error_s": _spread(every),
        "turns_held_s": [t["held_s"] for t in turns],
        "turn_ending_lead_s": _spread([t["turn_ending_lead_s"] for t in turns if t["turn_ending_lead_s"] is not None]),
        "turns": turns,
        "continued": sum(t["parent"] is not None for t in turns),
        # continue: chunks the last driver (and everyone watching) saw after the snapshot its successor
        # starts from, which the successor's world generates again
        "chunks_seen_again": replayed,
    }


async def run_mode(cfg: Config, mode: str) -> dict[str, Any]:
    log = cfg.out.with_suffix(f".{mode}.server.log")
    args = [*cfg.serve, *cfg.turns.server_args(mode)]
    print(f"{mode}: python -m server {shlex.join(args)} (log {log})", file=sys.stderr, flush=True)
    with local_server(args, log) as server:
        t0 = time.perf_counter()
        people = await run_turns(server.url, cfg.turns)
        wall = time.perf_counter() - t0
    return turns_figures(people, mode, cfg.turns.poll_s) | {"wall_s": wall, "server_args": args}


# ---- phase 2: a crowd in line ----


@dataclass
class Polls:
    answers: list[tuple[float, int, float]] = field(default_factory=list)  # (sent, status, seconds to answer)

    def figures(self, since: float = -np.inf, until: float = np.inf) -> dict[str, Any]:
        mine = [(status, took) for t, status, took in self.answers if since <= t <= until]
        statuses = Counter(status for status, _ in mine)
        return {
            "polls": len(mine),
            "answered_200": statuses[200],
            "non_200": {str(s): n for s, n in sorted(statuses.items()) if s != 200},
            "latency_s": summarize([took for _, took in mine]),
        }


async def poll_ticket(
    http: httpx.AsyncClient, ticket: dict[str, Any], first_t: float, every_s: float, polls: Polls
) -> None:
    auth = {"authorization": f"Bearer {ticket['ticket_token']}"}
    next_t = first_t
    while True:
        await asyncio.sleep(max(0.0, next_t - time.perf_counter()))
        sent = time.perf_counter()
        try:
            status = (await http.get(ticket["poll_url"], headers=auth)).status_code
        except httpx.HTTPError:
            status = 0  # no answer at all
        polls.answers.append((sent, status, time.perf_counter() - sent))
        next_t += every_s


async def run_crowd(url: str, cfg: CrowdConfig) -> dict[str, Any]:
    driver = Session(url)
    polls = Polls()
    pollers: list[asyncio.Task[None]] = []
    tickets: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=None)) as http:
        try:
            await driver.start()
            driver.press(KEY)
            await wait_steady([driver])
            t = time.perf_counter()
            alone = (t, t + cfg.window_s)
            await asyncio.sleep(cfg.window_s)
            for _ in range(cfg.pollers):
                r = await http.post("/v1/sessions", json={})
                if r.status_code != 202:
                    raise RuntimeError(f"a ticket was refused: {r.status_code} {r.text[:200]}")
                tickets.append(r.json())
            start = time.perf_counter()
            pollers = [
                asyncio.create_task(
                    poll_ticket(http, t, start + i * cfg.poll_every_s / cfg.pollers, cfg.poll_every_s, polls)
                )
                for i, t in enumerate(tickets)
            ]
            await asyncio.sleep(cfg.poll_every_s + SETTLE_S)
            t = time.perf_counter()
            crowd = (t, t + cfg.window_s)
            await asyncio.sleep(cfg.window_s)
            session = await driver.server_info()
        finally:
            for task in pollers:
                task.cancel()
            await asyncio.gather(*pollers, return_exceptions=True)
            for ticket in tickets:  # leave the line before the driver does, or the head would be seated
                auth = {"authorization": f"Bearer {ticket['ticket_token']}"}
                with contextlib.suppress(httpx.HTTPError):
                    await http.delete(ticket["poll_url"], headers=auth)
            await driver.close()
    a, b = _viewer(driver.run, *alone), _viewer(driver.run, *crowd)
    fps_a, fps_b = a["client_unique_fps"], b["client_unique_fps"]
    ratio = fps_b / fps_a if fps_a and fps_b is not None else None
    pick = ("client_unique_fps", "client_unique_fps_over_target", "unique_frames", "repeated_frames", "stalls")
    return {
        "pollers": cfg.pollers,
        "window_s": cfg.window_s,
        "alone": {k: a[k] for k in pick},
        "with_pollers": {k: b[k] for k in pick},
        "ratio": {
            "value": ratio,
            "target": f">= {CROWD_FPS_RATIO}",
            "pass": ratio is not None and ratio >= CROWD_FPS_RATIO,
        },
        "polls": polls.figures() | {"in_window": polls.figures(*crowd)},
        "server_frames_repeated": session.get("metrics", {}).get("frames_repeated"),
    }


async def crowd_phase(cfg: Config) -> dict[str, Any]:
    log = cfg.out.with_suffix(".crowd.server.log")
    args = [*cfg.serve, *cfg.crowd.server_args()]
    print(f"crowd: python -m server {shlex.join(args)} (log {log})", file=sys.stderr, flush=True)
    with local_server(args, log, env=cfg.crowd.server_env()) as server:
        return await run_crowd(server.url, cfg.crowd) | {"server_args": args}


# ---- the run ----


async def run_all(cfg: Config) -> dict[str, Any]:
    modes = {mode: await run_mode(cfg, mode) for mode in cfg.modes}
    return {"modes": modes, "crowd": await crowd_phase(cfg)}


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _f(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def headline(result: dict[str, Any]) -> list[str]:
    lines = []
    for mode, m in result["modes"].items():
        o, g, v, e = m["order"], m["handover_gap_s"], m["live_view"], m["first_estimate_error_s"]
        rate, seen, lead = v["unique_fps_over_target"], v["time_in_line_with_video"], m["turn_ending_lead_s"]
        lines += [
            f"{mode}: drove in {' '.join(str(i + 1) for i in o['drove'])} "
            f"(arrival order: {'yes' if o['equal'] else 'NO'}"
            f"{'' if o['every_client_drove'] else ', NOT everyone drove'}); continued worlds {m['continued']}"
            + (f", each from {' '.join(map(str, m['chunks_seen_again']))} chunk(s) back" if m["continued"] else ""),
            f"  hand-over gap (done -> next first frame) p50 {_f(g['p50'])} s, max {_f(g['max'])} s "
            f"(p50 <= {HANDOVER_GAP_P50_S} s) -- {_verdict(g['pass'])}; of it done -> ready answer p50 "
            f"{_f(g['done_to_ready_s']['p50'])} s, ready -> first frame p50 {_f(g['ready_to_first_frame_s']['p50'])} s "
            f"(with a random poll phase: {_f(g['expected_with_a_random_poll_phase_s'])} s expected)",
            f"  live view in line: unique FPS / frame rate mean {_f(rate['mean'], '.3f')}, "
            f"min {_f(rate['min'], '.3f')} "
            f"over {v['watches']} watches (mean >= {LIVE_VIEW_FRACTION}) -- {_verdict(v['pass'])}; video for "
            f"{_f(seen['mean'], '.2f')} of the time in line (min {_f(seen['min'], '.2f')}); join -> first frame "
            f"p50 {_f(v['join_s']['p50'])} s",
            f"  first estimate's error mean {_f(e['mean'], '.1f')} s, max {_f(e['max'], '.1f')} s (every answer's: "
            f"mean {_f(m['every_estimate_error_s']['mean'], '.1f')} s); "
            f"turn_ending -> done {_f(lead['min'], '.1f')}-{_f(lead['max'], '.1f')} s "
            f"(announced {' '.join(sorted({_f(t['turn_ending_seconds_left'], 'g') for t in m['turns'][:-1]}))} s)",
            "  turns held (s): "
            + " ".join(_f(t, ".1f") for t in m["turns_held_s"])
            + "; drivers' unique FPS: "
            + " ".join(_f(t["unique_fps"], ".1f") for t in m["turns"]),
        ]
    c = result["crowd"]
    a, b, r, p = c["alone"], c["with_pollers"], c["ratio"], c["polls"]
    lines.append(
        f"crowd: driver unique FPS {_f(a['client_unique_fps'])} alone vs {_f(b['client_unique_fps'])} with "
        f"{c['pollers']} tickets polling once a second: {_f(r['value'], '.3f')} (>= {CROWD_FPS_RATIO}) -- "
        f"{_verdict(r['pass'])}; polls {p['polls']}, answered 200 {p['answered_200']}, other {p['non_200'] or 'none'}, "
        f"latency p50 {_f(p['latency_s']['p50'], '.3f')} s p99 {_f(p['latency_s']['p99'], '.3f')} s"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    t0 = time.perf_counter()
    result = asyncio.run(run_all(cfg))
    result |= {
        "wall_s": time.perf_counter() - t0,
        "environment": environment(torch.device("cpu")),
        "request": {
            "serve": list(cfg.serve),
            "modes": list(cfg.modes),
            "turns": vars(cfg.turns),
            "crowd": vars(cfg.crowd),
        },
    }
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    cfg.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(headline(result)))
    print(f"report: {cfg.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
