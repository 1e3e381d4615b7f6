"""Rows 16-19: who may call what, from which origin, and where the server listens.

16 auth matrix      every route × no token, wrong, server's, own session's, its watch token, another session's,
                    in the query
17 route inventory  every route of the app, as built: documented here, and 401 without a token
18 CORS             allowed, disallowed and `null` origins
19 default bind     every listening socket of a default server (HTTP, and ICE during a session)
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi.testclient import TestClient
from starlette.routing import Mount, Route

from benchmarks.local_server import local_server
from benchmarks.reliability.harness import CaseResult, Lab, ServerConfig, ServerUnderTest, case, equal, holds
from server.common.settings import Settings
from server.http.app import create_app
from worldrtc import Session

API_TOKEN = "reliability-api-token-0123456789"
WITH_TOKEN = ServerConfig().with_env(api_token=API_TOKEN, create_burst=100_000, max_sessions=8)

# Every route the app serves, by who may call it where the server has an API token. A route missing
# here, or here but not served, fails row 17: a new route has to be placed in this table.
PUBLIC = "public"  # health, readiness, the browser client's files
API = "api"  # the server's API token
SESSION = "session"  # the API token, or the session's own token
WATCH = "watch"  # the API token, or the session's watch token (never its driver token)
# The API token, or a token of the snapshot's line. For the unknown snapshot these rows ask about,
# any session's token gets 404 (row 30 checks ownership on real snapshots: another line's is 403).
LINE = "line"
# The API token, or the ticket's own token (row 32 checks a ticket's own; here the unknown ticket
# these rows ask about gets 404 for the API token and 401 for any other).
TICKET = "ticket"
ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/capacityz"): PUBLIC,  # a balancer health-checks it
    ("GET", "/"): PUBLIC,
    ("GET", "/static"): PUBLIC,
    ("GET", "/openapi.json"): API,
    ("GET", "/v1/model"): API,
    ("GET", "/v1/scenes/{name}"): API,
    ("GET", "/v1/ice-servers"): API,
    ("GET", "/v1/engine"): API,
    ("GET", "/metrics"): API,
    ("POST", "/v1/sessions"): API,
    ("GET", "/v1/sessions"): API,
    ("GET", "/v1/sessions/{session_id}"): SESSION,
    ("GET", "/v1/sessions/{session_id}/timeline"): SESSION,
    ("GET", "/v1/sessions/{session_id}/recording"): SESSION,
    ("GET", "/v1/sessions/{session_id}/video.mp4"): SESSION,
    ("DELETE", "/v1/sessions/{session_id}"): SESSION,
    ("POST", "/v1/sessions/{session_id}/offer"): SESSION,
    ("POST", "/v1/whep"): API,
    ("DELETE", "/v1/whep/{session_id}"): API,
    ("PATCH", "/v1/whep/{session_id}"): API,
    ("POST", "/v1/sessions/{session_id}/watch"): WATCH,
    ("DELETE", "/v1/sessions/{session_id}/watch/{spectator_id}"): WATCH,
    ("PATCH", "/v1/sessions/{session_id}/watch/{spectator_id}"): WATCH,
    ("POST", "/v1/sessions/{session_id}/watch-token"): SESSION,
    ("DELETE", "/v1/sessions/{session_id}/watch-token"): SESSION,
    ("POST", "/v1/sessions/{session_id}/snapshots"): SESSION,
    ("POST", "/v1/sessions/{session_id}/restore"): SESSION,
    ("GET", "/v1/snapshots"): LINE,
    ("GET", "/v1/snapshots/{snapshot_id}"): LINE,
    ("DELETE", "/v1/snapshots/{snapshot_id}"): LINE,
    ("GET", "/v1/tickets/{ticket_id}"): TICKET,
    ("DELETE", "/v1/tickets/{ticket_id}"): TICKET,
}
CREDENTIALS = ("none", "wrong", "api", "own", "watch", "other", "query")


@dataclass(frozen=True)
class Credential:
    name: str
    header: str | None  # the Authorization value
    query: str = ""


def _routes_of(settings: Settings) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves: its routing table (mounts as their prefix) and,
    for routes that come from included routers, its OpenAPI schema."""
    app = create_app(settings)
    out: set[tuple[str, str]] = set()
    for route in app.routes:
        if isinstance(route, Mount):
            out.add(("GET", route.path))
        elif isinstance(route, Route):
            out |= {(m, route.path) for m in (route.methods or ()) if m != "HEAD"}
    for path, operations in app.openapi()["paths"].items():
        out |= {(method.upper(), path) for method in operations}
    return out


def _concrete(path: str, sid: str) -> str:
    path = path.replace("{session_id}", sid).replace("{spectator_id}", "0123456789abcdef")
    path = path.replace("{snapshot_id}", "0123456789abcdef").replace("{ticket_id}", "0123456789abcdef")
    return path.replace("{name}", "main-street").replace("/static", "/static/js/main.js")


def _body(method: str, path: str) -> dict[str, Any]:
    if path.endswith("/offer"):
        return {"json": {"sdp": "v=0", "type": "offer"}}
    if (path == "/v1/whep" or path.endswith("/watch")) and method == "POST":
        return {"content": b"v=0\r\n", "headers": {"content-type": "application/sdp"}}
    if path == "/v1/sessions" and method == "POST":
        return {"json": {}}
    if path.endswith("/restore"):
        return {"json": {"snapshot": "0123456789abcdef"}}
    return {}


@case(
    16,
    "auth matrix",
    "every route × no token, wrong token, the server's, the session's own, its watch token, another session's, "
    "token in the query",
    "only the right ones pass (a watch token opens only the watch routes); tokens never appear in logs or bodies",
)
def auth_matrix(lab: Lab, r: CaseResult) -> None:
    server = lab.server(WITH_TOKEN)
    api = {"authorization": f"Bearer {API_TOKEN}"}
    anon = httpx.Client(base_url=server.url, timeout=30)
    seen_tokens: set[str] = {API_TOKEN}
    bodies: list[str] = []
    wrong: list[str] = []
    outcomes: dict[str, dict[str, int]] = {}
    for (method, path), who in sorted(ROUTES.items()):
        for cred_name in CREDENTIALS:
            # Fresh sessions for every request: a DELETE or a bad offer must not change the next answer.
            own = anon.post("/v1/sessions", json={}, headers=api).json()
            other = anon.post("/v1/sessions", json={}, headers=api).json()
            seen_tokens |= {own["token"], other["token"], own["watch_token"], other["watch_token"]}
            cred = {
                "none": Credential("none", None),
                "wrong": Credential("wrong", "Bearer not-the-token"),
                "api": Credential("api", f"Bearer {API_TOKEN}"),
                "own": Credential("own", f"Bearer {own['token']}"),
                "watch": Credential("watch", f"Bearer {own['watch_token']}"),
                "other": Credential("other", f"Bearer {other['token']}"),
                "query": Credential("query", None, f"?token={API_TOKEN}&access_token={API_TOKEN}"),
            }[cred_name]
            kwargs = _body(method, path)
            headers = dict(kwargs.pop("headers", {}))
            if cred.header:
                headers["authorization"] = cred.header
            url = _concrete(path, own["session_id"]) + cred.query
            resp = anon.request(method, url, headers=headers, **kwargs)
            outcomes.setdefault(f"{method} {path}", {})[cred_name] = resp.status_code
            should_pass = (
                who == PUBLIC
                or cred_name == "api"
                or (who == SESSION and cred_name == "own")
                or (who == WATCH and cred_name == "watch")
                or (who == LINE and cred_name in ("own", "other"))
            )
            if (resp.status_code not in (401, 403)) != should_pass:
                wrong.append(f"{method} {path} with {cred_name}: {resp.status_code}")
            # The create answer carries the session's tokens, and a new watch token is the answer to its POST.
            if not (method == "POST" and path.endswith(("/v1/sessions", "/watch-token"))):
                bodies.append(resp.text)
            for sid in (own["session_id"], other["session_id"]):
                anon.delete(f"/v1/sessions/{sid}", headers=api)
    anon.close()
    log = server.log_text()
    in_log = sorted(t[:6] + "…" for t in seen_tokens if t in log)
    in_bodies = sorted(t[:6] + "…" for t in seen_tokens if any(t in b for b in bodies))
    r.figures = {"outcomes": outcomes, "wrong": wrong, "tokens_in_log": in_log, "tokens_in_bodies": in_bodies}
    r.checks = [
        equal("requests answered otherwise than the table says", len(wrong), 0),
        equal("requests made", sum(len(v) for v in outcomes.values()), len(CREDENTIALS) * len(ROUTES)),
        equal("tokens found in the server log", in_log, []),
        equal("tokens found in response bodies", in_bodies, []),
        holds("query strings in the access log are redacted", "token=redacted" in log),
    ]


@case(
    17,
    "route inventory",
    "iterate the app's routes (built with an API token) and call each without one",
    "every route but health, readiness and static files needs auth; nothing admin on the public listener",
)
def route_inventory(lab: Lab, r: CaseResult) -> None:
    settings = Settings(model="synthetic", stage_ms="20,150,100", synthetic_geometry="gridworld", api_token=API_TOKEN)
    served = _routes_of(settings)
    undocumented = sorted(f"{m} {p}" for m, p in served - set(ROUTES))
    missing = sorted(f"{m} {p}" for m, p in set(ROUTES) - served)
    # No lifespan: the engine is not started; authentication comes before anything else.
    client = TestClient(create_app(settings))
    open_routes = []
    for method, path in sorted(served):
        resp = client.request(method, _concrete(path, "0123456789abcdef"), **_body(method, path))
        if resp.status_code != 401:
            open_routes.append(f"{method} {path}: {resp.status_code}")
    expected_open = sorted(f"{m} {p}" for (m, p), who in ROUTES.items() if who == PUBLIC)
    opened = sorted(x.split(":")[0] for x in open_routes)
    no_token = _routes_of(Settings(model="synthetic", stage_ms="20,150,100", synthetic_geometry="gridworld"))
    docs = sorted(f"{m} {p}" for m, p in no_token - served)
    # The only writes are to sessions, their snapshots and a place in line: nothing configures,
    # reloads or stops the server over HTTP.
    viewers = ("/v1/sessions", "/v1/whep", "/v1/snapshots", "/v1/tickets")
    admin = sorted(f"{m} {p}" for m, p in served if m != "GET" and not p.startswith(viewers))
    r.figures = {"served": sorted(f"{m} {p}" for m, p in served), "open_without_token": open_routes}
    r.checks = [
        equal("routes not in the table", undocumented, []),
        equal("routes in the table not served", missing, []),
        equal("routes answering without a token", opened, expected_open),
        equal("routes that change anything but a viewer's own session (admin)", admin, []),
        equal(
            "routes added without a token (docs pages)", docs, ["GET /docs", "GET /docs/oauth2-redirect", "GET /redoc"]
        ),
    ]


@case(
    18,
    "CORS",
    "requests and preflights from an allowed, a disallowed and the `null` origin",
    "only allow-listed origins are echoed (with Vary: Origin); never * with credentials",
)
def cors(lab: Lab, r: CaseResult) -> None:
    allowed = "https://viewer.example"
    server = lab.server(ServerConfig().with_env(cors_origins=f'["{allowed}"]'))
    default = lab.server(ServerConfig())
    results: dict[str, dict[str, Any]] = {}
    for label, srv in (("allow-listed server", server), ("default server", default)):
        for origin in (allowed, "https://evil.example", "null"):
            simple = srv.http.get("/v1/model", headers={"origin": origin})
            pre = srv.http.options(
                "/v1/sessions",
                headers={
                    "origin": origin,
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "authorization, content-type",
                },
            )
            results[f"{label} / {origin}"] = {
                "simple_acao": simple.headers.get("access-control-allow-origin"),
                "simple_vary": simple.headers.get("vary"),
                "preflight_status": pre.status_code,
                "preflight_acao": pre.headers.get("access-control-allow-origin"),
                "credentials": simple.headers.get("access-control-allow-credentials")
                or pre.headers.get("access-control-allow-credentials"),
            }
    ok = results[f"allow-listed server / {allowed}"]
    echoed_elsewhere = [
        k
        for k, v in results.items()
        if k != f"allow-listed server / {allowed}" and (v["simple_acao"] or v["preflight_acao"])
    ]
    r.figures = results
    r.checks = [
        equal("allowed origin echoed", ok["simple_acao"], allowed),
        holds("with Vary: Origin", "origin" in (ok["simple_vary"] or "").lower(), ok["simple_vary"]),
        equal("allowed origin's preflight", [ok["preflight_status"], ok["preflight_acao"]], [200, allowed]),
        equal("origins echoed that are not allow-listed", echoed_elsewhere, []),
        holds(
            "never * with credentials", not any(v["simple_acao"] == "*" and v["credentials"] for v in results.values())
        ),
    ]


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%")[0]).is_loopback


@case(
    19,
    "default bind",
    "a server started with no --host, with a viewer connected",
    "every listening socket (HTTP, ICE) on loopback",
)
def default_bind(lab: Lab, r: CaseResult) -> None:
    with local_server(list(ServerConfig().args), lab.log_dir / "default-bind.log", host=None) as process:
        server = ServerUnderTest(process)

        async def with_viewer() -> list[tuple[str, str, int]]:
            s = await Session(server.url).start()
            await asyncio.wait_for(s.next_frame(), 60)
            sockets = server.listening()
            await s.close()
            return sockets

        try:
            sockets = asyncio.run(with_viewer())
        finally:
            server.close()
    outside = [f"{kind} {addr}:{port}" for kind, addr, port in sockets if not _loopback(addr)]
    r.figures = {"sockets": [f"{k} {a}:{p}" for k, a, p in sockets]}
    r.checks = [
        holds("an HTTP listener found", any(k == "tcp" for k, _, _ in sockets)),
        holds("ICE sockets found (UDP)", any(k == "udp" for k, _, _ in sockets)),
        equal("sockets not on loopback", outside, []),
    ]
