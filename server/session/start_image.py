"""A session's start image from its create request: a built-in scene by name, an uploaded data URL,
or neither (the default scene), decoded and fitted to the model's resolution.

It decodes and resizes, so it runs in a worker thread (server/state.py `new_session`), never on the
event loop.
"""

import base64
import binascii
from pathlib import Path

import numpy as np

from server.common.errors import BadImage, BadRequest, TooLarge, UnknownScene
from server.common.settings import Settings
from server.session.scenes import default_scene, scene_names, scene_path
from server.wire.protocol import CreateSessionRequest
from workers.images import ImageError, fit_image, read_image
from workers.models.presets import ModelPreset

DATA_URL_OVERHEAD = 4 / 3  # base64


def start_image(body: CreateSessionRequest, preset: ModelPreset, settings: Settings) -> tuple[str | None, np.ndarray]:
    """(scene name or None, HxWx3 uint8 at the model's resolution) from a scene name, a data URL, or
    neither: the default scene. Runs in a worker thread."""
    if body.scene is not None and body.image is not None:
        raise BadRequest("give 'scene' (a built-in scene name) or 'image' (a data URL), not both")
    scene = body.scene if body.scene is not None or body.image is not None else default_scene()
    if scene is not None:
        path = scene_path(scene)
        if path is None:
            raise UnknownScene(f"there is no built-in scene {scene!r}; choose one of {', '.join(scene_names())}")
        source: Path | bytes = path
    else:
        assert body.image is not None
        header, _, payload = body.image.partition(",")
        if not header.startswith("data:image/") or ";base64" not in header:
            raise BadImage("'image' must be a data URL: data:image/png;base64,... or data:image/jpeg;base64,...")
        if len(payload) > settings.image_max_bytes * DATA_URL_OVERHEAD + 4:
            raise TooLarge(f"images are limited to {settings.image_max_bytes // (1024 * 1024)} MiB")
        try:
            source = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise BadImage("'image' is not valid base64") from None
    try:
        return scene, fit_image(read_image(source, settings.image_max_pixels), preset.height_px, preset.width_px)
    except ImageError as exc:
        raise BadImage(f"the start image cannot be used: {exc}") from None
