"""Which `ModelFamily` runs a preset: the one place that knows every family.

The interface (`family.py`) imports no family and each family module imports the interface, so the
families depend on it and this registry on them, never the other way round. The runtime, the
server and the command lines ask `family_for(preset)` and never name a family.
"""

from __future__ import annotations

from workers.families.family import ModelFamily
from workers.families.lingbot_world import LINGBOT_WORLD
from workers.families.matrix_game import MATRIX_GAME
from workers.models.configs import Family
from workers.models.presets import ModelPreset

FAMILIES: dict[Family, ModelFamily] = {
    Family.LINGBOT_WORLD: LINGBOT_WORLD,
    Family.MATRIX_GAME: MATRIX_GAME,
}


def family_for(preset: ModelPreset) -> ModelFamily:
    family = FAMILIES.get(preset.family)
    if family is None:
        raise ValueError(f"{preset.name}: no model family {preset.family!r}")
    return family
