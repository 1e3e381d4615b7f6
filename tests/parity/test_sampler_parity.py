"""Our few-step sampler against the released sampling rule, as FastVideo ships it.

The reference is FastVideo's `FlowUniPCMultistepScheduler` (set up as LingBot World 2's generation
stage sets it: 1000 steps, shift 10, timesteps at indices 0/250/500/750), its `add_noise` for
re-noising, and the stage's own x0 conversion (`_convert_flow_pred_to_x0`, compiled from the
shipped pipeline file). One chunk is sampled on both sides with a shared velocity function and a
shared generator seed, in the stage's loop order: velocity, x0, then fresh noise re-noised to the
next timestep.

Self-Forcing distillations (Matrix-Game 2.0) sample on another table: FastVideo's
`SelfForcingFlowMatchScheduler` (shift 5, σ from 1 to 0 with the last row dropped: `sigma_min` 0,
`extra_one_step`), steps written as t in 1000 warped to rows 1000 − t, x0 through its
`pred_noise_to_pred_video` and re-noising through its `add_noise`, in its DMD stage's loop order.

The released presets take `SigmaRule.BY_TIMESTEP` and agree with it at float32 rounding. The
embedded world keeps `TABLE_ROW`, the rule it was trained with; that it differs (1.75e-3 on one
chunk's x0) is shown here too, so the departure is measured, not assumed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.parity.compare import F32_REL_BOUND, assert_agrees, measure
from tests.parity.references import fastvideo_method, fastvideo_module
from workers.models.presets import GRIDWORLD, LINGBOT_1_3B, LINGBOT_14B, ModelPreset, ScheduleKind, SigmaRule
from workers.models.sampler import FewStepSampler, FlowSchedule
from workers.stages.denoise import make_sampler

pytestmark = pytest.mark.parity

SEED = 1234
CHUNK_SHAPE = (16, 4, 6, 8)  # latent channels, frames, height, width


class ReleasedSampler:
    """The released stage's scheduler, x0 conversion and add_noise, called as its chunk loop does."""

    def __init__(self, preset: ModelPreset) -> None:
        schedulers = fastvideo_module("models.schedulers.scheduling_flow_unipc_multistep")
        # As the pipeline builds it and as its stage sets it before sampling.
        self.scheduler = schedulers.FlowUniPCMultistepScheduler(shift=1.0, use_dynamic_shifting=False)
        self.scheduler.set_timesteps(preset.num_train_timesteps, shift=preset.sample_shift)
        self.timesteps = self.scheduler.timesteps[list(preset.timestep_indices)]
        self._to_x0 = fastvideo_method(
            "pipelines/basic/lingbotworld2/causal_fast_pipeline.py",
            "LingBotWorld2CausalFastGenerationStage",
            "_convert_flow_pred_to_x0",
            {"torch": torch},
        )

    def x0(self, flow_pred: torch.Tensor, x_t: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._to_x0(self, flow_pred, x_t, timestep)
        return out

    def sample(self, noise: torch.Tensor, velocity: Any, generator: torch.Generator) -> torch.Tensor:
        current, x0 = noise, noise
        for i, timestep in enumerate(self.timesteps):
            flow = velocity(current, timestep.reshape(1))
            x0 = self.x0(flow, current, timestep)
            if i < len(self.timesteps) - 1:
                fresh = torch.randn(x0.shape, generator=generator, dtype=x0.dtype)
                current = self.scheduler.add_noise(x0, fresh, self.timesteps[i + 1].reshape(1))
        return x0


def velocity(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A smooth stand-in for the model, the same on both sides, depending on x_t and t."""
    return torch.tanh(0.7 * x_t) - x_t * (t.float() / 1000) + 0.1


def _sigma_probe(sampler: FewStepSampler, step: int) -> tuple[float, float]:
    """The σ our sampler uses at `step` for x0 and for re-noising into it, read off its outputs."""
    ones, zeros = torch.ones(1), torch.zeros(1)
    x0_sigma = -sampler.predict_x0(zeros, ones, step).item()  # x0 = x_t − σ·v with x_t = 0, v = 1
    renoise_sigma = sampler.renoise(zeros, ones, step).item()  # (1 − σ)·0 + σ·1
    return x0_sigma, renoise_sigma


@pytest.mark.parametrize("preset", [LINGBOT_14B, LINGBOT_1_3B], ids=lambda p: p.name)
def test_timesteps_and_sigmas_per_step(preset: ModelPreset) -> None:
    released = ReleasedSampler(preset)
    ours = make_sampler(preset)
    assert preset.sigma_rule is SigmaRule.BY_TIMESTEP
    assert ours.schedule.timesteps.tolist() == released.timesteps.tolist()
    for step, timestep in enumerate(released.timesteps):
        x0_sigma, renoise_sigma = _sigma_probe(ours, step)
        # The released x0 for x_t = 0, v = 1 is −σ; its add_noise of (0, 1) is σ.
        released_x0 = -released.x0(torch.ones(1), torch.zeros(1), timestep).item()
        released_renoise = released.scheduler.add_noise(torch.zeros(1), torch.ones(1), timestep.reshape(1)).item()
        print(
            f"parity sampler {preset.name} step {step} t {int(timestep)}: x0 σ {x0_sigma:.6f} / {released_x0:.6f}, "
            f"re-noise σ {renoise_sigma:.6f} / {released_renoise:.6f} (ours / released)"
        )
        assert x0_sigma == pytest.approx(released_x0, rel=F32_REL_BOUND, abs=0)
        if step > 0:  # the first step's input is pure noise, never re-noised into
            assert renoise_sigma == pytest.approx(released_renoise, rel=F32_REL_BOUND, abs=0)


def test_one_chunk_x0_with_a_shared_velocity_and_noise() -> None:
    noise = torch.randn(CHUNK_SHAPE, generator=torch.Generator().manual_seed(SEED - 1))
    reference = ReleasedSampler(LINGBOT_14B).sample(noise, velocity, torch.Generator().manual_seed(SEED))
    ours = make_sampler(LINGBOT_14B).sample(noise, velocity, torch.Generator().manual_seed(SEED))
    assert_agrees("sampler one chunk x0, released rule", ours, reference)


def test_the_embedded_worlds_training_rule_differs_from_the_release() -> None:
    assert GRIDWORLD.sigma_rule is SigmaRule.TABLE_ROW
    noise = torch.randn(CHUNK_SHAPE, generator=torch.Generator().manual_seed(SEED - 1))
    reference = ReleasedSampler(GRIDWORLD).sample(noise, velocity, torch.Generator().manual_seed(SEED))
    ours = make_sampler(GRIDWORLD).sample(noise, velocity, torch.Generator().manual_seed(SEED))
    result = measure("sampler one chunk x0, table-row rule (gridworld)", ours, reference)
    print(result)
    assert result.rel > 10 * F32_REL_BOUND


class ReleasedSelfForcingSampler:
    """The Self-Forcing DMD stage's scheduler, warped steps, x0 conversion and add_noise."""

    def __init__(self, steps: tuple[int, ...], shift: float) -> None:
        schedulers = fastvideo_module("models.schedulers.scheduling_self_forcing_flow_match")
        self.scheduler = schedulers.SelfForcingFlowMatchScheduler(
            num_inference_steps=1000, shift=shift, sigma_min=0.0, extra_one_step=True
        )
        warped = torch.cat((self.scheduler.timesteps, torch.tensor([0.0])))
        self.timesteps = warped[1000 - torch.tensor(steps)]
        self._to_x0 = fastvideo_module("models.utils").pred_noise_to_pred_video

    def sample(self, noise: torch.Tensor, velocity: Any, generator: torch.Generator) -> torch.Tensor:
        """noise [1, C, F, H, W]; the stage works on frames as the batch, [F, C, H, W]."""
        frames = noise[0].transpose(0, 1)
        current, x0 = frames, frames
        for i, t in enumerate(self.timesteps):
            flow = velocity(current.transpose(0, 1)[None], t.reshape(1))[0].transpose(0, 1)
            x0 = self._to_x0(flow, current, t.repeat(frames.shape[0]), self.scheduler)
            if i < len(self.timesteps) - 1:
                # Drawn in our layout so both sides use the same numbers for the same elements.
                fresh = torch.randn(noise.shape, generator=generator, dtype=x0.dtype)[0].transpose(0, 1)
                current = self.scheduler.add_noise(x0, fresh, self.timesteps[i + 1].reshape(1))
        return x0.transpose(0, 1)[None]


@pytest.mark.parametrize("steps", [(1000, 666, 333), (1000, 750, 500, 250)], ids=["3 steps", "4 steps"])
def test_self_forcing_schedule_and_one_chunk(steps: tuple[int, ...]) -> None:
    released = ReleasedSelfForcingSampler(steps, shift=5.0)
    table = FlowSchedule.table(ScheduleKind.SELF_FORCING, 1000, 5.0)
    ours = FewStepSampler(table.subset(tuple(1000 - t for t in steps), SigmaRule.TABLE_ROW))
    print(
        f"parity sampler self-forcing {list(steps)}: timesteps {[round(float(t), 2) for t in ours.schedule.timesteps]}"
    )
    assert torch.equal(ours.schedule.timesteps, released.timesteps)
    noise = torch.randn(1, *CHUNK_SHAPE, generator=torch.Generator().manual_seed(SEED - 1))
    reference = released.sample(noise, velocity, torch.Generator().manual_seed(SEED))
    mine = ours.sample(noise, velocity, torch.Generator().manual_seed(SEED))
    assert_agrees(f"sampler self-forcing {len(steps)} steps one chunk x0", mine, reference)
