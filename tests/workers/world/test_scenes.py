"""The built-in scenes shipped with the server are the embedded world's views, re-rendered exactly."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from server.session.scenes import SCENES_DIR, scene_names
from workers.models.presets import GRIDWORLD
from workers.world import EMBEDDED_WORLD_SEED, World
from workers.world.scenes import render_scenes


@pytest.mark.heavy
def test_shipped_scenes_are_the_rendered_views() -> None:
    rendered = render_scenes(World.generate(EMBEDDED_WORLD_SEED), GRIDWORLD.height_px, GRIDWORLD.width_px)
    assert sorted(rendered) == scene_names()
    for name, rgb in rendered.items():
        assert np.array_equal(np.asarray(Image.open(SCENES_DIR / f"{name}.png").convert("RGB")), rgb), name
