"""The memory plan at a server's start: the savings asked for, and more (cheapest quality cost
first) where the plan needs them; a placement that cannot hold the model and max_sessions even with
every saving fails here, naming the device, the shortfall and what would fit."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from server.common.settings import Settings
from workers.models.presets import ModelPreset
from workers.models.savings import Savings
from workers.runtime.memory_plan import machine_capacity
from workers.runtime.placement import Placement
from workers.runtime.savings_plan import fit_savings

log = logging.getLogger("worldrtc.server")


@dataclass(frozen=True)
class MemoryFit:
    savings: Savings
    # The smallest a snapshot gets (after the condition encoder's fixed point): over the budget, none
    # can fit and it is refused before any copy; a larger early one is refused once measured.
    snapshot_plan_bytes: int


def fit_memory(settings: Settings, preset: ModelPreset, placement: Placement) -> MemoryFit:
    """Plan `preset` on `placement` for the settings' sessions; PlacementError when nothing fits."""
    capacity = machine_capacity(settings.device_memory_gib, settings.host_memory_gib)
    choice = fit_savings(preset, placement, settings.max_sessions, capacity, settings.kernels, settings.savings)
    if choice.savings != settings.savings:
        log.warning("memory plan: to fit, the server adds savings: %s", choice.savings.describe())
    for device in choice.plan.devices:
        log.info("memory plan: %s", device.summary())
    return MemoryFit(choice.savings, choice.plan.snapshot_steady_bytes)
