"""What WHEP (RFC 9725) carries over HTTP: an SDP offer in the request body, the STUN/TURN servers
out in `Link` headers.

Shared by the drivers' endpoint (server/http/routes/whep.py) and the spectators' (server/http/routes/watch.py), which
otherwise know nothing of each other's routes.
"""

from typing import Any

from fastapi import Request

from server.common.errors import BadRequest, UnsupportedMediaType

SDP = "application/sdp"


def ice_server_links(ice_servers: list[dict[str, Any]]) -> list[str]:
    """RFC 9725 section 4.6 `Link` values for the configured STUN/TURN servers."""
    links = []
    for server in ice_servers:
        urls = server.get("urls", [])
        for url in [urls] if isinstance(urls, str) else urls:
            link = f'<{url}>; rel="ice-server"'
            if "username" in server and "credential" in server:
                link += f'; username="{server["username"]}"; credential="{server["credential"]}"'
                link += '; credential-type="password"'
            links.append(link)
    return links


async def read_sdp_offer(request: Request) -> str:
    """A WHEP request's body: an SDP offer, as text."""
    if request.headers.get("content-type", "").split(";")[0].strip() != SDP:
        raise UnsupportedMediaType(f"a WHEP offer is an SDP document: send Content-Type: {SDP}")
    try:
        return (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the SDP offer is not UTF-8 text") from None
