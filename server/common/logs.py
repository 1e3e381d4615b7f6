"""Logging setup: plain text for a terminal, or one JSON object per line for log collectors.

Records may carry a `session_id` (pass `extra={"session_id": ...}`); both formats show it.
Access-log lines keep the query's names but not its values: a client that puts a token (or a private
prompt) in a URL must not find it in the logs.
"""

from __future__ import annotations

import json
import logging
import time
from urllib.parse import parse_qsl, urlencode


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("session_id", "state", "reason"):
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        session = getattr(record, "session_id", None)
        return line if session is None or f"session={session}" in line else f"{line} session={session}"


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class RedactQuery(logging.Filter):
    """uvicorn.access records: `(client, method, path?query, http version, status)`; the query's
    values become `redacted`."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def redact_query(path: str) -> str:
    base, _, query = path.partition("?")
    names = [name for name, _ in parse_qsl(query, keep_blank_values=True)]
    return f"{base}?{urlencode([(name, 'redacted') for name in names])}" if names else base


def redact_access_log() -> None:
    """Call after uvicorn has configured its loggers."""
    logging.getLogger("uvicorn.access").addFilter(RedactQuery())
