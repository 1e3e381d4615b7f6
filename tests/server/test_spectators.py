"""Spectators end to end: the synthetic model (frames stamped with their index) through the real server,
a driver and spectators on real aiortc peers. They see the driver's frames, take no generation slot,
cannot steer, are refused with the wrong token, end when the driver leaves, and leave nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.delivery import ids_by_pts
from benchmarks.local_server import local_server
from tests.support.waiting import wait_until_async
from worldrtc import ClientError, Session

pytestmark = pytest.mark.processes
WAIT_S = 60.0


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log: Path = tmp_path_factory.mktemp("spectators") / "server.log"
    args = ["--model", "synthetic", "--stage-ms", "20,200,100", "--synthetic-geometry", "tiny", "--max-sessions", "1"]
    env = {"WORLDRTC_MAX_SPECTATORS_PER_SESSION": "2"}
    with local_server(args, log, env=env) as srv:
        yield srv.url


def stamps(client: Session) -> list[int]:
    return [f.stamp for f in client.run.frames if f.stamp is not None]


async def test_spectators_see_the_drivers_frames_and_cannot_steer(server_url: str) -> None:
    http = httpx.AsyncClient(base_url=server_url, timeout=30)
    baseline = (await http.get("/v1/engine")).json()
    driver = Session(server_url)
    await driver.start()
    info = driver.info
    assert info is not None
    early = Session.watching(server_url, info["watch_url"], info["watch_token"])
    late = Session.watching(server_url, info["watch_url"], info["watch_token"])
    try:
        await early.start()
        await wait_until_async(lambda: len(driver.run.chunks) >= 3, WAIT_S, "three chunks")
        await late.start()  # joins mid-stream: starts at a keyframe the fan-out forces for it
        # The only generation slot is the driver's; watching takes none.
        assert (await http.get("/capacityz")).status_code == 503
        driver.press("w")
        await wait_until_async(lambda: len(late.run.chunks) >= 3, WAIT_S, "three chunks for the late spectator")
        # Steering from a spectator is refused; a ping is answered.
        assert late.channel is not None
        late.channel.send('{"type": "control", "key": "w", "action": "press"}')
        late.channel.send('{"type": "ping", "seq": 7}')
        await wait_until_async(lambda: late.run.errors, WAIT_S, "a read_only error")
        assert late.run.errors[0]["code"] == "read_only"
        record = (await http.get(f"/v1/sessions/{info['session_id']}")).json()
        assert record["metrics"]["spectators"] == 2 and record["metrics"]["spectators_joined"] == 2
        await wait_until_async(lambda: any(s["spectators"] == 2 for s in driver.run.stats), WAIT_S, "stats count 2")
        # A third is over this server's per-session limit of 2.
        third = Session.watching(server_url, info["watch_url"], info["watch_token"])
        with pytest.raises(ClientError) as refused:
            await third.start()
        assert (refused.value.status, refused.value.code) == (429, "busy")
        await third.close()
        seen = len(driver.run.frames)
        await wait_until_async(lambda: len(late.run.frames) >= 40, WAIT_S, "40 frames for the late spectator")
    finally:
        final = await driver.close()
    assert final is not None and final["metrics"]["spectators"] == 0
    for spectator in (early, late):
        await wait_until_async(lambda s=spectator: s.run.done, WAIT_S, "done for the spectators")
        assert spectator.run.done is not None and spectator.run.done["code"] == "driver_left"
        assert spectator.run.ready is not None and spectator.run.ready["role"] == "spectator"
        await spectator.close()
    assert seen > 0

    # The same frames, in order, nothing repeated after the start: stamps are the frames' own indices.
    driver_stamps = stamps(driver)
    for spectator in (early, late):
        got = stamps(spectator)
        assert got == sorted(got) and len(got) == len(set(got)), "out of order or repeated"
        assert set(got) <= set(driver_stamps) | set(range(max(driver_stamps) + 1, max(got) + 1))
    assert late.run.pts_origin is not None and late.run.pts_origin > 0
    # A late joiner's pts, put on the session's clock, name the same frames as its stamps.
    frames = late.run.session_frames()
    by_pts = ids_by_pts(frames, late.run.chunks, 16)
    known = [(p, f.stamp) for p, f in zip(by_pts, frames, strict=True) if p is not None and f.stamp is not None]
    assert len(known) >= 30 and all(p == s for p, s in known)

    async def back_to_baseline() -> dict | None:
        engine = (await http.get("/v1/engine")).json()
        return engine if engine["peer_connections"] == 0 and not engine["sessions"] else None

    engine = await wait_until_async(back_to_baseline, WAIT_S, "no peer connections left")
    assert engine["event_loop_tasks"] <= baseline["event_loop_tasks"] + 1
    await http.aclose()


async def test_the_watch_token_is_a_revocable_capability_for_one_session(server_url: str) -> None:
    http = httpx.AsyncClient(base_url=server_url, timeout=30)
    driver = Session(server_url)
    await driver.start()
    info = driver.info
    assert info is not None
    sid, watch_url = info["session_id"], info["watch_url"]

    async def watch(token: str | None) -> httpx.Response:
        headers = {"content-type": "application/sdp"} | ({"authorization": f"Bearer {token}"} if token else {})
        return await http.post(watch_url, content="v=0\r\n", headers=headers)

    try:
        assert (await watch(None)).status_code == 401
        assert (await watch("not-a-token")).json()["error"] == "unauthorized"
        driver_token = await watch(info["token"])
        assert (driver_token.status_code, driver_token.json()["error"]) == (403, "forbidden")
        spectator = Session.watching(server_url, watch_url, info["watch_token"])
        await spectator.start()
        # Revoking ends the spectators who hold the token, and the token opens nothing any more.
        r = await http.post(f"/v1/sessions/{sid}/watch-token", headers={"authorization": f"Bearer {info['token']}"})
        fresh = r.json()
        assert r.status_code == 200 and fresh["watch_token"] != info["watch_token"]
        await wait_until_async(lambda: spectator.run.done, WAIT_S, "done for the revoked spectator")
        assert spectator.run.done is not None and spectator.run.done["code"] == "revoked"
        await spectator.close()
        revoked = await watch(info["watch_token"])
        assert revoked.status_code == 403 and "revoked" in revoked.json()["message"]
        again = Session.watching(server_url, fresh["watch_url"], fresh["watch_token"])
        await again.start()  # the new token works
        await again.close()
        await wait_until_async(lambda: driver.run.stats and driver.run.stats[-1]["spectators"] == 0, WAIT_S, "0")
    finally:
        await driver.close()
    ended = await watch(fresh["watch_token"])
    assert (ended.status_code, ended.json()["error"]) == (409, "session_closed")
    metrics = (await http.get("/metrics")).text
    for reason in ("missing", "wrong", "driver_token", "revoked", "ended"):
        assert f'worldrtc_watch_refused_total{{reason="{reason}"}}' in metrics, reason
    await http.aclose()


async def test_another_sessions_watch_token_is_refused(server_url: str) -> None:
    first = Session(server_url)
    await first.start()
    info = first.info
    assert info is not None
    await first.close()
    second = Session(server_url)  # the one slot is free again
    await second.start()
    try:
        assert second.info is not None
        async with httpx.AsyncClient(base_url=server_url, timeout=30) as http:
            r = await http.post(
                second.info["watch_url"],
                content="v=0\r\n",
                headers={"content-type": "application/sdp", "authorization": f"Bearer {info['watch_token']}"},
            )
        # The first session is over, but still listed: its token is known, and not this session's.
        assert (r.status_code, r.json()["error"]) == (403, "forbidden")
        assert "another session" in r.json()["message"]
    finally:
        await second.close()
    await asyncio.sleep(0)
