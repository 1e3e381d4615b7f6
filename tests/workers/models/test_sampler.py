"""The UniPC flow schedule and the few-step sampler (x0 prediction, seeded re-noising)."""

from __future__ import annotations

import math

import pytest
import torch

from workers.models.presets import ScheduleKind, SigmaRule
from workers.models.sampler import FewStepSampler, FlowSchedule

INDICES = (0, 250, 500, 750)


def _expected(shift: float, n: int = 1000) -> tuple[list[float], list[int]]:
    """The module docstring's formula, by hand: σ = linspace(0.999, 0, n + 1)[:-1], shifted, t = ⌊n·σ'⌋."""
    sigma_max = 1.0 - 1.0 / n
    sigmas = [sigma_max * (1.0 - i / n) for i in range(n)]
    shifted = [shift * s / (1.0 + (shift - 1.0) * s) for s in sigmas]
    return shifted, [math.floor(n * s) for s in shifted]


# ---- schedule ----


def test_unipc_table_shape_and_order() -> None:
    schedule = FlowSchedule.unipc(1000, 10.0)
    assert schedule.timesteps.shape == (1000,) and schedule.sigmas.shape == (1000,)
    assert schedule.timesteps.dtype == torch.int64
    assert schedule.sigmas.dtype == torch.float32
    assert schedule.timesteps[0].item() == 999
    assert (schedule.timesteps[1:] <= schedule.timesteps[:-1]).all()
    assert (schedule.sigmas[1:] < schedule.sigmas[:-1]).all(), "sigmas strictly decrease"
    assert (schedule.sigmas > 0).all() and (schedule.sigmas < 1).all()


def test_unipc_matches_formula_everywhere() -> None:
    sigmas, timesteps = _expected(10.0)
    schedule = FlowSchedule.unipc(1000, 10.0)
    assert torch.allclose(schedule.sigmas, torch.tensor(sigmas, dtype=torch.float32), atol=1e-6, rtol=0)
    assert schedule.timesteps.tolist() == timesteps


def test_default_subset_by_hand() -> None:
    subset = FlowSchedule.unipc(1000, 10.0).subset(INDICES)
    sigmas, timesteps = _expected(10.0)
    assert subset.timesteps.tolist() == [timesteps[i] for i in INDICES] == [999, 967, 908, 768]
    assert subset.sigmas.tolist() == pytest.approx([sigmas[i] for i in INDICES], abs=1e-6)
    # Spot values: σ = 0.999·(1 − i/1000), σ' = 10σ / (1 + 9σ).
    assert subset.sigmas[2].item() == pytest.approx(10 * 0.4995 / (1 + 9 * 0.4995), abs=1e-6)
    assert subset.sigmas[3].item() == pytest.approx(10 * 0.24975 / (1 + 9 * 0.24975), abs=1e-6)


def test_shift_one_is_unshifted() -> None:
    schedule = FlowSchedule.unipc(1000, 1.0)
    plain = torch.linspace(0.999, 0.0, 1001, dtype=torch.float64)[:-1]
    assert torch.allclose(schedule.sigmas.double(), plain, atol=1e-6, rtol=0)
    assert schedule.timesteps.tolist() == [math.floor(1000 * s) for s in _expected(1.0)[0]]
    # A larger shift keeps more steps at high noise.
    assert (FlowSchedule.unipc(1000, 10.0).sigmas[1:] > schedule.sigmas[1:]).all()


def test_other_table_sizes() -> None:
    schedule = FlowSchedule.unipc(100, 5.0)
    sigmas, timesteps = _expected(5.0, n=100)
    assert schedule.timesteps.tolist() == timesteps
    assert schedule.sigmas.tolist() == pytest.approx(sigmas, abs=1e-6)


@pytest.mark.parametrize("shift", [0.0, -1.0])
def test_non_positive_shift_is_rejected(shift: float) -> None:
    with pytest.raises(ValueError, match="shift"):
        FlowSchedule.unipc(1000, shift)


@pytest.mark.parametrize("indices", [(-1,), (0, 1000), (999, 1000, 5)])
def test_out_of_range_indices_are_rejected(indices: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.999"):
        FlowSchedule.unipc(1000, 10.0).subset(indices)


def test_subset_edges() -> None:
    schedule = FlowSchedule.unipc(1000, 10.0)
    last = schedule.subset((999,))
    assert last.timesteps.tolist() == [schedule.timesteps[-1].item()]
    assert last.sigmas.tolist() == [schedule.sigmas[-1].item()]


def test_by_timestep_rule_looks_sigma_up_as_the_released_scheduler() -> None:
    """Shift 10, indices (0, 250, 500, 750): x0 takes the first row with the step's timestep,
    re-noising the second where several rows share it; the table-row rule takes the row itself."""
    table = FlowSchedule.unipc(1000, 10.0)
    released = table.subset(INDICES, SigmaRule.BY_TIMESTEP)
    row = table.subset(INDICES, SigmaRule.TABLE_ROW)
    assert released.timesteps.tolist() == row.timesteps.tolist() == [999, 967, 908, 768]
    assert released.sigmas[1].item() == pytest.approx(0.967949, abs=1e-6)
    assert released.renoise_sigmas[1:].tolist() == pytest.approx([0.967783, 0.908594, 0.768044], abs=1e-6)
    assert row.sigmas[1:].tolist() == pytest.approx([0.967617, 0.908925, 0.768994], abs=1e-6)
    assert torch.equal(row.renoise_sigmas, row.sigmas)
    for step, t in enumerate(released.timesteps.tolist()):
        rows = (table.timesteps == t).nonzero().flatten().tolist()
        assert released.sigmas[step] == table.sigmas[rows[0]]
        assert released.renoise_sigmas[step] == table.sigmas[rows[1] if len(rows) > 1 else rows[0]]


def test_self_forcing_table_warps_the_released_steps() -> None:
    """σ = linspace(1, 0, 1001)[:-1] shifted by 5, t = 1000·σ' unfloored; steps t ∈ {1000, 666, 333}
    sit at rows 1000 − t: 1000, 5·0.666/(1 + 4·0.666)·1000 = 908.84, 713.98."""
    table = FlowSchedule.table(ScheduleKind.SELF_FORCING, 1000, 5.0)
    assert table.timesteps.dtype == torch.float32 and table.timesteps.shape == (1000,)
    assert table.timesteps.unique().numel() == 1000, "distinct timesteps: a lookup by timestep is the row"
    steps = table.subset((0, 334, 667))
    assert steps.timesteps.tolist() == pytest.approx([1000.0, 908.84, 713.98], abs=0.01)
    assert steps.sigmas.tolist() == pytest.approx([1.0, 5 * 0.666 / (1 + 4 * 0.666), 5 * 0.333 / (1 + 4 * 0.333)])
    assert torch.equal(table.subset((0, 334), SigmaRule.BY_TIMESTEP).sigmas, table.subset((0, 334)).sigmas)
    assert torch.equal(FlowSchedule.table(ScheduleKind.UNIPC, 1000, 10.0).sigmas, FlowSchedule.unipc(1000, 10.0).sigmas)


def test_empty_subset_is_rejected() -> None:
    with pytest.raises(ValueError):
        FlowSchedule.unipc(1000, 10.0).subset(())


# ---- sampler ----


def _sampler() -> FewStepSampler:
    return FewStepSampler(FlowSchedule.unipc(1000, 10.0).subset(INDICES))


class ExactFlow:
    """The exact flow velocity towards a known x0: x_t = (1−σ)·x0 + σ·ε, v = ε − x0 = (x_t − x0)/σ."""

    def __init__(self, sampler: FewStepSampler, x0: torch.Tensor) -> None:
        self.sigma_of = {int(t): float(s) for t, s in zip(sampler.schedule.timesteps, sampler.schedule.sigmas)}
        self.x0 = x0
        self.calls: list[tuple[torch.Tensor, int]] = []

    def __call__(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        assert t.shape == (1,)
        self.calls.append((x_t.clone(), int(t.item())))
        sigma = self.sigma_of[int(t.item())]
        noise = (x_t.double() - (1 - sigma) * self.x0.double()) / sigma
        return (noise - self.x0.double()).to(x_t.dtype)


def test_exact_velocity_recovers_x0() -> None:
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(1, 16, 2, 4, 6, generator=g)
    noise = torch.randn(x0.shape, generator=g)
    sampler = _sampler()
    flow = ExactFlow(sampler, x0)
    out = sampler.sample(noise, flow, torch.Generator().manual_seed(7))
    assert out.shape == x0.shape and out.dtype == x0.dtype
    assert torch.allclose(out, x0, atol=1e-5, rtol=0)
    # One model call per step, at the schedule's timesteps in order.
    assert sampler.num_steps == 4
    assert [t for _, t in flow.calls] == [999, 967, 908, 768]
    # The first input is the chunk noise itself.
    assert torch.equal(flow.calls[0][0], noise)


def test_renoising_draws_from_the_generator_in_order() -> None:
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(1, 4, 1, 2, 2, generator=g)
    noise = torch.randn(x0.shape, generator=g)
    sampler = _sampler()
    flow = ExactFlow(sampler, x0)
    sampler.sample(noise, flow, torch.Generator().manual_seed(11))
    replay = torch.Generator().manual_seed(11)
    for step in range(1, 4):
        fresh = torch.randn(x0.shape, generator=replay)
        sigma = sampler.schedule.sigmas[step]
        expected = (1 - sigma) * x0 + sigma * fresh
        assert torch.allclose(flow.calls[step][0], expected, atol=1e-5, rtol=0), f"step {step}"


def _imperfect(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    # Not a real flow: the result then depends on the re-noising draws.
    return 0.5 * x_t + t.float() / 1000


def test_same_seed_same_result_other_seed_differs() -> None:
    noise = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(3))
    sampler = _sampler()
    a = sampler.sample(noise, _imperfect, torch.Generator().manual_seed(42))
    b = sampler.sample(noise, _imperfect, torch.Generator().manual_seed(42))
    c = sampler.sample(noise, _imperfect, torch.Generator().manual_seed(43))
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_same_seed_exact_flow_is_bitwise_repeatable() -> None:
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(1, 16, 1, 4, 4, generator=g)
    noise = torch.randn(x0.shape, generator=g)
    sampler = _sampler()
    runs = [sampler.sample(noise, ExactFlow(sampler, x0), torch.Generator().manual_seed(9)) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


def test_step_count_follows_the_subset() -> None:
    calls: list[int] = []

    def velocity(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        calls.append(int(t.item()))
        return torch.zeros_like(x_t)

    for indices in [(0,), (0, 500), (0, 250, 500, 750), (0, 100, 200, 300, 400, 500)]:
        calls.clear()
        sampler = FewStepSampler(FlowSchedule.unipc(1000, 10.0).subset(indices))
        assert sampler.num_steps == len(indices)
        noise = torch.ones(1, 2, 1, 2, 2)
        out = sampler.sample(noise, velocity, torch.Generator().manual_seed(0))
        assert len(calls) == len(indices)
        if len(indices) == 1:
            # v = 0: the single step's x0 prediction is x_t itself.
            assert torch.equal(out, noise)


def test_predict_x0_and_renoise_are_inverse() -> None:
    sampler = _sampler()
    g = torch.Generator().manual_seed(2)
    x0, eps = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    for step in range(sampler.num_steps):
        x_t = sampler.renoise(x0, eps, step)
        assert torch.allclose(sampler.predict_x0(x_t, eps - x0, step), x0, atol=1e-5, rtol=0)
