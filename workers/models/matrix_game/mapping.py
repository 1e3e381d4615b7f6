"""Matrix-Game's keys per variant: our one wire vocabulary (held keys; `ChunkControl`) -> each
released variant's keyboard channels and per-frame mouse values.

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

Torch-free, so presets (and the command lines that only read them) can name a variant's mapping.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.controls import ControlVocabulary

KEY_MOUSE = 0.1  # the release's camera value per frame


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
