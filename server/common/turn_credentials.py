"""Time-limited TURN credentials, minted per session from a secret shared with the TURN server.

This is the TURN REST API scheme that coturn implements (`use-auth-secret` with
`static-auth-secret`): the username is "<expiry unix time>:<user>" and the password is
base64(HMAC-SHA1(secret, username)). coturn recomputes the password from the username and refuses
it after the expiry, so no long-lived password ever reaches a browser, and the server never talks
to the TURN server: they share only the secret.

Each session gets its own pair, in the `POST /v1/sessions` response, from
`GET /v1/ice-servers?session=ID` and, for WHEP, in the answer's `Link` headers. The server's own
peer connection does not relay: it is the reachable end, and its host candidates (on the UDP port
range) are what the TURN server relays to.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TurnConfig:
    urls: tuple[str, ...]  # e.g. ("turn:turn.example.org:3478?transport=udp", "turns:…:5349?transport=tcp")
    secret: str
    ttl_s: float

    def credentials(self, user: str, now_s: float | None = None) -> dict[str, Any]:
        """An RTCIceServer dict for `user`, valid for ttl_s from now."""
        expiry = int((time.time() if now_s is None else now_s) + self.ttl_s)
        username = f"{expiry}:{user}"
        digest = hmac.new(self.secret.encode(), username.encode(), hashlib.sha1).digest()
        return {"urls": list(self.urls), "username": username, "credential": base64.b64encode(digest).decode()}


def ice_servers_for(static: list[dict[str, Any]], turn: TurnConfig | None, user: str) -> list[dict[str, Any]]:
    """The configured STUN/TURN servers plus, with a TURN secret, credentials minted for `user`."""
    return static if turn is None else [*static, turn.credentials(user)]
