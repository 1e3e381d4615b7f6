"""Log formats: JSON lines carry the session id; text lines show it too."""

from __future__ import annotations

import json
import logging

from server.common.logs import JsonFormatter, TextFormatter


def record(**extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("worldrtc.session", logging.INFO, __file__, 1, "session %s closed", ("abc",), None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_json_lines_carry_session_fields() -> None:
    out = json.loads(JsonFormatter().format(record(session_id="abc", state="closed", reason="deleted")))
    assert out["message"] == "session abc closed" and out["session_id"] == "abc" and out["state"] == "closed"
    assert out["level"] == "info" and out["logger"] == "worldrtc.session" and out["ts"].endswith("Z")


def test_text_lines_show_the_session() -> None:
    assert TextFormatter().format(record(session_id="xyz")).endswith("session=xyz")
    assert "session=" not in TextFormatter().format(record())
