"""The plan that picks savings: the card-size targets, exact defaults, a user's savings kept, clear refusals."""

from __future__ import annotations

import pytest

from workers.models.presets import get_preset
from workers.models.savings import NO_SAVINGS, Quantization, Savings, VAEDtype
from workers.runtime.memory_plan import GIB, machine_capacity
from workers.runtime.placement import PlacementError, get_placement
from workers.runtime.savings_plan import check_savings, choose_savings, fit_savings

ONE_GPU = get_placement("1gpu")


def _gpu_bytes(choice) -> int:
    return next(d.total_bytes for d in choice.plan.devices if d.device != "cpu")


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("name", "target_gib"),
    [
        pytest.param("lingbot-world-v2-1.3b", 20.0, marks=pytest.mark.long),  # one session on a 24 GB card
        ("lingbot-world-v2-14b", 76.0),  # on one 80 GB card
        ("matrix-game-2-universal", 14.0),  # on a 16 GB card (14.9 GiB, less the driver's share)
    ],
)
def test_each_released_model_fits_its_card_with_the_cheapest_savings(name: str, target_gib: float):
    preset = get_preset(name)
    choice = choose_savings(preset, ONE_GPU, 1, machine_capacity(target_gib, 256))
    assert choice.fits and _gpu_bytes(choice) <= target_gib * GIB, choice.plan.describe()
    assert choice.savings != NO_SAVINGS  # none of them fits these cards as released
    assert choice.savings.quantization is Quantization.NONE  # fp8 is the last resort: not needed for these


@pytest.mark.heavy
def test_a_card_that_holds_the_model_as_released_gets_no_saving_and_a_users_savings_are_kept():
    preset = get_preset("matrix-game-2-universal")
    assert choose_savings(preset, ONE_GPU, 1, machine_capacity(80, 256)).savings == NO_SAVINGS
    mine = Savings(vae_dtype=VAEDtype.FLOAT16)
    assert choose_savings(preset, ONE_GPU, 1, machine_capacity(80, 256), floor=mine).savings == mine
    with pytest.raises(PlacementError, match="even with savings"):
        fit_savings(preset, ONE_GPU, 1, machine_capacity(4, 256))


def test_bad_savings_are_refused_naming_what_to_change():
    with pytest.raises(ValueError, match="between 1 and"):
        Savings(vae_bands=0)
    with pytest.raises(ValueError, match="shards the decode"):
        check_savings(Savings(vae_bands=2), get_preset("lingbot-world-v2-14b"), get_placement("4gpu"))


def test_savings_round_trip_and_name_their_differences():
    mine = Savings(Quantization.FP8, True, VAEDtype.BFLOAT16, 4)
    assert Savings.from_record(mine.record()) == mine and Savings.from_record(None) == NO_SAVINGS
    assert mine.names() == ["--vae-bands 4", "--text-encoder-on-cpu", "--vae-dtype bfloat16", "--quantization fp8"]
    assert not mine.exact and Savings(vae_bands=4, text_encoder_on_cpu=True).exact
