"""Rows 27-30: snapshots (server/http/routes/snapshots.py): the memory budget, a stage lost while one is taken,
restoring one that is gone, and another session's token.

27 snapshot budget         gridworld: a budget under one snapshot (refused by the memory plan), and one
                           with room for two (a third evicts the least recently used)
28 stage lost mid-save     SIGKILL the DiT while a snapshot is being taken
29 gone snapshot restored  an evicted and a deleted snapshot: restore in place, branch
30 another line's token    a second session's token, no token, an unknown snapshot
40 save under load         a save of a large state (512 MiB in the DiT) to disk while the session streams

Rows 28-30 share one synthetic server (row 28 leaves it as it found it: the stage restarted, no
session, no snapshot); row 27 starts two gridworld servers of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from typing import Any

import httpx
import psutil

from benchmarks.reliability.harness import (
    CaseResult,
    Check,
    Lab,
    Resources,
    ServerConfig,
    ServerUnderTest,
    alive,
    at_least,
    at_most,
    below,
    case,
    equal,
    holds,
    leak_checks,
    wait_for,
)
from workers.runtime.channel import leaked_segments
from worldrtc import Session

# A closed session stays listed (with a task that forgets it) for closed_session_keep_s: short here,
# so that what is left after it is a leak.
KEEP_S = 1.0
# Rows 28-30 share a synthetic server. That model's encode and decode stages keep one small integer
# per session (a 5-byte pickle each), its DiT the chunk size, its prompt bookkeeping and its state
# (334 bytes for the empty prompt and no state): a snapshot is 344 bytes, and a 500-byte budget holds one.
SYNTHETIC_SNAPSHOT_BYTES = 344
ROOM_FOR_ONE = ServerConfig().with_env(create_burst=1000, closed_session_keep_s=KEEP_S, snapshot_budget_gib=500 / 2**30)
# The gridworld model on the CPU, by the memory plan: a snapshot is 33.2 MiB until the condition
# encoder reaches its fixed point (about chunk 10), 17.9 MiB after. A budget under the smaller is
# refused before any copy; one with room for two of the larger holds two early ones, not three.
GRIDWORLD = ("--model", "gridworld")
UNDER_ONE_GIB = 0.015  # 15.4 MiB
ROOM_FOR_TWO_GIB = 0.07  # 71.7 MiB
UNDER_ONE = ServerConfig(GRIDWORLD).with_env(closed_session_keep_s=KEEP_S, snapshot_budget_gib=UNDER_ONE_GIB)
ROOM_FOR_TWO = ServerConfig(GRIDWORLD).with_env(closed_session_keep_s=KEEP_S, snapshot_budget_gib=ROOM_FOR_TWO_GIB)

FIRST_FRAME_TIMEOUT_S = 120.0
STALL_BOUND_S = 1.0  # the longest wait for a new frame a streaming session may see
DELIVERY_BOUND = 0.8  # new frames received / the target's (row 27: / its own before), over a window
REFUSED_BOUND_S = 0.5  # a refusal before any copy: a copy waits for the next chunk boundary (≥ 1 s)
FAILED_BOUND_S = 2.0  # the stage's death to the answer and the session's end (row 8's bound)
RECOVERY_TIMEOUT_S = 60.0
SETTLE_S = 10.0
POLL_S = 0.05


# ---------------------------------------------------------------- what the rows share


def _bearer(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _answer(resp: httpx.Response) -> dict[str, Any]:
    """What a client is told: the status, whether the body is a JSON error, its code and message."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    return {
        "status": resp.status_code,
        "json": resp.headers.get("content-type", "").startswith("application/json"),
        "error": error,
        "message": str(body.get("message") or "") if isinstance(body, dict) and error else "",
    }


async def _streaming(url: str) -> Session:
    """A driver's session that has shown its first frame."""
    session = await Session(url).start()
    await asyncio.wait_for(session.next_frame(), FIRST_FRAME_TIMEOUT_S)
    return session


def _new_frames(session: Session, t0: float, t1: float) -> list[tuple[float, int]]:
    """(receive time, frame) of each frame first received between t0 and t1: its stamped number on the
    synthetic model, else its pts where a `chunk` message says it is a generated frame (not a repeat)."""
    seen: set[int] = set()
    out = []
    for f in session.run.frames:
        key = f.stamp if session.run.stamped else (f.pts if session.chunk_at(f.pts) is not None else None)
        if key is not None and key not in seen:
            seen.add(key)
            if t0 <= f.t <= t1:
                out.append((f.t, key))
    return out


def _delivery(session: Session, t0: float, t1: float) -> dict[str, Any]:
    """New frames between t0 and t1 against the target rate, and the longest wait for one."""
    fps = int((session.run.ready or {}).get("fps", 16))
    arrivals = [t0, *(t for t, _ in _new_frames(session, t0, t1)), t1]
    new = len(arrivals) - 2
    return {
        "seconds": round(t1 - t0, 2),
        "new_frames": new,
        "unique_fps_over_target": new / max(t1 - t0, 1e-9) / fps,
        "max_wait_s": max(b - a for a, b in itertools.pairwise(arrivals)),
    }


async def _branch(url: str, snapshot_id: str, token: str) -> dict[str, Any]:
    """A branch from `snapshot_id` started with `token`, to its first frame, then closed."""
    branch = Session(url, snapshot=snapshot_id, token=token)
    t0 = time.perf_counter()
    try:
        await branch.start()
        await asyncio.wait_for(branch.next_frame(), FIRST_FRAME_TIMEOUT_S)
        assert branch.info is not None
        return {
            "parent": (branch.info.get("parent") or {}).get("snapshot_id"),
            "first_frame_s": time.perf_counter() - t0,
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        await branch.close()


async def _settled(server: ServerUnderTest, base: Resources) -> tuple[float | None, Resources]:
    """Seconds until the server's connections, tasks, sockets and threads are back to `base` (closed
    sessions forgotten), and the resources then (or at the timeout)."""
    await asyncio.sleep(KEEP_S + 0.5)
    seen: list[Resources] = []

    def back() -> bool:
        res = server.resources()
        seen.append(res)
        return res.back_to(base)

    took = await asyncio.to_thread(wait_for, back, SETTLE_S, 0.2)
    return took, seen[-1]


def _leak_checks(base: Resources, end: Resources) -> list[Check]:
    """The spectator rows' checks, and the workers and shared-memory files a lost stage could leave."""
    return [
        *leak_checks(base, end),
        equal("worker processes over the count before", end.children - base.children, 0),
        equal("zombies", end.zombies, 0),
        at_most("shared-memory files over the count before", end.segments - base.segments, 0),
    ]


def _indented(checks: list[Check]) -> list[Check]:
    """Checks listed under the line before them."""
    return [Check(f"  {c.what}", c.value, c.bound, c.ok) for c in checks]


def _resources(base: Resources, end: Resources) -> dict[str, Any]:
    return {"base": base.__dict__, "end": end.__dict__}


# ---------------------------------------------------------------- 27


async def _refused_by_the_plan(server: ServerUnderTest, window_s: float) -> dict[str, Any]:
    base = await asyncio.to_thread(server.resources)
    driver = await _streaming(server.url)
    assert driver.info is not None
    sid, token = driver.info["session_id"], driver.info["token"]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        await asyncio.sleep(window_s)  # the session's own delivery first
        t0 = time.perf_counter()
        resp = await http.post(f"/v1/sessions/{sid}/snapshots", headers=_bearer(token))
        t_refused = time.perf_counter()
        await asyncio.sleep(window_s)
        t1 = time.perf_counter()
        record = (await http.get(f"/v1/sessions/{sid}", headers=_bearer(token))).json()
    got = {
        "answer": _answer(resp),
        "answered_s": t_refused - t0,
        "before": _delivery(driver, t0 - window_s, t0),
        "after": _delivery(driver, t0, t1),
        "state_after": record["state"],
        "done": driver.run.done,
    }
    await driver.close()
    settled, end = await _settled(server, base)
    return got | {"settled_s": settled, "base": base, "end": end}


async def _room_for_two(server: ServerUnderTest) -> dict[str, Any]:
    base = await asyncio.to_thread(server.resources)
    driver = await _streaming(server.url)
    assert driver.info is not None
    token = driver.info["token"]
    save_s = []

    async def save() -> dict[str, Any]:
        t0 = time.perf_counter()
        saved = await driver.save()
        save_s.append(round(time.perf_counter() - t0, 2))
        return saved

    taken = {"first": await save(), "second": await save()}
    # The first becomes the most recently used (a rewind uses it), so the third evicts the second. The
    # rewind also keeps the third before the condition encoder's fixed point: as large as the others.
    seen = len(driver.run.chunks)
    await driver.restore(taken["first"]["snapshot_id"])
    # Saved once it streams from the snapshot (while its engine session reopens a save answers 409).
    t0 = time.perf_counter()
    while len(driver.run.chunks) == seen and time.perf_counter() - t0 < FIRST_FRAME_TIMEOUT_S:
        await asyncio.sleep(POLL_S)
    taken["third"] = await save()
    rewinds = len(driver.run.rewinds)
    async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=_bearer(token)) as http:
        kept = {name: _answer(await http.get(s["snapshot_url"])) for name, s in taken.items()}
        await driver.close()  # its line's snapshots outlive it
        branches = {name: await _branch(server.url, taken[name]["snapshot_id"], token) for name in ("first", "third")}
        evicted_branch = await http.post("/v1/sessions", json={"snapshot": taken["second"]["snapshot_id"]})
        deleted = [(await http.delete(taken[name]["snapshot_url"])).status_code for name in ("first", "third")]
    settled, end = await _settled(server, base)
    return {
        "taken": {
            name: {k: s[k] for k in ("snapshot_id", "chunk_index", "bytes", "where")} for name, s in taken.items()
        },
        "save_s": save_s,
        "rewinds": rewinds,
        "kept": kept,
        "branches": branches,
        "evicted_branch": _answer(evicted_branch),
        "deleted": deleted,
        "settled_s": settled,
        "base": base,
        "end": end,
    }


@case(
    27,
    "snapshot budget",
    f"gridworld on the CPU (a snapshot 33.2 MiB, 17.9 after the first chunks): a {UNDER_ONE_GIB:g} GiB budget, "
    f"under any one; a {ROOM_FOR_TWO_GIB:g} GiB budget, room for two: save, save, rewind to the first, save a third",
    f"under one: 507 `snapshot_too_large` naming the budget in ≤ {REFUSED_BOUND_S:g} s (before any copy), the "
    f"session streams on (its rate of new frames ≥ {DELIVERY_BOUND} of its rate before, no wait over "
    f"{STALL_BOUND_S:g} s); room for two: the least recently used (the second) evicted, 410 `snapshot_gone` "
    "`evicted`; the other two branch after their session closed; peer connections, tasks, threads, workers, "
    "files back",
)
def snapshot_budget(lab: Lab, r: CaseResult) -> None:
    window_s = lab.pick(3.0, 5.0)
    laps: dict[str, float] = {}
    mark = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        laps[name], mark[0] = round(now - mark[0], 1), now

    with lab.own_server(UNDER_ONE) as server:
        lap("start a server")
        small = asyncio.run(_refused_by_the_plan(server, window_s))
        small_unhandled = server.unhandled()
        lap(f"{UNDER_ONE_GIB:g} GiB")
    lap("stop it")
    with lab.own_server(ROOM_FOR_TWO) as server:
        lap("start another")
        two = asyncio.run(_room_for_two(server))
        two_unhandled = server.unhandled()
        lap(f"{ROOM_FOR_TWO_GIB:g} GiB")
    lap("stop it ")
    answer, after = small["answer"], small["after"]
    taken, kept, branches = two["taken"], two["kept"], two["branches"]
    budget = int(ROOM_FOR_TWO_GIB * 2**30)
    sizes = [s["bytes"] for s in taken.values()]
    r.figures = {
        "under_one": {k: v for k, v in small.items() if k not in ("base", "end")}
        | _resources(small["base"], small["end"]),
        "room_for_two": {k: v for k, v in two.items() if k not in ("base", "end")}
        | _resources(two["base"], two["end"])
        | {"budget_bytes": budget},
        "seconds": laps,
    }
    r.checks = [
        equal(
            f"{UNDER_ONE_GIB:g} GiB: the save's status, error",
            [answer["status"], answer["error"]],
            [507, "snapshot_too_large"],
        ),
        holds(
            "  … its message names the budget",
            f"{UNDER_ONE_GIB:g} GiB budget" in answer["message"]
            and "WORLDRTC_SNAPSHOT_BUDGET_GIB" in answer["message"],
            answer["message"],
        ),
        at_most("  … answered after (before any copy)", small["answered_s"], REFUSED_BOUND_S, " s"),
        at_least(
            f"  the session's rate of new frames in the {window_s:g} s after it / before it",
            after["unique_fps_over_target"] / max(small["before"]["unique_fps_over_target"], 1e-9),
            DELIVERY_BOUND,
        ),
        at_most("  … its longest wait for a new frame", after["max_wait_s"], STALL_BOUND_S, " s"),
        equal("  … its state, done", [small["state_after"], small["done"]], ["streaming", None]),
        *_indented(_leak_checks(small["base"], small["end"])),
        holds(
            f"{ROOM_FOR_TWO_GIB:g} GiB: two snapshots fit, three do not (bytes)",
            sum(sorted(sizes)[:2]) <= budget < sum(sizes) and all(s["where"] == "memory" for s in taken.values()),
            sizes,
        ),
        equal("  the rewind to the first", two["rewinds"], 1),
        equal(
            "  GET of each after the third: status, error",
            {name: [a["status"], a["error"]] for name, a in kept.items()},
            {"first": [200, None], "second": [410, "snapshot_gone"], "third": [200, None]},
        ),
        holds("  … the second's says evicted", "evicted" in kept["second"]["message"], kept["second"]["message"]),
        equal(
            "  branches from the first and the third: their parent",
            {name: b.get("parent") for name, b in branches.items()},
            {name: taken[name]["snapshot_id"] for name in ("first", "third")},
        ),
        at_most(
            "  … branch to first frame, max",
            max((b.get("first_frame_s", 99.0) for b in branches.values()), default=None),
            FIRST_FRAME_TIMEOUT_S,
            " s",
        ),
        equal(
            "  a branch from the evicted one",
            [two["evicted_branch"]["status"], two["evicted_branch"]["error"]],
            [410, "snapshot_gone"],
        ),
        equal("  the two kept, deleted", two["deleted"], [200, 200]),
        *_indented(_leak_checks(two["base"], two["end"])),
        equal("unhandled exceptions in the servers' logs", len(small_unhandled) + len(two_unhandled), 0),
    ]


# ---------------------------------------------------------------- 28


def _ready(server: ServerUnderTest) -> int:
    try:
        return server.http.get("/readyz").status_code
    except httpx.HTTPError:
        return 0


@case(
    28,
    "stage lost mid-save",
    "a live session with one snapshot kept; a second asked for, and the DiT worker SIGKILLed while it is taken",
    f"the save answers 503 or 409 with a JSON error saying why, ≤ {FAILED_BOUND_S:g} s after the kill; the session "
    "ends `generation_failed`; the earlier snapshot answers 410 `snapshot_gone` `lost`; the stage restarts; a new "
    "session streams and saves; no zombie, the lost worker's files gone, workers, tasks, files back",
)
def stage_lost_mid_save(lab: Lab, r: CaseResult) -> None:
    server = lab.server(ROOM_FOR_ONE)  # left as found: the stage restarted, no session, no snapshot

    async def run() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        base = await asyncio.to_thread(server.resources)
        driver = await _streaming(server.url)
        assert driver.info is not None
        sid, token = driver.info["session_id"], driver.info["token"]
        http = httpx.AsyncClient(base_url=server.url, timeout=90, headers=_bearer(token))
        earlier = await driver.save()
        pid = (await asyncio.to_thread(server.worker_pids))["dit"][0]
        saving = asyncio.create_task(http.post(f"/v1/sessions/{sid}/snapshots"))
        await asyncio.sleep(0.2)  # the request is in; the copy waits for the next chunk boundary
        in_flight = not saving.done()
        t_kill = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        resp = await saving
        answered_s = time.perf_counter() - t_kill
        while driver.run.done is None and time.perf_counter() - t_kill < 15:
            await asyncio.sleep(POLL_S)
        done = driver.run.done or {}
        lost = _answer(await http.get(earlier["snapshot_url"]))
        await driver.close()
        ready = await loop.run_in_executor(None, wait_for, lambda: _ready(server) == 200, RECOVERY_TIMEOUT_S)
        new_pid = (await asyncio.to_thread(server.worker_pids))["dit"][0]
        fresh = await _streaming(server.url)
        saved_again, again = None, []
        try:
            saved_again = await fresh.save()
            own = _bearer((fresh.info or {}).get("token"))
            again = [
                (await http.get(saved_again["snapshot_url"], headers=own)).status_code,
                (await http.delete(saved_again["snapshot_url"], headers=own)).status_code,
            ]
        finally:
            await fresh.close()
            await http.aclose()
        settled, end = await _settled(server, base)
        return {
            "earlier": {k: earlier[k] for k in ("snapshot_id", "chunk_index", "bytes")},
            "dit_pid": pid,
            "in_flight_at_kill": in_flight,
            "answer": _answer(resp),
            "answered_s": answered_s,
            "done": {"code": done.get("code"), "reason": done.get("reason")},
            "done_s": None if not done else done["received_t"] - t_kill,
            "earlier_after": lost,
            "ready_again_s": ready,
            "new_dit_pid": new_pid,
            "saved_again": None if saved_again is None else saved_again["chunk_index"],
            "get_delete_again": again,
            "settled_s": settled,
            "base": base,
            "end": end,
        }

    f = asyncio.run(run())
    unhandled = server.unhandled()
    old_files = leaked_segments(f["dit_pid"])
    base, end = f.pop("base"), f.pop("end")
    r.figures = f | _resources(base, end) | {"lost_worker_files": old_files}
    answer, earlier = f["answer"], f["earlier_after"]
    why = answer["message"]
    r.checks = [
        holds("the save was in flight at the kill", f["in_flight_at_kill"]),
        holds("the save's status (503 or 409)", answer["status"] in (503, 409), answer["status"]),
        holds(
            "  … a JSON error saying why",
            answer["json"] and bool(answer["error"]) and any(w in why for w in ("ended", "failed", "over")),
            why,
        ),
        at_most("  … answered after the kill", f["answered_s"], FAILED_BOUND_S, " s"),
        equal("the session's done", f["done"]["code"], "generation_failed"),
        at_most("  … after the kill", f["done_s"], FAILED_BOUND_S, " s"),
        equal("the earlier snapshot: status, error", [earlier["status"], earlier["error"]], [410, "snapshot_gone"]),
        holds(
            "  … says it was lost with the DiT stage",
            "lost" in earlier["message"] and "dit stage" in earlier["message"],
            earlier["message"],
        ),
        holds(
            "a new DiT worker, ready again",
            f["new_dit_pid"] != f["dit_pid"] and not alive(f["dit_pid"]) and f["ready_again_s"] is not None,
            f["ready_again_s"],
        ),
        holds("a new session saves again", f["saved_again"] is not None, f["saved_again"]),
        equal("  … its snapshot: GET, DELETE", f["get_delete_again"], [200, 200]),
        equal("the lost worker's files in /dev/shm", len(old_files), 0),
        *_leak_checks(base, end),
        equal("unhandled exceptions in the server log", len(unhandled), 0),
    ]


# ---------------------------------------------------------------- 29


@case(
    29,
    "gone snapshot restored",
    "a streaming session, a budget with room for one snapshot: save (evicted by the next), save, delete it; "
    "restore each in place, branch from each",
    f"every one 410 `snapshot_gone` (evicted, deleted); the session streams on unchanged: no `rewound`, frames "
    f"keep counting up, ≥ {DELIVERY_BOUND} of target, no wait over {STALL_BOUND_S:g} s; no session created; "
    "peer connections, tasks, threads, files back",
)
def gone_snapshot_restored(lab: Lab, r: CaseResult) -> None:
    server = lab.server(ROOM_FOR_ONE)
    window_s = lab.pick(2.0, 5.0)

    async def run() -> dict[str, Any]:
        base = await asyncio.to_thread(server.resources)
        driver = await _streaming(server.url)
        assert driver.info is not None
        sid, token = driver.info["session_id"], driver.info["token"]
        evicted = await driver.save()
        deleted = await driver.save()  # evicts the first: the budget holds one
        async with httpx.AsyncClient(base_url=server.url, timeout=30, headers=_bearer(token)) as http:
            deleted_status = (await http.delete(deleted["snapshot_url"])).status_code
            sessions_before = len(await asyncio.to_thread(server.sessions))
            t0 = time.perf_counter()
            last_before = max((k for _, k in _new_frames(driver, 0.0, t0)), default=-1)
            got = {}
            for name, snap in (("evicted", evicted), ("deleted", deleted)):
                restore = await http.post(f"/v1/sessions/{sid}/restore", json={"snapshot": snap["snapshot_id"]})
                got[f"restore the {name} one"] = _answer(restore)
                branch = await http.post("/v1/sessions", json={"snapshot": snap["snapshot_id"]})
                got[f"branch from the {name} one"] = _answer(branch)
            t_tried = time.perf_counter()
            sessions_after = len(await asyncio.to_thread(server.sessions))
            await asyncio.sleep(window_s)
            t1 = time.perf_counter()
            record = (await http.get(f"/v1/sessions/{sid}")).json()
        after = [k for _, k in _new_frames(driver, t0, t1)]
        result = {
            "bytes": [evicted["bytes"], deleted["bytes"]],
            "deleted_status": deleted_status,
            "attempts": got,
            "attempts_s": t_tried - t0,
            "sessions_listed": [sessions_before, sessions_after],
            "rewinds": len(driver.run.rewinds),
            "last_frame_before": last_before,
            "frames_after": [after[0], after[-1]] if after else [],
            "counting_up": bool(after) and after[0] > last_before and after == sorted(after),
            "delivery": _delivery(driver, t0, t1),
            "state_after": record["state"],
            "parent_after": record.get("parent"),
            "done": driver.run.done,
        }
        await driver.close()
        settled, end = await _settled(server, base)
        return result | {"settled_s": settled, "base": base, "end": end}

    f = asyncio.run(run())
    unhandled = server.unhandled()
    base, end = f.pop("base"), f.pop("end")
    r.figures = f | _resources(base, end)
    wrong = {
        what: a
        for what, a in f["attempts"].items()
        if [a["status"], a["json"], a["error"]] != [410, True, "snapshot_gone"]
        or ("evicted" if "evicted" in what else "deleted") not in a["message"]
    }
    d = f["delivery"]
    r.checks = [
        equal("a snapshot's bytes (the budget holds one)", f["bytes"], [SYNTHETIC_SNAPSHOT_BYTES] * 2),
        equal("the second's DELETE", f["deleted_status"], 200),
        equal("answers other than 410 `snapshot_gone` saying evicted or deleted", wrong, {}),
        equal("attempts", len(f["attempts"]), 4),
        equal("sessions listed before, after the branch attempts", f["sessions_listed"][1], f["sessions_listed"][0]),
        equal("`rewound` messages", f["rewinds"], 0),
        holds("frames after the attempts count up from those before", f["counting_up"], f["frames_after"]),
        at_least(
            "the session's new frames / target from the first attempt", d["unique_fps_over_target"], DELIVERY_BOUND
        ),
        at_most("  … its longest wait for a new frame", d["max_wait_s"], STALL_BOUND_S, " s"),
        equal(
            "  … its state, parent, done", [f["state_after"], f["parent_after"], f["done"]], ["streaming", None, None]
        ),
        *_leak_checks(base, end),
        equal("unhandled exceptions in the server log", len(unhandled), 0),
    ]


# ---------------------------------------------------------------- 30


# (what is tried, the status, the error code)
TOKEN_EXPECTED: dict[str, tuple[int, str]] = {
    "another session's token: GET": (403, "forbidden"),
    "another session's token: DELETE": (403, "forbidden"),
    "another session's token: branch": (403, "forbidden"),
    "another session's token: restore its own session": (403, "forbidden"),
    "another session's token: restore the owner's session": (403, "forbidden"),
    "no token: GET": (401, "unauthorized"),
    "no token: DELETE": (401, "unauthorized"),
    "no token: branch": (401, "unauthorized"),
    "no token: restore the owner's session": (401, "unauthorized"),
    "a wrong token: GET": (401, "unauthorized"),
    "the owner's token, an unknown snapshot: GET": (404, "not_found"),
    "the owner's token, an unknown snapshot: DELETE": (404, "not_found"),
    "the owner's token, an unknown snapshot: branch": (404, "not_found"),
    "the owner's token, an unknown snapshot: restore": (404, "not_found"),
}


@case(
    30,
    "another line's token",
    "a streaming session's snapshot; a second session's token on it (GET, DELETE, branch, restore into either "
    "session), no token, a wrong one, an unknown snapshot id with the owner's token",
    "403 `forbidden`, 401, 401, 404, each a JSON error; no session created; the snapshot intact after (same bytes, "
    "the owner branches from it); peer connections, tasks, threads, files back",
)
def another_lines_token(lab: Lab, r: CaseResult) -> None:
    server = lab.server(ROOM_FOR_ONE)

    async def run() -> dict[str, Any]:
        base = await asyncio.to_thread(server.resources)
        driver = await _streaming(server.url)
        assert driver.info is not None
        sid, token = driver.info["session_id"], driver.info["token"]
        snap = await driver.save()
        url, body = snap["snapshot_url"], {"snapshot": snap["snapshot_id"]}
        unknown_url, unknown = "/v1/snapshots/0123456789abcdef", {"snapshot": "0123456789abcdef"}
        got: dict[str, dict[str, Any]] = {}
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            other = (await http.post("/v1/sessions", json={})).json()
            sessions_before = len(await asyncio.to_thread(server.sessions))
            theirs, mine = other["token"], token
            tries: list[tuple[str, str, str, dict[str, Any] | None, str | None]] = [
                ("another session's token: GET", "GET", url, None, theirs),
                ("another session's token: DELETE", "DELETE", url, None, theirs),
                ("another session's token: branch", "POST", "/v1/sessions", body, theirs),
                (
                    "another session's token: restore its own session",
                    "POST",
                    f"/v1/sessions/{other['session_id']}/restore",
                    body,
                    theirs,
                ),
                (
                    "another session's token: restore the owner's session",
                    "POST",
                    f"/v1/sessions/{sid}/restore",
                    body,
                    theirs,
                ),
                ("no token: GET", "GET", url, None, None),
                ("no token: DELETE", "DELETE", url, None, None),
                ("no token: branch", "POST", "/v1/sessions", body, None),
                ("no token: restore the owner's session", "POST", f"/v1/sessions/{sid}/restore", body, None),
                ("a wrong token: GET", "GET", url, None, "not-a-token-0123456789abcdef"),
                ("the owner's token, an unknown snapshot: GET", "GET", unknown_url, None, mine),
                ("the owner's token, an unknown snapshot: DELETE", "DELETE", unknown_url, None, mine),
                ("the owner's token, an unknown snapshot: branch", "POST", "/v1/sessions", unknown, mine),
                (
                    "the owner's token, an unknown snapshot: restore",
                    "POST",
                    f"/v1/sessions/{sid}/restore",
                    unknown,
                    mine,
                ),
            ]
            for what, method, path, payload, credential in tries:
                resp = await http.request(method, path, json=payload, headers=_bearer(credential))
                got[what] = _answer(resp)
            sessions_after = len(await asyncio.to_thread(server.sessions))
            intact = _answer(await http.get(url, headers=_bearer(mine)))
            intact_bytes = (await http.get(url, headers=_bearer(mine))).json().get("bytes")
            # The second session frees its slot (2 by default) for the owner's branch.
            await http.delete(f"/v1/sessions/{other['session_id']}", headers=_bearer(theirs))
            branched = await _branch(server.url, snap["snapshot_id"], mine)
            deleted = (await http.delete(url, headers=_bearer(mine))).status_code
        rewinds, done = len(driver.run.rewinds), driver.run.done
        await driver.close()
        settled, end = await _settled(server, base)
        return {
            "attempts": got,
            "sessions_listed": [sessions_before, sessions_after],
            "snapshot": {k: snap[k] for k in ("snapshot_id", "chunk_index", "bytes")},
            "intact": [intact["status"], intact_bytes],
            "branch": branched,
            "deleted": deleted,
            "driver_rewinds": rewinds,
            "driver_done": done,
            "settled_s": settled,
            "base": base,
            "end": end,
        }

    f = asyncio.run(run())
    unhandled = server.unhandled()
    base, end = f.pop("base"), f.pop("end")
    r.figures = f | _resources(base, end)
    wrong = {}
    for what, a in f["attempts"].items():
        status, code = TOKEN_EXPECTED[what]
        if [a["status"], a["json"], a["error"], bool(a["message"])] != [status, True, code, True]:
            wrong[what] = a
    r.checks = [
        equal("answers otherwise than expected (status, JSON error and message)", wrong, {}),
        equal("attempts", len(f["attempts"]), len(TOKEN_EXPECTED)),
        equal("sessions listed before, after", f["sessions_listed"][1], f["sessions_listed"][0]),
        equal("the snapshot after: status, bytes", f["intact"], [200, f["snapshot"]["bytes"]]),
        equal("the owner's branch from it: its parent", f["branch"].get("parent"), f["snapshot"]["snapshot_id"]),
        at_most("  … branch to first frame", f["branch"].get("first_frame_s"), FIRST_FRAME_TIMEOUT_S, " s"),
        equal("the owner's DELETE after", f["deleted"], 200),
        equal("the owner's session: rewound, ended meanwhile", [f["driver_rewinds"], f["driver_done"]], [0, None]),
        *_leak_checks(base, end),
        equal("unhandled exceptions in the server log", len(unhandled), 0),
    ]


# Row 40: a synthetic DiT keeping this much state per session: its save takes seconds to write on two
# cores (with the write in the command loop, as before, 9 repeated frames). A snapshot's copy at the
# chunk boundary (a device copy on a GPU) is a copy into host memory the worker keeps ready on the
# CPU (workers/runtime/host_reserve.py: 0.09 s here, against 0.55 s for fresh memory, which stalled
# the stream 0.75 s once with the page cache full of earlier saves). Half the state makes the write
# fit the pipeline's slack even in the command loop, so the row would tell nothing.
SAVE_STATE_MIB = 512
SAVE_LEAD_S = 2.0  # streaming before and after the save, for the rate it is compared with


@case(
    40,
    "save under load",
    f"a session whose DiT keeps {SAVE_STATE_MIB} MiB saves to disk while it streams (short: once; full: 3 times)",
    "the stream's repeats while a save is written: 0, no wait for a frame of two frame intervals; the DiT "
    "worker's memory back to before the save "
    "(within 10 % of the state) once it is written; the save's files whole",
)
def save_under_load(lab: Lab, r: CaseResult) -> None:
    saves = lab.log_dir / "saves-40"
    config = ServerConfig().with_env(synthetic_state_mib=SAVE_STATE_MIB, snapshot_dir=saves)
    state_bytes = SAVE_STATE_MIB * 2**20
    with lab.own_server(config) as server:
        dit = psutil.Process(server.worker_pids()["dit"][0])

        async def run() -> dict[str, Any]:
            driver = await _streaming(server.url)
            saved = []
            for _ in range(lab.pick(1, 3)):
                await asyncio.sleep(SAVE_LEAD_S)
                rss_before = dit.memory_info().rss
                t0 = time.perf_counter()
                info = await driver.save()
                t1 = time.perf_counter()
                # The part is freed once written; the reply comes once every worker's files are whole.
                rss_after = dit.memory_info().rss
                stamps = [f.stamp for f in driver.run.frames if t0 <= f.t <= t1]
                saved.append(
                    {
                        "snapshot_id": info["snapshot_id"],
                        "bytes": info["bytes"],
                        "save_s": round(t1 - t0, 2),
                        "frames": len(stamps),
                        "repeats": len(stamps) - len(set(stamps)),
                        "max_wait_s": _delivery(driver, t0, t1)["max_wait_s"],
                        "dit_rss_growth_mib": round((rss_after - rss_before) / 2**20, 1),
                    }
                )
            await asyncio.sleep(SAVE_LEAD_S)
            await driver.close()
            return {"saves": saved}

        f = asyncio.run(run())
    files = {s["snapshot_id"]: sum(p.stat().st_size for p in (saves / s["snapshot_id"]).glob("*")) for s in f["saves"]}
    r.figures = f | {"state_mib": SAVE_STATE_MIB, "files_bytes": files}
    fps = 16
    seconds = [s["save_s"] for s in f["saves"]]
    r.checks = [
        holds("each save took over a second", min(seconds) > 1.0, seconds),
        equal("repeated frames while a save was written", sum(s["repeats"] for s in f["saves"]), 0),
        # Under two frame intervals: no frame slot went without a new frame (the pacer's jitter aside).
        below("the longest wait for a new frame meanwhile", max(s["max_wait_s"] for s in f["saves"]), 2 / fps, " s"),
        at_most(
            "the DiT worker's memory after a save, over before",
            max(s["dit_rss_growth_mib"] for s in f["saves"]),
            0.1 * SAVE_STATE_MIB,
            " MiB",
        ),
        holds("each save's files hold its state", all(b >= state_bytes for b in files.values()), files),
    ]
