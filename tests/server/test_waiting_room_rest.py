"""The waiting room over REST on a real server (the synthetic model's stage workers): 202 tickets,
polls, the hand-over of a freed slot to the head of the line, and every way a ticket is dropped.
Nobody connects here (tests/server/test_turns.py drives real peers)."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from server.common.settings import Settings
from server.http.app import create_app
from tests.server.test_rest import assert_error, wait_ready
from tests.support.waiting import wait_until

pytestmark = pytest.mark.processes
WINDOW_S = 1.5  # the connect window and the silence after which a ticket is dropped


@pytest.fixture(scope="module")
def client():
    settings = Settings(
        model="synthetic",
        stage_ms="10,30,20",
        synthetic_geometry="tiny",
        max_sessions=1,
        queue_max=3,
        ticket_silence_s=WINDOW_S,
        connect_window_s=WINDOW_S,
        closed_session_keep_s=0.2,
        create_burst=1000,
    )
    with TestClient(create_app(settings)) as c:
        wait_ready(c)
        yield c


def poll(client: TestClient, ticket: dict, token: str | None = None):
    return client.get(ticket["poll_url"], headers={"authorization": f"Bearer {token or ticket['ticket_token']}"})


def test_a_full_server_hands_out_tickets_and_seats_the_head_when_the_slot_frees(client: TestClient) -> None:
    first = client.post("/v1/sessions", json={})
    assert first.status_code == 201, first.text
    r = client.post("/v1/sessions", json={"seed": 7})
    assert r.status_code == 202, r.text
    ticket = r.json()
    assert ticket["state"] == "waiting" and (ticket["position"], ticket["waiting"]) == (1, 1)
    assert ticket["estimated_wait_s"] > 0 and r.headers["location"] == ticket["poll_url"]
    assert "watch_url" not in ticket, "nothing streams yet: there is no world to watch"
    second = client.post("/v1/sessions", json={}).json()
    assert (second["position"], second["waiting"]) == (2, 2)
    assert_error(poll(client, ticket, second["ticket_token"]), 401, "unauthorized", "ticket token")
    assert_error(client.get(ticket["poll_url"]), 401, "unauthorized")

    # "queue": false still gets 429, and so does a WHEP offer (its client cannot hold a ticket).
    assert_error(client.post("/v1/sessions", json={"queue": False}), 429, "busy")
    whep = client.post("/v1/whep", content="v=0\r\n", headers={"content-type": "application/sdp"})
    assert whep.status_code == 429 and whep.json()["error"] == "busy"

    client.delete(f"/v1/sessions/{first.json()['session_id']}")

    def ready() -> dict | None:
        body = poll(client, ticket).json()
        return body if body["state"] == "ready" else None

    body = wait_until(ready, 10, "the head ticket's session", poll_s=0.6)
    session = body["session"]
    assert 0 < body["connect_by_s"] <= WINDOW_S and session["token"] and session["offer_url"].endswith("/offer")
    assert client.get(f"/v1/sessions/{session['session_id']}").json()["state"] == "created"
    assert (poll(client, second).json()["position"]) == 1

    # Nobody offers within the connect window: the slot passes on to the next ticket.
    def passed_on() -> bool:
        return poll(client, second).json()["state"] == "ready"

    wait_until(passed_on, 10, "the no-show's slot to pass on", poll_s=0.6)
    assert_error(poll(client, ticket), 410, "ticket_gone", "no offer within 1.5 s")
    held = poll(client, second).json()["session"]["session_id"]
    left = client.delete(second["poll_url"], headers={"authorization": f"Bearer {second['ticket_token']}"})
    assert left.status_code == 200
    assert_error(poll(client, second), 410, "ticket_gone", "left the line")
    wait_until(lambda: client.get(f"/v1/sessions/{held}").status_code == 404, 10, "the left ticket's session to go")
    metrics = client.get("/metrics").text
    assert 'worldrtc_queue_dropped_total{reason="no_show"} 1.0' in metrics
    assert 'worldrtc_queue_dropped_total{reason="left"} 1.0' in metrics
    assert "worldrtc_queue_wait_seconds_count 2.0" in metrics


def test_a_silent_ticket_loses_its_place_and_the_line_is_bounded(client: TestClient) -> None:
    holder = client.post("/v1/sessions", json={})
    assert holder.status_code == 201, holder.text
    try:
        tickets = [client.post("/v1/sessions", json={}) for _ in range(2)]
        assert [t.status_code for t in tickets] == [202, 202]
        # One address holds at most 2 tickets (the test client is one address).
        assert_error(client.post("/v1/sessions", json={}), 429, "queue_full", "already holds 2 tickets")
        quiet, polled = (t.json() for t in tickets)
        deadline = time.monotonic() + WINDOW_S * 2.5
        while time.monotonic() < deadline:
            assert poll(client, polled).status_code == 200
            time.sleep(0.6)
        assert_error(poll(client, quiet), 410, "ticket_gone", "not polled for 1.5 s")
        assert poll(client, polled).json()["position"] == 1
        for _ in range(6):  # 2 a second, 5 at once
            r = poll(client, polled)
        assert_error(r, 429, "rate_limited", "at most 2 times a second")
        assert int(r.headers["retry-after"]) >= 1
        client.delete(polled["poll_url"], headers={"authorization": f"Bearer {polled['ticket_token']}"})
    finally:
        client.delete(f"/v1/sessions/{holder.json()['session_id']}")
    assert 'worldrtc_queue_dropped_total{reason="silent"} 1.0' in client.get("/metrics").text
