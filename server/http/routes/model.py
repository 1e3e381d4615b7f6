"""What a client reads before it starts a session: the model, its controls and limits
(`/v1/model`), the built-in start scenes, and the STUN/TURN servers for its peer connection."""

import secrets
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse

from server.common.errors import NotFound
from server.common.turn_credentials import ice_servers_for
from server.http.dependencies import StateDep, require_token
from server.session.scenes import scene_names, scene_path
from server.wire.protocol import MAX_CONTROL_MESSAGE_BYTES, MAX_PROMPT_CHARS, MAX_TRANSITION_CHUNKS
from workers.chunk_geometry import chunk_num_frames
from workers.controls import client_contract
from workers.families.registry import family_for

router = APIRouter()


@router.get("/v1/model", dependencies=[Depends(require_token)])
async def model(state: StateDep) -> dict[str, Any]:
    p, settings = state.preset, state.settings
    return {
        "model": p.name,
        "family": p.family.value,
        "weights": p.weights_note,
        "width": p.width_px,
        "height": p.height_px,
        "fps": state.fps,
        "chunk_frames": chunk_num_frames(1, p.chunk_latent_frames),
        "placement": state.placement.name,
        "dispatch": settings.dispatch.value,
        "kernels": settings.kernels.record(state.placement.stage_devices("dit")[0]),
        # The memory savings that run (asked for, or added by the plan to fit), and their flags.
        "savings": state.savings.record() | {"flags": state.savings.names(), "exact": state.savings.exact},
        "controls": client_contract(),
        "accepts": p.controls.record(),
        "takes_prompt": p.t5 is not None,  # Matrix-Game conditions on the start image only
        # A data-channel `prompt` changes the world from the DiT's next chunk (else: error not_supported).
        "live_prompts": family_for(p).live_prompts,
        # World events the weights learned (the page's chips): each one's name and the prompt that names it.
        "events": [{"name": name, "prompt": prompt} for name, prompt in state.events.items()],
        "limits": {
            "control_message_bytes": MAX_CONTROL_MESSAGE_BYTES,
            "control_rate_per_s": settings.control_rate_per_s,
            "abuse_limit": settings.abuse_limit,
            "abuse_window_s": settings.abuse_window_s,
            "create_burst": settings.create_burst,
            "create_rate_per_min": settings.create_rate_per_min,
            "rest_body_max_bytes": settings.rest_body_max_bytes,
            "image_max_bytes": settings.image_max_bytes,
            "image_max_pixels": settings.image_max_pixels,
            "sdp_max_bytes": settings.sdp_max_bytes,
            "max_prompt_chars": MAX_PROMPT_CHARS,
            "max_transition_chunks": MAX_TRANSITION_CHUNKS,
            "prompt_rate_per_s": settings.prompt_rate_per_s,
            "idle_timeout_s": settings.idle_timeout_s,
            "peer_timeout_s": settings.peer_timeout_s,
            "max_session_s": settings.session_limit_s,
        },
        "scenes": [{"name": n, "url": f"/v1/scenes/{n}"} for n in scene_names()],
        "ready": state.ready,
    }


@router.get("/v1/scenes/{name}", dependencies=[Depends(require_token)])
async def scene(name: str) -> FileResponse:
    path = scene_path(name)
    if path is None:
        raise NotFound(f"no scene {name!r}; see GET /v1/model for the list")
    return FileResponse(path, media_type="image/png")


@router.get("/v1/ice-servers", dependencies=[Depends(require_token)])
async def ice_servers(state: StateDep, session: str | None = None) -> dict[str, Any]:
    """STUN/TURN servers for a client's RTCPeerConnection; TURN credentials are minted for
    `session` (or for an anonymous viewer) and expire after WORLDRTC_TURN_TTL_S."""
    user = session if session in state.sessions else f"viewer-{secrets.token_hex(4)}"
    settings = state.settings
    return {"ice_servers": ice_servers_for(settings.ice_servers, settings.turn, user)}
