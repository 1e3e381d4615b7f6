"""Built-in start scenes: PNG files shipped beside this module, offered in the browser."""

from __future__ import annotations

from pathlib import Path

SCENES_DIR = Path(__file__).parent / "scenes"


def scene_names() -> list[str]:
    return sorted(p.stem for p in SCENES_DIR.glob("*.png"))


DEFAULT_SCENE = "main-street"


def default_scene() -> str:
    """The scene a session starts from when it names none."""
    names = scene_names()
    return DEFAULT_SCENE if DEFAULT_SCENE in names else names[0]


def scene_path(name: str) -> Path | None:
    """The file of a scene, or None (names are matched against the shipped list, never joined blindly)."""
    return SCENES_DIR / f"{name}.png" if name in scene_names() else None
