"""The request body limit, per route, enforced before a body is read whole.

An SDP offer, a session create (which may carry a start image as a data URL) and every other body
each have their own limit in the settings; a request over it is refused 413 with the server's one
JSON error shape, whether it announces its length or streams past it.
"""

from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from server.common.settings import Settings
from server.session.start_image import DATA_URL_OVERHEAD
from server.wire.protocol import ErrorBody


class BodyLimit:
    """Pure ASGI middleware: refuse request bodies over the route's limit before reading them whole."""

    def __init__(self, app: Callable[..., Awaitable[None]], settings: Settings) -> None:
        self.app = app
        self.settings = settings

    def _limit(self, path: str) -> int:
        s = self.settings
        if path.endswith("/offer") or path.rstrip("/") == "/v1/whep":
            return s.sdp_max_bytes + 1024
        if path.rstrip("/") == "/v1/sessions":
            return int(s.image_max_bytes * DATA_URL_OVERHEAD) + s.rest_body_max_bytes
        return s.rest_body_max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope["path"])
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._refuse(send, limit)
            return
        seen = 0
        exceeded = started = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen, exceeded
            if exceeded:
                raise _TooLargeBody()
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    exceeded = True
                    raise _TooLargeBody()
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            # The app may turn the cut-off into an error of its own (FastAPI: 400, "error parsing
            # the body"); the client gets the 413 instead.
            nonlocal started
            if exceeded:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        with suppress(_TooLargeBody):
            await self.app(scope, limited_receive, guarded_send)
        if exceeded and not started:
            await self._refuse(send, limit)

    @staticmethod
    async def _refuse(send: Callable[..., Any], limit: int) -> None:
        body = ErrorBody(error="too_large", message=f"request body over the {limit}-byte limit for this route")
        payload = body.model_dump_json().encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class _TooLargeBody(Exception):
    pass
