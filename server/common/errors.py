"""Domain errors, and the one table that maps them to HTTP statuses and data-channel error codes."""

from __future__ import annotations


class ServerError(Exception):
    code = "internal"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class BadRequest(ServerError):
    code = "bad_request"


class BadImage(BadRequest):
    """A start image that cannot be used: the client should offer another image, not a retry."""

    code = "bad_image"


class UnknownScene(BadRequest):
    code = "unknown_scene"


class Unauthorized(ServerError):
    code = "unauthorized"


class Forbidden(ServerError):
    """A valid credential that does not give this right (a watch token of another session, a revoked one)."""

    code = "forbidden"


class NotFound(ServerError):
    code = "not_found"


class Conflict(ServerError):
    code = "conflict"


class AlreadyConnected(Conflict):
    code = "already_connected"


class SessionClosed(Conflict):
    code = "session_closed"


class UnsupportedMediaType(ServerError):
    code = "unsupported_media_type"


class MethodNotAllowed(ServerError):
    code = "method_not_allowed"


class TooLarge(ServerError):
    code = "too_large"


class Busy(ServerError):
    code = "busy"


class RateLimited(ServerError):
    code = "rate_limited"


class QueueFull(Busy):
    """Every slot is taken and the waiting room is full too (or this address holds its share of it)."""

    code = "queue_full"


class Unavailable(ServerError):
    code = "unavailable"


class Full(Unavailable):
    """A node's capacity probe while every slot is taken (a create on it answers `busy`)."""

    code = "full"


class Loading(Unavailable):
    code = "loading"


class Restarting(Unavailable):
    code = "restarting"


class Draining(Unavailable):
    code = "draining"


class Gone(ServerError):
    """A snapshot that was kept and is not any more (evicted, deleted, lost with a stage)."""

    code = "snapshot_gone"


class TicketGone(ServerError):
    """A waiting-room ticket that was dropped (not polled, left, a no-show): its message says why."""

    code = "ticket_gone"


class InsufficientStorage(ServerError):
    """A snapshot the budget cannot hold."""

    code = "snapshot_too_large"


HTTP_STATUS: dict[type[ServerError], int] = {
    BadRequest: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    MethodNotAllowed: 405,
    Conflict: 409,
    TooLarge: 413,
    UnsupportedMediaType: 415,
    Gone: 410,
    TicketGone: 410,
    Busy: 429,
    RateLimited: 429,
    Unavailable: 503,
    InsufficientStorage: 507,
    ServerError: 500,
}


def http_status(exc: ServerError) -> int:
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500
