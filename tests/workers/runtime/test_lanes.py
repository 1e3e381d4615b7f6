"""A stage's lane alone: its deadlines follow its own answers, and its idle time counts only while
sessions are open."""

from __future__ import annotations

import math

from workers.runtime.lanes import Assignment, CommandKind, Deadlines, Lane
from workers.runtime.messages import Stage

DEADLINES = Deadlines(floor_s=1.0, factor=4.0, first_s=300.0, window=4)


def chunk(sent_t: float, index: int = 0) -> Assignment:
    return Assignment("s", 1, CommandKind.CHUNK, index, sent_t)


def test_a_first_command_gets_the_first_budget_then_its_kinds_recent_answers_decide() -> None:
    lane = Lane(Stage.DIT, 1, alive=True, idle_since=0.0)
    first = chunk(0.0)
    lane.start(first, DEADLINES, 0.0, 0.0, open_=True)
    assert first.deadline_t == 300.0
    assert lane.answered(DEADLINES, 0.5) is first and lane.assignment is None
    second = chunk(1.0, 1)
    lane.start(second, DEADLINES, 1.0, 0.0, open_=True)
    assert second.deadline_t == 1.0 + max(1.0, 4 * 0.5)
    assert math.isinf(Assignment("s", 1, CommandKind.OPEN, None, 0.0).deadline_t)  # not started: no deadline


def test_idle_time_counts_between_answers_while_sessions_are_open() -> None:
    lane = Lane(Stage.DECODE, 1, alive=True, idle_since=0.0)
    lane.start(chunk(2.0), DEADLINES, 2.0, 0.0, open_=False)  # nobody was streaming: not idle time
    lane.answered(DEADLINES, 3.0)
    lane.start(chunk(3.5, 1), DEADLINES, 3.5, 0.0, open_=True)
    lane.answered(DEADLINES, 4.0)
    times = lane.times(5.0, open_=True)
    assert times["idle_s"] == 0.5 + 1.0 and times["idle_intervals"] == [(3.0, 3.5)]
    assert lane.times(5.0, open_=False)["idle_s"] == 0.5
