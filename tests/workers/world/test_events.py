"""World events drawn over a view, and walks whose event switches at a chunk boundary."""

from __future__ import annotations

import numpy as np
import pytest

from workers.controls import ChunkControl
from workers.models.camera import Intrinsics
from workers.training.latents import PROMPTS, event_schedule
from workers.world import (
    EMBEDDED_WORLD_SEED,
    EVENT_PROMPTS,
    World,
    WorldEvent,
    apply_event,
    event_of_prompt,
    render_path,
)
from workers.world.render import FLOOR, SKY

SIZE = 64
INTR = Intrinsics.default(SIZE, SIZE)


@pytest.fixture(scope="module")
def world() -> World:
    return World.generate(EMBEDDED_WORLD_SEED)


def luma(rgb: np.ndarray) -> np.ndarray:
    return rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)


def test_each_event_changes_the_view_as_it_names(world: World) -> None:
    layers = world.render_layers(world.start_pose(), INTR, SIZE, SIZE)
    assert (layers.kind == SKY).any() and (layers.kind == FLOOR).any()
    day = apply_event(layers, WorldEvent.DAY)
    assert day is layers.rgb
    views = {e: apply_event(layers, e, frame=3) for e in WorldEvent}
    for event, view in views.items():
        assert view.shape == day.shape and view.dtype == np.uint8
        if event is not WorldEvent.DAY:
            assert np.abs(view.astype(int) - day).mean() > 20, event  # a change anyone sees
    floor = layers.kind == FLOOR
    assert luma(views[WorldEvent.NIGHT]).mean() < 0.4 * luma(day).mean()
    assert luma(views[WorldEvent.SNOW])[floor].mean() > 200  # the ground turns white
    fog = views[WorldEvent.FOG].astype(np.float32)
    assert fog.std(axis=(0, 1)).mean() < 0.6 * day.astype(np.float32).std(axis=(0, 1)).mean()  # less contrast
    dusk = views[WorldEvent.DUSK].astype(np.float32)
    assert (dusk[..., 0] - dusk[..., 2]).mean() > (day[..., 0].astype(np.float32) - day[..., 2]).mean() + 20  # warm


def test_snow_falls_from_frame_to_frame_and_nothing_else_moves(world: World) -> None:
    layers = world.render_layers(world.start_pose(), INTR, SIZE, SIZE)
    a, b = apply_event(layers, WorldEvent.SNOW, 0), apply_event(layers, WorldEvent.SNOW, 1)
    changed = (a != b).any(axis=2)
    assert 0 < changed.mean() < 0.1  # a few flakes' pixels
    assert np.array_equal(apply_event(layers, WorldEvent.NIGHT, 0), apply_event(layers, WorldEvent.NIGHT, 9))


def test_prompts_name_their_events() -> None:
    for event, prompts in EVENT_PROMPTS.items():
        assert all(event_of_prompt(p) is event for p in prompts)
    assert event_of_prompt("  It Starts To  SNOW ") is WorldEvent.SNOW
    assert event_of_prompt("a red car") is None
    assert not {event_of_prompt(p) for p in PROMPTS} - {None, WorldEvent.DAY}


def test_a_walk_switches_its_event_at_a_chunk_and_its_start_image_stays_day(world: World) -> None:
    controls = [ChunkControl.from_keys(("w",))] * 3
    day, _ = render_path(world, controls, 2, SIZE, SIZE, INTR)
    switch = (WorldEvent.DAY, WorldEvent.SNOW, WorldEvent.DAY)
    snowy, poses = render_path(world, controls, 2, SIZE, SIZE, INTR, events=switch)
    first = 2 * 4 - 3  # frames of the first chunk (chunk geometry: 4C − 3)
    assert np.array_equal(snowy[:first], day[:first])
    assert np.array_equal(snowy[first + 8 :], day[first + 8 :])
    for i in range(first, first + 8):
        want = apply_event(world.render_layers(poses[i], INTR, SIZE, SIZE), WorldEvent.SNOW, i)
        assert np.array_equal(snowy[i], want)
    fog_from_start, _ = render_path(world, controls[:1], 2, SIZE, SIZE, INTR, events=(WorldEvent.FOG,))
    assert np.array_equal(fog_from_start[0], day[0]) and not np.array_equal(fog_from_start[1], day[1])
    with pytest.raises(ValueError, match="one per chunk"):
        render_path(world, controls, 2, SIZE, SIZE, INTR, events=(WorldEvent.FOG,))


def test_event_schedules_hold_a_prompt_per_chunk_that_names_that_chunks_event() -> None:
    rng = np.random.default_rng(0)
    schedules = [event_schedule(rng, 4) for _ in range(400)]
    switches = 0
    for events, prompts in schedules:
        assert len(events) == len(prompts) == 4
        for k, (event, prompt) in enumerate(zip(events, prompts, strict=True)):
            assert (event_of_prompt(prompt) or WorldEvent.DAY) is event
            if k and events[k - 1] is event:
                assert prompts[k - 1] == prompt  # typed once, kept until the next switch
        switches += sum(events[k] is not events[k - 1] for k in range(1, 4))
    day_walks = sum(all(e is WorldEvent.DAY for e in events) for events, _ in schedules)
    assert 0.1 < day_walks / len(schedules) < 0.3
    assert {e for events, _ in schedules for e in events} == set(WorldEvent)
    assert switches > 200  # most walks switch mid-walk, some twice
