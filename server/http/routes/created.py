"""What a create answers (201): the session's info, its token, its TURN servers and where its routes
are. Built here for both ways a session is made: a create that found a slot, and a waiting-room
ticket whose turn came (its `ready` poll carries exactly this)."""

from typing import Any

from server.common.turn_credentials import ice_servers_for
from server.http.routes.watch import watch_url
from server.session.info import session_info
from server.session.session import ServerSession
from server.state import AppState


def created_body(state: AppState, session: ServerSession) -> dict[str, Any]:
    url = state.node_url(f"/v1/sessions/{session.id}")
    settings = state.settings
    return session_info(session) | {
        "token": session.token,
        "ice_servers": ice_servers_for(settings.ice_servers, settings.turn, session.id),
        "session_url": url,
        "offer_url": f"{url}/offer",
        "recording_url": f"{url}/recording",
        "video_url": f"{url}/video.mp4",
        "watch_url": watch_url(state, session),
        "watch_token": session.audience.watch_token,
        "snapshots_url": f"{url}/snapshots",
    }
