"""Errors as HTTP responses, in one JSON shape everywhere (`ErrorBody`: a code and a message).

A domain error (server/common/errors.py) gets the status its table maps it to, and `Retry-After` when it
says when to retry; a request that fails validation is a 400 naming the first field at fault; the
router's own 404 and 405 keep their status in the same shape.
"""

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from server.common.errors import ServerError, http_status
from server.wire.protocol import ErrorBody


def add_error_handlers(app: FastAPI) -> None:
    app.exception_handler(ServerError)(on_server_error)
    app.exception_handler(RequestValidationError)(on_validation)
    app.exception_handler(StarletteHTTPException)(on_http)


async def on_server_error(request: Request, exc: ServerError) -> JSONResponse:
    headers = {"Retry-After": str(int(exc.retry_after_s))} if exc.retry_after_s else None
    body = ErrorBody(error=exc.code, message=exc.message).model_dump()
    return JSONResponse(body, status_code=http_status(exc), headers=headers)


async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = first.get("loc", ())
    json_error = first.get("type") == "json_invalid"  # its loc ends with a character offset
    where = ".".join(str(p) for p in loc if p != "body" and not json_error) or "body"
    body = ErrorBody(error="bad_request", message=f"{where}: {first.get('msg')}").model_dump()
    return JSONResponse(body, status_code=400)


async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse(ErrorBody(error=code, message=str(exc.detail)).model_dump(), status_code=exc.status_code)
