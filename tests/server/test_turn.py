"""TURN through Debian's coturn on loopback: per-session credentials minted from the shared secret
are accepted (and a wrong or expired one refused), and a relay-only client streams through it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aioice import Connection, TransportPolicy

from benchmarks.local_server import ServerProcess, local_server
from server.common.turn_credentials import TurnConfig
from tests.support.coturn import Coturn, coturn

pytestmark = pytest.mark.processes
STOCK_CLIENT = Path(__file__).resolve().parents[1] / "support" / "stock_client.py"


@pytest.fixture(scope="module")
def turn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coturn]:
    with coturn(tmp_path_factory.mktemp("coturn")) as server:
        yield server


async def relay_candidates(server: Coturn, config: TurnConfig) -> list[str]:
    """Allocate on the TURN server with `config`'s credentials; the relay candidates gathered."""
    creds = config.credentials("probe")
    conn = Connection(
        ice_controlling=True,
        turn_server=("127.0.0.1", server.port),
        turn_username=creds["username"],
        turn_password=creds["credential"],
        transport_policy=TransportPolicy.RELAY,
    )
    try:
        await conn.gather_candidates()
        return [c.to_sdp() for c in conn.local_candidates if c.type == "relay"]
    finally:
        await conn.close()


async def test_minted_credentials_are_accepted_and_wrong_or_expired_ones_refused(turn: Coturn) -> None:
    good = TurnConfig((turn.url,), turn.secret, ttl_s=600)
    assert await relay_candidates(turn, good)
    assert not await relay_candidates(turn, TurnConfig((turn.url,), "not-the-secret", ttl_s=600))
    assert not await relay_candidates(turn, TurnConfig((turn.url,), turn.secret, ttl_s=-60))  # expired


@pytest.fixture(scope="module")
def server(turn: Coturn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["--model", "synthetic", "--stage-ms", "20,60,40", "--synthetic-geometry", "tiny"]
    env = {"WORLDRTC_TURN_URLS": json.dumps([turn.url]), "WORLDRTC_TURN_SECRET": turn.secret}
    with local_server(args, tmp_path_factory.mktemp("turn") / "server.log", env=env) as srv:
        yield srv


def test_each_session_gets_its_own_time_limited_credentials(server: ServerProcess, turn: Coturn) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        created = http.post("/v1/sessions", json={}).json()
        sid = created["session_id"]
        try:
            (entry,) = created["ice_servers"]
            assert entry["urls"] == [turn.url]
            expiry, user = entry["username"].split(":")
            assert user == sid and int(expiry) > 0 and entry["credential"]
            again = http.get("/v1/ice-servers", params={"session": sid}).json()["ice_servers"][0]
            assert again["username"].endswith(f":{sid}")
            anonymous = http.get("/v1/ice-servers").json()["ice_servers"][0]
            assert anonymous["username"].split(":")[1].startswith("viewer-")
            assert "secret" not in json.dumps(created) and turn.secret not in json.dumps(created)
        finally:
            http.delete(f"/v1/sessions/{sid}", headers={"authorization": f"Bearer {created['token']}"})


def test_a_relay_only_client_streams_through_coturn(server: ServerProcess, turn: Coturn) -> None:
    cmd = [sys.executable, str(STOCK_CLIENT), server.url, "rest", "32", "--relay"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    candidates = got["offer_candidates"]
    assert candidates and all(" typ relay" in c for c in candidates), candidates  # nothing but the relay
    assert got["frames"] >= 32 and got["pts_increasing"] and got["delete_status"] == 200
    # coturn allocated this session's relay with the credentials minted for it.
    allocations = [ln for ln in turn.log.read_text().splitlines() if "ALLOCATE processed, success" in ln]
    assert any(f":{got['session_id']}>" in ln for ln in allocations), allocations


def test_settings_need_both_turn_urls_and_secret() -> None:
    from server.common.settings import Settings

    with pytest.raises(ValueError, match="WORLDRTC_TURN_URLS and WORLDRTC_TURN_SECRET"):
        Settings(turn_urls=["turn:127.0.0.1:3478"])
    with pytest.raises(ValueError, match="turn: or turns: URLs"):
        Settings(turn_urls=["stun:127.0.0.1:3478"], turn_secret="s")
