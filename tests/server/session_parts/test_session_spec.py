"""What a session generates from (server/session/spec.py): the model's defaults, the client asking for
less time than the server allows (never more), and a branch that takes its line's start, whatever the
create asked for."""

from __future__ import annotations

import numpy as np

from server.common.settings import Settings
from server.session.spec import SessionSpec
from server.snapshots.snapshot import MadeWith, Origin, ServerSnapshot
from workers.chunk_geometry import chunk_num_frames
from workers.models.presets import get_preset

PRESET = get_preset("gridworld")
IMAGE = np.zeros((4, 4, 3), np.uint8)


def test_defaults_come_from_the_model_and_the_shorter_limit_wins() -> None:
    spec = SessionSpec.resolve(PRESET, Settings(), IMAGE, "a town", 3, None, None, None, "town", None)
    assert (spec.fps, spec.chunk_latent_frames, spec.max_duration_s) == (PRESET.fps, PRESET.chunk_latent_frames, None)
    public = Settings(host="0.0.0.0", api_token="t", max_session_s=30)
    assert SessionSpec.resolve(PRESET, public, IMAGE, "", 0, 60, None, None, None, None).max_duration_s == 30
    assert SessionSpec.resolve(PRESET, public, IMAGE, "", 0, 10, None, None, None, None).max_duration_s == 10
    asked = SessionSpec.resolve(PRESET, Settings(), IMAGE, "", 0, None, 10, 2, None, None)
    assert (asked.fps, asked.chunk_latent_frames, asked.chunk_frames) == (10, 2, chunk_num_frames(1, 2))


def test_a_branch_goes_on_with_its_lines_start() -> None:
    line_image = np.full((4, 4, 3), 7, np.uint8)
    origin = Origin(line_image, "the line's prompt", 11, 12, 2, "harbour", line="first")
    snapshot = ServerSnapshot("snap", "first", 3, 1024, 0.0, origin, None, None, MadeWith("tiny", "w", "cpu", 1))
    spec = SessionSpec.resolve(PRESET, Settings(), IMAGE, "ignored", 0, None, 30, 5, "town", snapshot)
    assert spec.image is line_image
    assert (spec.prompt, spec.seed, spec.scene, spec.fps, spec.chunk_latent_frames) == (
        "the line's prompt",
        11,
        "harbour",
        12,
        2,
    )
