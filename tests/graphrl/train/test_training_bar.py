"""`graphrl.train.progress.TrainingBar`: a time budget shows seconds of the budget, not a step count
(issue 30: the 90-s recommender demo showed 14,000 steps and a two-hour estimate)."""

from __future__ import annotations

import io
import math

from graphrl.train.progress import TrainingBar


def _run(max_steps, budget, steps, seconds) -> str:
    out = io.StringIO()
    bar = TrainingBar(max_steps, budget, progress=True, file=out)
    for _ in range(steps):
        bar.advance(seconds, loss="0.1")
    bar.close()
    return out.getvalue().split("\r")[-1]


def test_a_time_budget_counts_its_seconds_and_the_steps_beside():
    text = _run(14_000, 90.0, 4, 0.5)
    assert "90 s budget" in text and "2/90 s" in text and "steps=4" in text and "14000" not in text


def test_the_budget_caps_the_bar_and_no_budget_counts_steps():
    assert "2/2 s" in _run(10, 2.0, 5, 1.0)
    text = _run(10, math.inf, 3, 0.1)
    assert "3/10" in text and "budget" not in text
