"""Matrix-Game's control adapter: our keys and look -> the release's per-frame actions, and the
bounded per-session history that feeds each chunk's action windows."""

from __future__ import annotations

import pytest
import torch

from workers.chunk_geometry import video_frames
from workers.controls import ChunkControl
from workers.models.matrix_game.actions import ChunkActions
from workers.models.matrix_game.config import GTA_DRIVE, TEMPLERUN, UNIVERSAL
from workers.models.matrix_game.controls import MAX_MOUSE, ActionTrack, frame_actions
from workers.models.matrix_game.mapping import GTA_MAPPING, KEY_MOUSE, TEMPLERUN_MAPPING, UNIVERSAL_MAPPING


def _control(*keys: str, dx: float = 0.0, dy: float = 0.0) -> ChunkControl:
    return ChunkControl(keys=frozenset(keys), look_dx_px=dx, look_dy_px=dy)


def test_universal_keys_are_the_four_channels_and_turn_keys_the_mouse() -> None:
    keyboard, mouse = frame_actions(UNIVERSAL_MAPPING, _control("w", "a", "j", "i"), 12)
    assert keyboard.shape == (12, 4) and torch.equal(keyboard[0], torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert mouse is not None and mouse.shape == (12, 2)
    assert mouse[0].tolist() == pytest.approx([KEY_MOUSE, -KEY_MOUSE])  # [pitch up, yaw left]


def test_look_is_spread_over_the_chunk_and_clamped() -> None:
    _, mouse = frame_actions(UNIVERSAL_MAPPING, _control(dx=60.0, dy=-60.0), 12)
    assert mouse is not None
    # 5 px per frame turns as fast as a held key; dragging up (dy < 0) looks up.
    assert mouse[0].tolist() == pytest.approx([KEY_MOUSE, KEY_MOUSE])
    _, fast = frame_actions(UNIVERSAL_MAPPING, _control("l", dx=10_000.0), 12)
    assert fast is not None and fast[:, 1].max().item() == pytest.approx(MAX_MOUSE)


def test_gta_steers_with_a_and_d() -> None:
    keyboard, mouse = frame_actions(GTA_MAPPING, _control("w", "a"), 4)
    assert keyboard[0].tolist() == [1.0, 0.0]
    assert mouse is not None and mouse[0].tolist() == pytest.approx([0.0, -KEY_MOUSE])


def test_templerun_is_one_hot_with_no_move_when_nothing_is_held() -> None:
    idle, mouse = frame_actions(TEMPLERUN_MAPPING, _control(), 4)
    assert mouse is None and idle[0].tolist() == [1.0, 0, 0, 0, 0, 0, 0]
    both, _ = frame_actions(TEMPLERUN_MAPPING, _control("s", "w"), 4)
    assert both[0].tolist() == [0, 1.0, 0, 0, 0, 0, 0], "jump comes first of the held ones"
    turn, _ = frame_actions(TEMPLERUN_MAPPING, _control("l"), 4)
    assert turn[0].argmax().item() == 4


def test_vocabularies_name_what_steers() -> None:
    assert UNIVERSAL_MAPPING.vocabulary.keys == frozenset("wsadjlik") and UNIVERSAL_MAPPING.vocabulary.look
    assert GTA_MAPPING.vocabulary.keys == frozenset("wsadjl")
    record = TEMPLERUN_MAPPING.vocabulary.record()
    assert record["look"] is False and record["meanings"]["w"] == "jump"


def test_a_mapping_must_fit_the_model() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        ActionTrack(UNIVERSAL, GTA_MAPPING)
    with pytest.raises(ValueError, match="does not fit"):
        ActionTrack(TEMPLERUN, UNIVERSAL_MAPPING)


@pytest.mark.parametrize(
    ("cfg", "mapping"), [(UNIVERSAL, UNIVERSAL_MAPPING), (GTA_DRIVE, GTA_MAPPING), (TEMPLERUN, TEMPLERUN_MAPPING)]
)
def test_bounded_history_gives_the_windows_of_the_whole_session(cfg, mapping) -> None:
    """Each chunk's windows from the trimmed history equal those gathered from every frame so far."""
    track = ActionTrack(cfg, mapping)
    chunk = cfg.chunk_frames
    controls = [_control("w"), _control("a", "j", dx=20.0), _control(), _control("s", "l", dy=-30.0)] * 3
    whole_keyboard, whole_mouse = [], []
    for k, control in enumerate(controls):
        got = track.next_inputs(control, chunk)
        keyboard, mouse = frame_actions(mapping, control, video_frames(chunk, k == 0))
        whole_keyboard.append(keyboard)
        if mouse is not None:
            whole_mouse.append(mouse)
        expected = ChunkActions.gather(
            cfg,
            torch.cat(whole_keyboard)[None],
            torch.cat(whole_mouse)[None] if whole_mouse else None,
            k * chunk,
            chunk,
        )
        assert torch.equal(got.keyboard, expected.keyboard), f"chunk {k}"
        assert (got.mouse is None) == (expected.mouse is None)
        if got.mouse is not None and expected.mouse is not None:
            assert torch.equal(got.mouse, expected.mouse), f"chunk {k}"
        # Only what the next chunk's windows reach is kept.
        assert len(track.keyboard) <= cfg.action_window_frames + cfg.frames_per_latent * chunk
