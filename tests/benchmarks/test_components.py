"""benchmarks.components' decode figures: per embedded world, the first frames apart come before the
latent frame is done."""

from __future__ import annotations

from benchmarks.components import first_part_costs


def test_the_first_part_figure_times_both_decodes_of_each_preset() -> None:
    report = first_part_costs(repeats=2)
    assert set(report) == {"gridworld", "gridworld-responsive"}
    for figures in report.values():
        assert set(figures) == {"whole_ms", "apart_first_ms", "apart_whole_ms"}
        assert all(f["count"] == 2 for f in figures.values())
        assert 0 < figures["apart_first_ms"]["p50"] < figures["apart_whole_ms"]["p50"]
