"""What REST says of a session (`GET /v1/sessions/{id}` and the listing): its description, state
and figures, read from the session and its parts; nothing here changes the session."""

from __future__ import annotations

import time
from typing import Any

from server.session.session import ServerSession


def session_info(session: ServerSession) -> dict[str, Any]:
    p, spec = session.preset, session.spec
    return {
        "session_id": session.id,
        "state": session.state.value,
        "created_s": time.monotonic() - session.created_t,
        "model": p.name,
        "scene": spec.scene,
        "width": p.width_px,
        "height": p.height_px,
        "fps": spec.fps,
        "chunk_frames": spec.chunk_frames,
        "parent": None if session.parent is None else session.parent.model_dump(),
        "error": session.error,
        "ended": None if session.ended is None else session.ended.value,
        "metrics": {"dispatch": session.controls.config.policy.value, "first_frame_s": session.first_frame_s}
        | session.line.figures()
        | {
            "controls": dict(session.inbox.counts),
            "spectators": len(session.audience),
            "spectators_joined": session.audience.joined,
        },
    }
