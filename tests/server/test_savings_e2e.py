"""Every memory saving at once through the real server and worker processes on CPU: the model card
names them, a session streams with them, its recording carries them and regenerates bit for bit
under them; a snapshot made with other savings names them when refused."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from benchmarks.local_server import local_server
from server.snapshots.snapshot import MadeWith
from tests.support.regenerate import regenerate_exactly
from tests.support.waiting import wait_until_async
from workers.models.savings import NO_SAVINGS, Quantization, Savings, VAEDtype
from workers.runtime.placement import get_placement
from worldrtc import Session

WAIT_S = 90.0
ALL = Savings(Quantization.FP8, True, VAEDtype.BFLOAT16, 4)
FLAGS = ["--quantization", "fp8", "--text-encoder-on-cpu", "--vae-dtype", "bfloat16", "--vae-bands", "4"]


@pytest.mark.long
@pytest.mark.processes
async def test_a_session_streams_with_every_saving_and_its_recording_regenerates_exactly(tmp_path: Path) -> None:
    env = {"WORLDRTC_RECORDINGS_DIR": str(tmp_path / "videos")}
    args = ["--model", "gridworld", "--placement", "cpu", *FLAGS]
    with local_server(args, tmp_path / "server.log", env=env) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as http:
            card = (await http.get("/v1/model")).json()
        assert card["savings"]["flags"] == ALL.names() and not card["savings"]["exact"]
        assert card["savings"]["quantization"] == "fp8" and card["savings"]["vae_bands"] == 4

        client = Session(srv.url, scene="main-street", seed=5)
        await client.start()
        sid = client.info["session_id"]
        try:
            await client.next_frame()
            seq = client.press("w")
            await wait_until_async(
                lambda: any((c.get("applied_seq") or 0) >= seq for c in client.run.chunks), WAIT_S, "W"
            )
            await wait_until_async(lambda: len(client.run.chunks) >= 4, WAIT_S, "four chunks")
        finally:
            await client.close()
        async with httpx.AsyncClient(base_url=srv.url) as http:
            record = (await http.get(f"/v1/sessions/{sid}/recording")).json()

    assert record["savings"] == ALL.record()
    chunks = record["chunks"]
    assert len(chunks) >= 4 and any(c["keys"] == ["w"] for c in chunks)
    assert regenerate_exactly(record, tmp_path)["savings"] == ALL.record()


def test_a_snapshot_made_with_other_savings_says_which() -> None:
    cpu = get_placement("cpu")
    saved = MadeWith.of("gridworld", "sha256:x", cpu, ALL)
    here = MadeWith.of("gridworld", "sha256:x", cpu, NO_SAVINGS)
    assert saved.differences(here) == [f"savings {ALL.describe()} (this server: none (exact))"]
    assert saved.differences(MadeWith.of("gridworld", "sha256:x", cpu, ALL)) == []
    # A save written before savings existed reads back as made without any.
    assert MadeWith("gridworld", "sha256:x", "cpu", cpu.cpu_threads_per_worker).differences(here) == []
