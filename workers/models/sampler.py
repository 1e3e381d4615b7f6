"""Few-step flow-matching sampling on a 1000-row flow table, as the distilled world models use it.

The schedule is the flow-matching UniPC one: 1000 training steps, sigmas linearly spaced from
0.999 to 0 and shifted by σ' = s·σ / (1 + (s − 1)·σ), timesteps = ⌊1000·σ'⌋. The distilled model
samples only at a few indices of that 1000-step table (default [0, 250, 500, 750]): at each it
predicts x0 = x_t − σ_t·v, then re-noises x0 to the next timestep with fresh noise from the
session's seeded generator; the last step's x0 is the chunk's clean latent. No CFG.

Which σ a step uses is a rule of the preset (`SigmaRule`). The released scheduler, and FastVideo
and TeleFuser after it, look σ up from the step's *integer timestep*: the x0 prediction takes the
first table index with that timestep, and re-noising goes through the scheduler's `add_noise`,
which takes the second index where several share one. Since ⌊1000·σ'⌋ maps several table rows to
one timestep, these differ from the row the step was sampled at (shift 10, t = 967: x0 σ 0.967949,
re-noise σ 0.967783, row 250 σ 0.967617). The embedded world was trained with the row's own σ
for both, and keeps that rule.

Self-Forcing distillations (Matrix-Game 2.0) index another table (`FlowSchedule.self_forcing`):
sigmas linearly spaced from 1 to 0 (the last row dropped), shifted the same way, timesteps
1000·σ' as float32, not floored. Their released steps are written as "t" in 1000, 666, 333 and
warped onto that table at rows 1000 − t: shift 5 gives t = 1000, 908.84, 713.98. Every timestep
of that table is distinct, so a lookup by timestep lands on the row itself: `TABLE_ROW` is the
released rule there.

A stage keeps its sampler's schedule on its own device (`FewStepSampler.to`), so a sampling step
reads its timestep and sigma there and never copies them from the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from workers.models.presets import ScheduleKind, SigmaRule


@dataclass(frozen=True)
class FlowSchedule:
    timesteps: torch.Tensor  # [N] descending: int64 (UniPC) or float32 (Self-Forcing)
    sigmas: torch.Tensor  # [N] float32: σ of each step's x0 prediction
    renoise_sigmas: torch.Tensor  # [N] float32: σ of re-noising into each step (row 0: never re-noised into)

    @staticmethod
    def unipc(num_train_timesteps: int = 1000, shift: float = 10.0) -> FlowSchedule:
        if shift <= 0:
            raise ValueError(f"shift must be positive, got {shift}")
        n = num_train_timesteps
        # Training sigmas run from 1 - 1/n down to 0; the inference table spans that range.
        alphas = np.linspace(1.0, 1.0 / n, n)[::-1].copy()
        train_sigmas = torch.from_numpy(1.0 - alphas).to(torch.float32)
        sigma_max, sigma_min = train_sigmas[0].item(), train_sigmas[-1].item()
        sigmas = np.linspace(sigma_max, sigma_min, n + 1)[:-1]
        sigmas = shift * sigmas / (1.0 + (shift - 1.0) * sigmas)
        timesteps = torch.from_numpy(sigmas * n).to(torch.int64)
        table = torch.from_numpy(sigmas).to(torch.float32)
        return FlowSchedule(timesteps=timesteps, sigmas=table, renoise_sigmas=table)

    @staticmethod
    def self_forcing(num_train_timesteps: int = 1000, shift: float = 5.0) -> FlowSchedule:
        if shift <= 0:
            raise ValueError(f"shift must be positive, got {shift}")
        n = num_train_timesteps
        # float32 throughout, as the released scheduler builds it, so the timesteps match to the bit.
        sigmas = torch.linspace(1.0, 0.0, n + 1, dtype=torch.float32)[:-1]
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
        return FlowSchedule(timesteps=sigmas * n, sigmas=sigmas, renoise_sigmas=sigmas)

    @staticmethod
    def table(kind: ScheduleKind, num_train_timesteps: int, shift: float) -> FlowSchedule:
        if kind is ScheduleKind.SELF_FORCING:
            return FlowSchedule.self_forcing(num_train_timesteps, shift)
        return FlowSchedule.unipc(num_train_timesteps, shift)

    def subset(self, indices: tuple[int, ...], rule: SigmaRule = SigmaRule.TABLE_ROW) -> FlowSchedule:
        """The steps at `indices` of this (full) table, with their σ chosen by `rule`."""
        if not indices:
            raise ValueError("timestep indices must not be empty")
        idx = torch.tensor(indices, dtype=torch.long)
        if idx.min() < 0 or idx.max() >= len(self.timesteps):
            raise ValueError(f"timestep indices {indices} outside 0..{len(self.timesteps) - 1}")
        timesteps = self.timesteps[idx]
        if rule is SigmaRule.TABLE_ROW:
            return FlowSchedule(timesteps=timesteps, sigmas=self.sigmas[idx], renoise_sigmas=self.sigmas[idx])
        x0_rows, renoise_rows = [], []
        for t in timesteps.tolist():
            rows = (self.timesteps == t).nonzero().flatten().tolist()
            x0_rows.append(rows[0])
            renoise_rows.append(rows[1] if len(rows) > 1 else rows[0])
        return FlowSchedule(timesteps=timesteps, sigmas=self.sigmas[x0_rows], renoise_sigmas=self.sigmas[renoise_rows])

    def to(self, device: torch.device) -> FlowSchedule:
        return FlowSchedule(
            timesteps=self.timesteps.to(device),
            sigmas=self.sigmas.to(device),
            renoise_sigmas=self.renoise_sigmas.to(device),
        )


VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class FewStepSampler:
    def __init__(self, schedule: FlowSchedule) -> None:
        self.schedule = schedule

    def to(self, device: torch.device) -> FewStepSampler:
        """The same sampler with its schedule resident on `device`."""
        return FewStepSampler(self.schedule.to(device))

    @property
    def num_steps(self) -> int:
        return len(self.schedule.timesteps)

    def sample(self, noise: torch.Tensor, velocity: VelocityFn, generator: torch.Generator) -> torch.Tensor:
        """Denoise one chunk. `velocity(x_t, t)` runs the model; returns the clean latent x0."""
        x_t = noise
        x0 = noise
        for i in range(self.num_steps):
            # A host-side schedule is copied here each step; `to(device)` keeps it resident instead.
            t = self.schedule.timesteps[i].reshape(1).to(noise.device)
            v = velocity(x_t, t)
            x0 = self.predict_x0(x_t, v, i)
            if i + 1 < self.num_steps:
                fresh = torch.randn(x0.shape, generator=generator, dtype=x0.dtype, device=x0.device)
                x_t = self.renoise(x0, fresh, i + 1)
        return x0

    def predict_x0(self, x_t: torch.Tensor, v: torch.Tensor, step: int) -> torch.Tensor:
        sigma = self.schedule.sigmas[step].double()
        return (x_t.double() - sigma * v.double()).to(x_t.dtype)

    def renoise(self, x0: torch.Tensor, noise: torch.Tensor, step: int) -> torch.Tensor:
        """x0 noised to step `step`'s timestep."""
        sigma = self.schedule.renoise_sigmas[step].to(x0.dtype)
        return (1 - sigma) * x0 + sigma * noise
