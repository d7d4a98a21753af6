"""The run log's line after the baseline counts items and steps in the right number."""

from __future__ import annotations

from skillopt.flows.train import baseline_line


def test_one_item_and_one_step_are_singular():
    assert baseline_line(0.5, 1, 1) == "baseline on the selection split: 0.500 (1 item); 1 step to go"


def test_more_are_plural():
    assert baseline_line(0.25, 10, 4) == "baseline on the selection split: 0.250 (10 items); 4 steps to go"
