"""Matrix-Game's fixture through the real server: an aiortc client's keys and mouse look, sent over
the data channel, arrive in the DiT worker's action tensors, as the chunk messages report what the
DiT consumed; the stream runs at the preset's 25 FPS and geometry, and the server ends idle."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from benchmarks.local_server import ServerProcess, local_server
from tests.support.waiting import wait_until_async
from workers.models.presets import MATRIX_GAME_TINY
from worldrtc import Session

pytestmark = pytest.mark.processes
WAIT_S = 90.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerProcess]]:
    log = tmp_path_factory.mktemp("e2e-mg") / "server.log"
    with local_server(["--model", MATRIX_GAME_TINY.name, "--placement", "cpu"], log) as srv:
        yield srv.url, srv


def _last_row(chunk: dict, what: str) -> list[float]:
    """The last video frame's action in the chunk's last latent frame's window: a frame of this chunk."""
    return chunk["model_input"][what][-1][-1]


@pytest.mark.long
async def test_keys_and_look_reach_the_action_tensors(server) -> None:
    url, _ = server
    model = httpx.get(f"{url}/v1/model").json()
    assert (model["model"], model["family"], model["fps"]) == (MATRIX_GAME_TINY.name, "matrix-game", 25)
    assert (model["width"], model["height"], model["chunk_frames"]) == (320, 176, 12)  # 0.48 s a chunk
    assert model["accepts"]["look"] and model["accepts"]["meanings"]["w"] == "forward"
    assert model["takes_prompt"] is False

    client = Session(url, scene="main-street", seed=1, keep_frames=8)
    await client.start()
    try:
        frame = (await client.next_frame()).image
        assert frame.shape == (176, 320, 3)
        first = await wait_until_async(lambda: client.run.chunks[:1], WAIT_S, "the first chunk")
        assert _last_row(first[0], "keyboard") == [0, 0, 0, 0] and _last_row(first[0], "mouse") == [0, 0]

        seq = client.send({"type": "control", "key": "w", "action": "press"})
        pressed = await wait_until_async(
            lambda: [c for c in client.run.chunks if (c.get("applied_seq") or 0) >= seq], WAIT_S, "W applied"
        )
        assert _last_row(pressed[0], "keyboard") == [1, 0, 0, 0]  # [W, S, A, D]

        # 60 px of look spread over a chunk's 12 video frames: 5 px a frame, the release's 0.1 of yaw.
        seq = client.look(60.0, 0.0)
        looked = await wait_until_async(
            lambda: [c for c in client.run.chunks if (c.get("applied_seq") or 0) >= seq], WAIT_S, "the look applied"
        )
        assert _last_row(looked[0], "mouse") == pytest.approx([0.0, 0.1])
        assert _last_row(looked[0], "keyboard") == [1, 0, 0, 0]  # W still held
    finally:
        final = await client.close()
    assert final is not None and final["state"] == "closed"

    async def engine_idle() -> dict | None:
        engine = httpx.get(f"{url}/v1/engine").json()
        return None if engine["sessions"] else engine

    engine = await wait_until_async(engine_idle, WAIT_S, "the engine to forget the session")
    assert engine["outstanding_slots"] == 0 and engine["counters"]["leaked_slots"] == 0
