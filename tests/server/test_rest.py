"""REST contract: every route, and the error bodies (httpx through Starlette's TestClient)."""

from __future__ import annotations

import base64
import io
import re

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from server.common.settings import Settings
from server.http.app import create_app
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes

READY_TIMEOUT_S = 120


def wait_ready(client: TestClient) -> None:
    def ready() -> bool:
        r = client.get("/readyz")
        if r.status_code != 200:  # still loading: says so, and when to come back
            assert r.status_code == 503 and r.json()["error"] == "loading", r.text
            assert r.headers.get("retry-after")
        return r.status_code == 200

    wait_until(ready, READY_TIMEOUT_S, "the server to be ready", poll_s=0.2)


@pytest.fixture(scope="module")
def client():
    # These tests create many sessions from one address: the per-client creation rate is tested on
    # its own (the reliability suite).
    settings = Settings(
        model="tiny", placement="cpu", max_sessions=2, offer_timeout_s=30, closed_session_keep_s=0.5, create_burst=1000
    )
    app = create_app(settings)
    with TestClient(app) as c:
        wait_ready(c)
        yield c


def png_data_url(size=(64, 48)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# What a person must never read in an error: object reprs, exception class names, tracebacks.
PYTHON_INTERNALS = re.compile(r"<[\w.]+ object at 0x|\b[A-Z]\w*(Error|Exception)\b|Traceback|BytesIO")


def assert_error(r, status: int, code: str, fragment: str = "") -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "message"}, body
    assert body["error"] == code, body
    assert fragment in body["message"], body
    assert not PYTHON_INTERNALS.search(body["message"]), body


def test_health_ready_model_scenes_ice_metrics_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["ready"] is True
    m = client.get("/v1/model").json()
    assert (m["model"], m["width"], m["height"], m["fps"], m["chunk_frames"]) == ("tiny", 128, 128, 16, 16)
    assert "random weights" in m["weights"]
    assert m["accepts"]["keys"] == sorted("adijklsw") and m["accepts"]["look"] is True
    assert m["accepts"]["meanings"]["j"] == "turn left"
    assert m["kernels"] == {"attention": "auto", "attention_resolved": "auto", "compile": False, "deterministic": False}
    names = [s["name"] for s in m["scenes"]]
    assert "main-street" in names
    png = client.get(m["scenes"][0]["url"])
    assert png.status_code == 200 and png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"
    assert_error(client.get("/v1/scenes/nope"), 404, "not_found", "nope")
    assert client.get("/v1/ice-servers").json() == {"ice_servers": []}
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "worldrtc_event_loop_lag_seconds" in metrics.text
    paths = client.get("/openapi.json").json()["paths"]
    for route in ("/v1/sessions", "/v1/sessions/{session_id}", "/v1/sessions/{session_id}/offer", "/v1/model"):
        assert route in paths
    assert client.get("/").status_code == 200


def test_a_session_needs_nothing_but_a_post(client: TestClient) -> None:
    for body in ({}, {"seed": 5}, None):
        r = client.post("/v1/sessions", json=body) if body is not None else client.post("/v1/sessions")
        assert r.status_code == 201, r.text
        info = r.json()
        assert info["scene"] == "main-street" and info["state"] == "created"  # the default scene
        client.delete(f"/v1/sessions/{info['session_id']}")
    uploaded = client.post("/v1/sessions", json={"image": png_data_url()}).json()
    assert uploaded["scene"] is None
    client.delete(f"/v1/sessions/{uploaded['session_id']}")


def test_session_lifecycle(client: TestClient) -> None:
    r = client.post("/v1/sessions", json={"scene": "main-street", "prompt": "a walk", "seed": 3})
    assert r.status_code == 201, r.text
    info = r.json()
    sid = info["session_id"]
    assert info["state"] == "created" and info["token"] and info["model"] == "tiny"
    assert sid in [s["session_id"] for s in client.get("/v1/sessions").json()["sessions"]]
    got = client.get(f"/v1/sessions/{sid}").json()
    assert got["state"] == "created" and got["token"] is None  # the token is shown once
    # Nothing generated before an offer: nothing recorded yet, and no video.
    assert_error(client.get(f"/v1/sessions/{sid}/recording"), 409, "conflict", "nothing recorded yet")
    assert_error(client.get(f"/v1/sessions/{sid}/video.mp4"), 404, "not_found", "has no video")
    r = client.post("/v1/sessions", json={"image": png_data_url()})
    assert r.status_code == 201
    deleted = client.delete(f"/v1/sessions/{sid}").json()
    assert (deleted["state"], deleted["ended"]) == ("closed", "deleted")
    assert client.delete(f"/v1/sessions/{r.json()['session_id']}").json()["state"] == "closed"
    # An offer after close is refused; after closed_session_keep_s the closed session is forgotten.
    assert_error(client.post(f"/v1/sessions/{sid}/offer", json={"sdp": "v=0", "type": "offer"}), 409, "session_closed")
    wait_until(lambda: client.get(f"/v1/sessions/{sid}").status_code == 404, 30, "the closed session to be forgotten")
    assert_error(client.get(f"/v1/sessions/{sid}"), 404, "not_found")


def test_bad_create_requests(client: TestClient) -> None:
    assert_error(
        client.post("/v1/sessions", content=b"{not json", headers={"content-type": "application/json"}),
        400,
        "bad_request",
    )
    assert_error(client.post("/v1/sessions", json={"scene": "atlantis"}), 400, "unknown_scene", "main-street")
    both = {"scene": "main-street", "image": png_data_url()}
    assert_error(client.post("/v1/sessions", json=both), 400, "bad_request", "not both")
    assert_error(client.post("/v1/sessions", json={"image": "http://x/y.png"}), 400, "bad_image", "data URL")
    assert_error(client.post("/v1/sessions", json={"image": "data:image/png;base64,@@@"}), 400, "bad_image", "base64")
    garbage = "data:image/png;base64," + base64.b64encode(b"not an image at all").decode()
    assert_error(client.post("/v1/sessions", json={"image": garbage}), 400, "bad_image", "not an image")
    cut = png_data_url()[:-40]  # a PNG cut short
    assert_error(client.post("/v1/sessions", json={"image": cut}), 400, "bad_image", "PNG or JPEG")
    assert_error(client.post("/v1/sessions", json={"scene": "main-street", "seed": -1}), 400, "bad_request", "seed")
    assert_error(client.post("/v1/sessions", json={"scene": "main-street", "extra": 1}), 400, "bad_request", "extra")
    assert_error(client.post("/v1/sessions", json={"scene": "main-street", "fps": 7}), 400, "bad_request", "90 kHz")
    too_long = {"scene": "main-street", "chunk_frames": 12}
    assert_error(client.post("/v1/sessions", json=too_long), 400, "bad_request", "attention window")
    huge = "data:image/png;base64," + "A" * (15 * 1024 * 1024)
    assert_error(client.post("/v1/sessions", json={"image": huge}), 413, "too_large")
    assert client.get("/v1/sessions").status_code == 200  # the server keeps working


def test_bad_offers(client: TestClient) -> None:
    assert_error(client.post("/v1/sessions/nope/offer", json={"sdp": "v=0", "type": "offer"}), 404, "not_found")
    sid = client.post("/v1/sessions", json={"scene": "main-street"}).json()["session_id"]
    assert_error(
        client.post(f"/v1/sessions/{sid}/offer", json={"sdp": "x" * 40_000, "type": "offer"}), 413, "too_large"
    )
    assert_error(client.post(f"/v1/sessions/{sid}/offer", json={"sdp": "v=0", "type": "answer"}), 400, "bad_request")
    r = client.post(f"/v1/sessions/{sid}/offer", json={"sdp": "this is not sdp", "type": "offer"})
    assert_error(r, 400, "bad_request", "offer")
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "failed"


def test_full_server_answers_429(client: TestClient) -> None:
    ids = []
    for _ in range(2):
        r = client.post("/v1/sessions", json={"scene": "main-street"})
        assert r.status_code == 201
        ids.append(r.json()["session_id"])
    r = client.post("/v1/sessions", json={"scene": "main-street", "queue": False})  # asks not to wait
    assert_error(r, 429, "busy", "retry")
    assert int(r.headers["retry-after"]) > 0
    for sid in ids:
        client.delete(f"/v1/sessions/{sid}")
    assert client.post("/v1/sessions", json={"scene": "main-street"}).status_code == 201


def test_token_required_when_configured() -> None:
    app = create_app(Settings(model="tiny", placement="cpu", api_token="s3cret"))
    with TestClient(app) as c:
        assert c.get("/healthz").status_code == 200
        assert_error(c.get("/v1/model"), 401, "unauthorized")
        assert c.get("/v1/model", headers={"authorization": "Bearer s3cret"}).status_code == 200
        # Header bytes past ASCII are compared like any others, not an error of the comparison.
        assert_error(
            c.get("/v1/model", headers={"authorization": "Bearer s3cr\xe9t".encode("latin-1")}), 401, "unauthorized"
        )


def test_settings_refuse_open_bind_without_token() -> None:
    with pytest.raises(ValueError, match="WORLDRTC_API_TOKEN"):
        Settings(host="0.0.0.0")
    assert Settings(host="0.0.0.0", api_token="t").is_loopback is False


def test_model_publishes_the_control_contract_and_limits(client: TestClient) -> None:
    m = client.get("/v1/model").json()
    assert m["controls"]["move_keys"] == ["a", "d", "s", "w"] and m["controls"]["key_aliases"]["arrowup"] == "w"
    assert m["limits"]["image_max_bytes"] == 4 * 1024 * 1024 and m["limits"]["control_message_bytes"] == 4096
    assert m["fps"] == 16 and m["dispatch"] == "jit"


def test_cors_allowlist() -> None:
    app = create_app(Settings(model="tiny", placement="cpu", cors_origins=["http://studio.example"]))
    c = TestClient(app)  # no lifespan: preflights are answered by middleware, no engine needed
    asked = {"origin": "http://studio.example", "access-control-request-method": "POST"}
    allowed = c.options("/v1/sessions", headers=asked)
    assert allowed.headers.get("access-control-allow-origin") == "http://studio.example"
    other = c.options("/v1/sessions", headers={**asked, "origin": "http://elsewhere.example"})
    assert "access-control-allow-origin" not in other.headers
