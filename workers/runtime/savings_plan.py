"""Savings against a preset and a placement: whether they can run, and the cheapest that fit a card.

`choose_savings` climbs `workers.models.savings.LADDER` (exact savings first: VAE bands, the context
encoder on the host; then the VAE in bfloat16; fp8 DiT weights last, the order of their measured
quality cost) and stops at the first rung whose memory plan fits; a user's own savings are kept
and only added to. `worldrtc plan --fit-gib` and `worldrtc serve --gpu-memory-gib` print what it chose.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from workers.models.kernels import DEFAULT_KERNELS, KernelConfig
from workers.models.loading import build_on_meta
from workers.models.presets import ModelPreset
from workers.models.savings import LADDER, NO_SAVINGS, Quantization, Savings, VAEDtype
from workers.models.vae import WanVAE
from workers.runtime.memory_plan import MemoryPlan, check_fits, plan_memory
from workers.runtime.messages import Stage
from workers.runtime.placement import Placement


def check_savings(
    savings: Savings, preset: ModelPreset, placement: Placement, kernels: KernelConfig = DEFAULT_KERNELS
) -> None:
    """ValueError, saying what to change, when `savings` cannot run `preset` on `placement`."""
    for stage in Stage:
        for device in placement.stage_devices(stage.value):
            savings.check(device)
    if savings.quantization is Quantization.FP8 and kernels.compile:
        raise ValueError("--quantization fp8 with --compile is not supported: drop one of them")
    if savings.vae_bands > 1:
        if len(placement.stage_devices(Stage.DECODE.value)) > 1:
            raise ValueError(
                f"--vae-bands {savings.vae_bands}: placement {placement.name!r} shards the decode over several "
                "ranks already; bands are for a decode on one device"
            )
        most = vae_max_bands(preset)
        if savings.vae_bands > most:
            raise ValueError(
                f"--vae-bands {savings.vae_bands}: {preset.name}'s {preset.height_px}-row frames allow at most {most}"
            )


@functools.cache
def vae_max_bands(preset: ModelPreset) -> int:
    vae = build_on_meta(lambda: WanVAE(preset.vae))
    assert isinstance(vae, WanVAE)
    return vae.max_bands(preset.height_px)


@dataclass(frozen=True)
class Choice:
    savings: Savings
    plan: MemoryPlan

    @property
    def fits(self) -> bool:
        return self.plan.fits


def _with_floor(rung: Savings, floor: Savings) -> Savings:
    """`rung` with every saving `floor` asks for kept (the larger of each)."""
    return dataclasses.replace(
        rung,
        quantization=floor.quantization if floor.quantization is not Quantization.NONE else rung.quantization,
        text_encoder_on_cpu=rung.text_encoder_on_cpu or floor.text_encoder_on_cpu,
        vae_dtype=floor.vae_dtype if floor.vae_dtype is not VAEDtype.AUTO else rung.vae_dtype,
        vae_bands=max(rung.vae_bands, floor.vae_bands),
    )


def ladder_for(preset: ModelPreset, placement: Placement, floor: Savings = NO_SAVINGS) -> list[Savings]:
    """The rungs that can run here, in order, each at least `floor`."""
    rungs: list[Savings] = []
    sharded_decode = len(placement.stage_devices(Stage.DECODE.value)) > 1
    for rung in LADDER:
        rung = _with_floor(dataclasses.replace(rung, vae_bands=1) if sharded_decode else rung, floor)
        try:
            check_savings(rung, preset, placement)
        except ValueError:
            continue
        if rung not in rungs:
            rungs.append(rung)
    return rungs


def choose_savings(
    preset: ModelPreset,
    placement: Placement,
    max_sessions: int,
    capacity: Callable[[str], int | None],
    kernels: KernelConfig = DEFAULT_KERNELS,
    floor: Savings = NO_SAVINGS,
) -> Choice:
    """The first rung whose plan fits; the last rung's plan (which does not fit) when none does."""
    choice = Choice(floor, plan_memory(preset, placement, max_sessions, capacity, kernels, savings=floor))
    if choice.fits:  # what was asked for fits: the common case costs one plan
        return choice
    for rung in ladder_for(preset, placement, floor):
        choice = Choice(rung, plan_memory(preset, placement, max_sessions, capacity, kernels, savings=rung))
        if choice.fits:
            return choice
    return choice


def fit_savings(
    preset: ModelPreset,
    placement: Placement,
    max_sessions: int,
    capacity: Callable[[str], int | None],
    kernels: KernelConfig = DEFAULT_KERNELS,
    floor: Savings = NO_SAVINGS,
) -> Choice:
    """The cheapest savings (at least `floor`) whose plan fits; PlacementError, naming each short
    device with every saving on and what would fit, when none does."""
    check_savings(floor, preset, placement, kernels)
    choice = choose_savings(preset, placement, max_sessions, capacity, kernels, floor)
    if not choice.fits:
        check_fits(preset, placement, max_sessions, capacity, kernels, savings=choice.savings)
    return choice
