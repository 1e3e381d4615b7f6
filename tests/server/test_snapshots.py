"""Snapshots through the real server and real aiortc peers, on the embedded gridworld model and on
its one-latent-chunk sibling: a branch from a snapshot, fed the same controls, generates the
original's frames bit for bit (the recordings' chunk digests, computed from the frames as
generated), a rewind in place does too, and only the session's line may use its snapshots."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from benchmarks.local_server import local_server
from tests.support.waiting import wait_until_async
from workers.models.presets import get_preset
from workers.runtime.memory_plan import machine_capacity, plan_memory
from workers.runtime.placement import PLACEMENTS
from worldrtc import ClientError, Session

pytestmark = pytest.mark.processes
WAIT_S = 90.0


@pytest.fixture(scope="module", params=["gridworld", "gridworld-responsive"])
def server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(the server's URL, its model)."""
    log: Path = tmp_path_factory.mktemp("snapshots") / "server.log"
    with local_server(["--model", request.param, "--max-sessions", "3"], log) as srv:
        yield srv.url, request.param


async def digests(client: Session, upto: int) -> dict[int, str]:
    """Chunk index -> frames digest of the client's session, once chunks < `upto` all have one."""
    found: dict[int, str] = {}

    async def have() -> bool:
        found.clear()
        rec = await client.recording()
        found.update({c["index"]: c["frames_sha256"] for c in rec["chunks"] if c["frames_sha256"]})
        return all(i in found for i in range(upto))

    for _ in range(int(WAIT_S / 0.5)):
        if await have():
            return found
        await asyncio.sleep(0.5)
    raise AssertionError(f"chunks below {upto} never all recorded: {sorted(found)}")


@pytest.mark.long
async def test_branch_and_rewind_regenerate_the_same_frames(server: tuple[str, str], tmp_path: Path) -> None:
    server_url, model = server
    # Traced before any session: seconds of CPU that would starve this process's peers of their RTCP.
    planned = plan_memory(get_preset(model), PLACEMENTS["cpu"], 1, machine_capacity()).snapshot_bytes
    driver = Session(server_url)
    branch: Session | None = None
    http = httpx.AsyncClient(base_url=server_url, timeout=30)
    try:
        await driver.start()
        driver.hold("w")  # the same control in every chunk: a branch holding it gets the same per-chunk input
        await wait_until_async(lambda: len(driver.run.chunks) >= 2, WAIT_S, "two chunks")
        saved = await driver.save()
        b = saved["chunk_index"]
        assert b >= 2 and saved["where"] == "memory" and saved["parent"] is None
        assert saved["model"] == model and saved["placement"] == "cpu" and saved["intra_op_threads"] == 1
        assert saved["weights"].startswith("sha256:"), saved["weights"]  # the shipped weights
        # The bytes the memory plan gives one snapshot, within 10 % (the first chunks: the encoder's caches in it).
        assert abs(saved["bytes"] - planned) <= 0.1 * planned, (saved["bytes"], planned)
        original = await digests(driver, b + 3)
        assert driver.info is not None
        token = driver.info["token"]

        branch = Session(server_url, snapshot=saved["snapshot_id"], token=token)
        await branch.start()
        branch.hold("w")
        assert branch.info is not None and branch.info["parent"]["snapshot_id"] == saved["snapshot_id"]
        await wait_until_async(lambda: branch.run.ready, WAIT_S, "the branch's ready")
        assert branch.run.ready is not None and branch.run.ready["parent"]["chunk_index"] == b
        got = await digests(branch, b + 3)
        # The branch's recording holds the line: the chunks before the snapshot as the original recorded them.
        assert [got[i] for i in range(b + 3)] == [original[i] for i in range(b + 3)]
        assert min(c["index"] for c in branch.run.chunks) == b
        path = tmp_path / "branch.json"  # regenerated below, once the sessions are over
        path.write_text(json.dumps(await branch.recording()))
        # The same on WHEP: POST /v1/whep?snapshot=ID with a token of the line.
        async with Session(server_url, whep=True, snapshot=saved["snapshot_id"], token=token) as whep:
            await wait_until_async(lambda: whep.run.chunks, WAIT_S, "a chunk for the WHEP branch")
            assert whep.run.chunks[0]["index"] == b

        # Rewind the original in place: the same chunks again, on the same connection.
        seen = len(driver.run.chunks)
        await driver.restore(saved["snapshot_id"])
        await wait_until_async(lambda: driver.run.rewinds, WAIT_S, "a rewound message")
        await wait_until_async(
            lambda: any(c["index"] == b + 2 for c in driver.run.chunks[seen:]), WAIT_S, "chunks after the rewind"
        )
        again = await digests(driver, b + 3)
        assert [again[i] for i in range(b + 3)] == [original[i] for i in range(b + 3)]

        # Ownership: the line's tokens (the branch's too) open it; another line's does not; none is 401.
        url = saved["snapshot_url"]
        other = (await http.post("/v1/sessions", json={})).json()
        assert (await http.get(url)).status_code == 401
        refused = await http.get(url, headers={"authorization": f"Bearer {other['token']}"})
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
        theirs = await http.post(
            f"/v1/sessions/{other['session_id']}/restore",
            json={"snapshot": saved["snapshot_id"]},
            headers={"authorization": f"Bearer {other['token']}"},
        )
        assert theirs.status_code == 403
        assert branch.info is not None
        mine = {"authorization": f"Bearer {branch.info['token']}"}
        assert (await http.get(url, headers=mine)).json()["bytes"] == saved["bytes"]
        assert (await http.delete(url, headers=mine)).status_code == 200
        gone = await http.get(url, headers=mine)
        assert gone.status_code == 410 and gone.json()["error"] == "snapshot_gone"
        with pytest.raises(ClientError) as late:
            await driver.restore(saved["snapshot_id"])
        assert late.value.status == 410
        # A branch takes what the snapshot fixes, nothing else.
        bearer = {"authorization": f"Bearer {token}"}
        mixed = await http.post("/v1/sessions", json={"snapshot": saved["snapshot_id"], "seed": 3}, headers=bearer)
        assert mixed.status_code == 400 and "seed" in mixed.json()["message"]
        await http.delete(f"/v1/sessions/{other['session_id']}", headers={"authorization": f"Bearer {other['token']}"})
    finally:
        if branch is not None:
            await branch.close()
        await driver.close()
        await http.aclose()

    def settled() -> bool:
        engine = httpx.get(f"{server_url}/v1/engine", timeout=30).json()
        return engine["sessions"] == {} and engine["outstanding_slots"] == 0 and engine["counters"]["leaked_slots"] == 0

    await wait_until_async(settled, 30, "every engine session closed, no slot held")

    # The branch's recording regenerates headless, from chunk 0 through the snapshot and on.
    cmd = [sys.executable, "-m", "benchmarks.replay", "--recording", str(path), "--quiet"]
    done = subprocess.run([*cmd, "--out", str(tmp_path / "replay.json")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every chunk's digest equal" in done.stdout, done.stdout
