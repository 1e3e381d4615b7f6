"""Saves that outlive the server, with real servers, workers and aiortc peers (the tiny model): a save
made, the server stopped (SIGTERM, then separately SIGKILL) and started again on the same snapshot
directory, then branched: every chunk digest equals a branch made before the restart; the saving
session's token still opens it; a server with other weights lists it and refuses to branch from it,
naming what differs."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest

from benchmarks.local_server import ServerProcess, start_server
from tests.server.test_snapshots import digests
from tests.support.waiting import wait_until_async
from worldrtc import ClientError, Session

pytestmark = [pytest.mark.processes, pytest.mark.long]
WAIT_S = 90.0
CHUNKS_AFTER = 3  # chunks each branch generates past the snapshot


def serve(tmp_path: Path, name: str, saves: Path, weights_seed: int = 0) -> ServerProcess:
    env = {"WORLDRTC_SNAPSHOT_DIR": str(saves), "WORLDRTC_WEIGHTS_SEED": str(weights_seed)}
    return start_server(["--model", "tiny", "--max-sessions", "2"], tmp_path / f"{name}.log", env=env)


async def branch_digests(url: str, snapshot: dict, token: str) -> dict[int, str]:
    branch = Session(url, snapshot=snapshot["snapshot_id"], token=token)
    try:
        await branch.start()
        upto = snapshot["chunk_index"] + CHUNKS_AFTER
        found = await digests(branch, upto)
        return {i: d for i, d in found.items() if snapshot["chunk_index"] <= i < upto}
    finally:
        await branch.close()


async def test_a_save_branches_the_same_after_sigterm_and_sigkill_and_other_weights_are_refused(
    tmp_path: Path,
) -> None:
    saves = tmp_path / "saves"
    first = serve(tmp_path, "first", saves)
    try:
        driver = Session(first.url)
        await driver.start()
        driver.hold("w")
        await wait_until_async(lambda: len(driver.run.chunks) >= 2, WAIT_S, "two chunks")
        saved = await driver.save()
        assert driver.info is not None
        token = driver.info["token"]
        await driver.close()
        assert saved["where"] == "saved", saved
        before = await branch_digests(first.url, saved, token)
        assert len(before) == CHUNKS_AFTER
    finally:
        first.stop()  # SIGINT: the server's own clean stop, as SIGTERM without sessions
    files = sorted(p.name for p in (saves / saved["snapshot_id"]).iterdir())
    assert "manifest.json" in files and any(f.startswith("dit0") for f in files), files
    assert token not in (saves / saved["snapshot_id"] / "meta.json").read_text(), "tokens only as hashes"

    for how in (signal.SIGTERM, signal.SIGKILL):
        server = serve(tmp_path, f"after-{how.name}", saves)
        try:
            info = httpx.get(f"{server.url}/v1/snapshots/{saved['snapshot_id']}", headers=_bearer(token)).json()
            assert (info["where"], info["chunk_index"], info["weights"]) == (
                "saved",
                saved["chunk_index"],
                saved["weights"],
            )
            listed = httpx.get(f"{server.url}/v1/snapshots", headers=_bearer(token)).json()["snapshots"]
            assert [s["snapshot_id"] for s in listed] == [saved["snapshot_id"]]
            assert httpx.get(f"{server.url}/v1/snapshots/{saved['snapshot_id']}").status_code == 401
            after = await branch_digests(server.url, saved, token)
            assert after == before, f"after {how.name}: {after} != {before}"
        finally:
            server.proc.send_signal(how)
            server.proc.wait(timeout=30)
            server.stop()

    other = serve(tmp_path, "other-weights", saves, weights_seed=1)
    try:
        info = httpx.get(f"{other.url}/v1/snapshots/{saved['snapshot_id']}", headers=_bearer(token))
        assert info.status_code == 200 and info.json()["weights"] == saved["weights"]
        refused = Session(other.url, snapshot=saved["snapshot_id"], token=token)
        with pytest.raises(ClientError) as error:
            await refused.start()
        await refused.close()
        assert error.value.status == 409 and "weights" in error.value.message, error.value
    finally:
        other.stop()
    await asyncio.sleep(0)


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}
