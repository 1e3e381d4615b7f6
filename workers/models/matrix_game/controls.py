"""Matrix-Game's control adapter: the one wire vocabulary (held keys, mouse look; `ChunkControl`)
turned into the per-video-frame keyboard and mouse actions each released variant was trained on.

The release's action values (Matrix-Game-2 `utils/conditions.py`): keyboard channels are multi-hot
`[forward, back, left, right]` (universal) or `[forward, back]` (GTA), or one-hot
`[no move, jump, slide, turn left, turn right, left side, right side]` (Temple Run); the mouse is
`[pitch, yaw]` per frame, ±0.1 for a camera move (up is +pitch, right is +yaw).

Our keys map onto them as a person walking expects:
- universal: W/S/A/D are the four keyboard channels; I/K pitch and J/L yaw the camera by ±0.1 per
  frame; mouse look adds to both.
- GTA: W/S drive; A/D and J/L steer (yaw ±0.1), as a car has no strafe; look adds yaw.
- Temple Run: W jump, S slide, J/L turn, A/D change side, nothing held is "no move"; one action per
  frame, the first held in that order. No mouse.

Mouse look (pixels summed since the last chunk) is spread evenly over the chunk's video frames at
`LOOK_PER_PX` per pixel per frame, so a 5 px/frame flick turns as fast as a held key; each frame's
pitch and yaw are clamped to ±`MAX_MOUSE` (twice the release's demo value: further out the model
saw little).

`ActionTrack` keeps a session's actions per video frame, only as far back as the next chunk's
action windows reach (12 video frames before its first latent frame), and hands the DiT each
chunk's `ChunkActions`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.chunk_geometry import video_frames
from workers.controls import ChunkControl, ControlVocabulary
from workers.models.matrix_game.actions import ChunkActions
from workers.models.matrix_game.config import MatrixGameConfig

KEY_MOUSE = 0.1  # the release's camera value per frame
LOOK_PER_PX = KEY_MOUSE / 5.0
MAX_MOUSE = 2 * KEY_MOUSE


@dataclass(frozen=True)
class ActionMapping:
    """One variant's keys -> keyboard channels and mouse values."""

    keyboard: tuple[str | None, ...]  # the key per keyboard channel; None: the "nothing held" channel
    one_hot: bool  # one channel per frame (the first held in channel order) instead of multi-hot
    yaw_keys: tuple[tuple[str, float], ...] = ()  # key -> yaw sign
    pitch_keys: tuple[tuple[str, float], ...] = ()  # key -> pitch sign
    mouse: bool = True
    meanings: tuple[tuple[str, str], ...] = ()

    @property
    def vocabulary(self) -> ControlVocabulary:
        keys = {k for k in self.keyboard if k is not None} | {k for k, _ in self.yaw_keys + self.pitch_keys}
        return ControlVocabulary(keys=frozenset(keys), look=self.mouse, meanings=self.meanings)

    def keyboard_row(self, held: frozenset[str]) -> list[float]:
        row = [1.0 if key is not None and key in held else 0.0 for key in self.keyboard]
        if not self.one_hot:
            return row
        chosen = next((i for i, on in enumerate(row) if on), self.keyboard.index(None))
        return [1.0 if i == chosen else 0.0 for i in range(len(row))]

    def key_mouse(self, held: frozenset[str]) -> tuple[float, float]:
        """(pitch, yaw) per frame from held keys."""
        pitch = sum(sign for key, sign in self.pitch_keys if key in held) * KEY_MOUSE
        yaw = sum(sign for key, sign in self.yaw_keys if key in held) * KEY_MOUSE
        return pitch, yaw


UNIVERSAL_MAPPING = ActionMapping(
    keyboard=("w", "s", "a", "d"),
    one_hot=False,
    yaw_keys=(("j", -1.0), ("l", 1.0)),
    pitch_keys=(("i", 1.0), ("k", -1.0)),
    meanings=(
        ("w", "forward"),
        ("s", "back"),
        ("a", "left"),
        ("d", "right"),
        ("j", "turn left"),
        ("l", "turn right"),
        ("i", "look up"),
        ("k", "look down"),
    ),
)
GTA_MAPPING = ActionMapping(
    keyboard=("w", "s"),
    one_hot=False,
    yaw_keys=(("a", -1.0), ("d", 1.0), ("j", -1.0), ("l", 1.0)),
    meanings=(("w", "drive"), ("s", "brake / reverse"), ("a", "steer left"), ("d", "steer right")),
)
TEMPLERUN_MAPPING = ActionMapping(
    keyboard=(None, "w", "s", "j", "l", "a", "d"),
    one_hot=True,
    mouse=False,
    meanings=(
        ("w", "jump"),
        ("s", "slide"),
        ("j", "turn left"),
        ("l", "turn right"),
        ("a", "left side"),
        ("d", "right side"),
    ),
)


def frame_actions(
    mapping: ActionMapping, control: ChunkControl, num_video_frames: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A chunk's control held over its video frames -> keyboard [N, K] and mouse [N, 2] (or None)."""
    keyboard = torch.tensor([mapping.keyboard_row(control.keys)] * num_video_frames, dtype=torch.float32)
    if not mapping.mouse:
        return keyboard, None
    pitch, yaw = mapping.key_mouse(control.keys)
    # Screen y grows downwards: dragging up looks up (+pitch).
    pitch -= control.look_dy_px / num_video_frames * LOOK_PER_PX
    yaw += control.look_dx_px / num_video_frames * LOOK_PER_PX
    mouse = torch.tensor([[pitch, yaw]], dtype=torch.float32).clamp(-MAX_MOUSE, MAX_MOUSE)
    return keyboard, mouse.expand(num_video_frames, 2).clone()


class ActionTrack:
    """A session's actions per video frame and the windows each chunk's latent frames read."""

    def __init__(self, cfg: MatrixGameConfig, mapping: ActionMapping) -> None:
        if len(mapping.keyboard) != cfg.keyboard_dim or mapping.mouse != (cfg.mouse_dim is not None):
            raise ValueError("the action mapping does not fit the model's keyboard and mouse inputs")
        self.cfg, self.mapping = cfg, mapping
        self.start_frame = 0  # latent frames handed out so far: the next chunk's first
        self.offset = 0  # video frame index of the history's first row
        self.keyboard = torch.zeros(0, cfg.keyboard_dim)
        self.mouse: torch.Tensor | None = None if cfg.mouse_dim is None else torch.zeros(0, cfg.mouse_dim)

    def next_chunk(self, control: ChunkControl, num_latent_frames: int) -> ChunkActions:
        """Fold the chunk's control in over its video frames and gather its latent frames' windows."""
        first = self.start_frame == 0
        keyboard, mouse = frame_actions(self.mapping, control, video_frames(num_latent_frames, first))
        self.keyboard = torch.cat([self.keyboard, keyboard])
        if self.mouse is not None and mouse is not None:
            self.mouse = torch.cat([self.mouse, mouse])
        # Windows read from 12 video frames before their latent frame: rows earlier than the first
        # window of this chunk are never read again. Dropped in whole latent frames (4 rows), so the
        # windows of the history match those of the whole session.
        cfg = self.cfg
        keep_from = max(0, cfg.frames_per_latent * self.start_frame - cfg.action_window_frames)
        drop = keep_from - self.offset
        if drop > 0:
            self.keyboard = self.keyboard[drop:]
            self.mouse = None if self.mouse is None else self.mouse[drop:]
            self.offset = keep_from
        start = self.start_frame - self.offset // cfg.frames_per_latent
        actions = ChunkActions.gather(
            cfg,
            self.keyboard[None],
            None if self.mouse is None else self.mouse[None],
            start,
            num_latent_frames,
        )
        self.start_frame += num_latent_frames
        return actions
