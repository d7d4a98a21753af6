"""Edit-budget schedules and the autonomous budget clamp."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skillopt.core.errors import ConfigError
from skillopt.optimizer.schedule import AutonomousBudget, EditBudgetSchedule, clamp_autonomous


def test_cosine_4_to_2_over_40_steps_gives_13_fours_13_threes_14_twos() -> None:
    schedule = EditBudgetSchedule.from_config("cosine", 4, 2, 40)

    assert schedule.summary() == {4: 13, 3: 13, 2: 14}
    assert schedule.budgets() == [4] * 13 + [3] * 13 + [2] * 14


def test_cosine_8_to_2_over_8_steps_matches_the_design_check() -> None:
    schedule = EditBudgetSchedule.from_config("cosine", 8, 2, 8)

    assert schedule.budgets() == [8, 7, 6, 5, 4, 3, 2, 2]


def test_linear_decays_from_max_towards_min_with_half_to_even_rounding() -> None:
    # t = s/4: 4 + (0 - 4) * t = 3, 2, 1, 0
    assert EditBudgetSchedule.from_config("linear", 4, 0, 4).budgets() == [3, 2, 1, 0]
    # 3 + (1 - 3) * s/4 = 2.5, 2.0, 1.5, 1.0 -> round half to even gives 2, 2, 2, 1
    assert EditBudgetSchedule.from_config("linear", 3, 1, 4).budgets() == [2, 2, 2, 1]


def test_a_single_step_run_always_gets_the_full_budget() -> None:
    for kind in ("constant", "linear", "cosine"):
        schedule = EditBudgetSchedule.from_config(kind, 6, 1, 1)
        assert schedule.budget(1) == 6
        assert schedule.budget(5) == 6


def test_steps_past_the_end_keep_the_final_budget() -> None:
    schedule = EditBudgetSchedule.from_config("cosine", 4, 2, 10)

    assert schedule.budget(11) == schedule.budget(100) == schedule.budget(10) == 2


def test_step_numbers_are_one_based() -> None:
    schedule = EditBudgetSchedule.from_config("constant", 4, 2, 10)

    with pytest.raises(ValueError, match="1-based"):
        schedule.budget(0)
    with pytest.raises(TypeError):
        schedule.budget(True)


def test_min_above_max_is_a_config_error_naming_both_keys() -> None:
    with pytest.raises(ConfigError) as excinfo:
        EditBudgetSchedule.from_config("cosine", 2, 3, 10)

    assert "optimizer.min_learning_rate" in str(excinfo.value)
    assert "optimizer.learning_rate" in str(excinfo.value)


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (("cosinus", 4, 2, 10), "optimizer.lr_scheduler"),
        (("cosine", -1, 0, 10), "optimizer.learning_rate"),
        (("cosine", 4, -1, 10), "optimizer.min_learning_rate"),
        (("cosine", 4, 2, 0), "total_steps"),
        (("cosine", True, 0, 10), "optimizer.learning_rate"),
    ],
)
def test_out_of_range_values_are_config_errors_naming_the_key(args: tuple, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        EditBudgetSchedule.from_config(*args)


def test_direct_construction_also_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="min_learning_rate"):
        EditBudgetSchedule(kind="linear", max_budget=1, min_budget=2, total_steps=3)


def test_a_resumed_run_gets_exactly_the_budgets_of_a_fresh_run() -> None:
    fresh = EditBudgetSchedule.from_config("cosine", 4, 2, 40)
    served_before_crash = [fresh.budget(step) for step in range(1, 18)]

    saved = json.dumps(fresh.state_dict())
    resumed = EditBudgetSchedule.from_state(json.loads(saved))
    served_after_resume = [resumed.budget(step) for step in range(18, 41)]

    assert resumed == fresh
    assert served_before_crash + served_after_resume == fresh.budgets()


def test_state_with_unknown_or_missing_keys_is_a_config_error() -> None:
    state = EditBudgetSchedule.from_config("linear", 4, 2, 8).state_dict()

    with pytest.raises(ConfigError, match="unknown schedule key 'extra'"):
        EditBudgetSchedule.from_state({**state, "extra": 1})
    with pytest.raises(ConfigError, match="total_steps"):
        EditBudgetSchedule.from_state({k: v for k, v in state.items() if k != "total_steps"})
    with pytest.raises(ConfigError, match="mapping"):
        EditBudgetSchedule.from_state([1, 2])  # type: ignore[arg-type]


schedules = st.builds(
    lambda kind, low, extra, total: EditBudgetSchedule.from_config(kind, low + extra, low, total),
    st.sampled_from(["constant", "linear", "cosine"]),
    st.integers(0, 20),
    st.integers(0, 20),
    st.integers(1, 300),
)


@given(schedules, st.integers(1, 1000))
def test_every_budget_lies_between_min_and_max(schedule: EditBudgetSchedule, step: int) -> None:
    assert schedule.min_budget <= schedule.budget(step) <= schedule.max_budget


@given(schedules)
def test_budgets_never_increase_and_constant_never_changes(schedule: EditBudgetSchedule) -> None:
    budgets = [schedule.budget(step) for step in range(1, schedule.total_steps + 5)]

    assert all(later <= earlier for earlier, later in zip(budgets, budgets[1:], strict=False))
    if schedule.kind == "constant":
        assert set(budgets) == {schedule.max_budget}


@given(schedules)
def test_state_round_trip_through_json_keeps_every_budget(schedule: EditBudgetSchedule) -> None:
    restored = EditBudgetSchedule.from_state(json.loads(json.dumps(schedule.state_dict())))

    assert restored.budgets() == schedule.budgets()
    assert restored.budget(schedule.total_steps + 3) == schedule.budget(schedule.total_steps + 3)


@pytest.mark.parametrize(
    ("answer", "budget"),
    [(3, 3), (0, 0), (9, 5), (-2, 0), (3.0, 3), ("3", 3), (" 4 ", 4), ("+2", 2)],
)
def test_usable_autonomous_answers_are_clamped_to_what_is_available(answer: object, budget: int) -> None:
    result = clamp_autonomous(answer, available=5)

    assert result.budget == budget
    assert result.fallback is None


@pytest.mark.parametrize(
    "answer",
    [
        None,
        True,
        False,
        3.5,
        float("nan"),
        float("inf"),
        "three",
        "3 edits",
        "3.0",
        "",
        [3],
        {"n": 3},
        "9" * 5000,
    ],
)
def test_unusable_autonomous_answers_fall_back_to_zero_edits_with_a_reason(answer: object) -> None:
    result = clamp_autonomous(answer, available=5)

    assert result == AutonomousBudget(budget=0, fallback=result.fallback)
    assert result.fallback and "applying 0 edits" in result.fallback
    assert len(result.fallback) < 200


def test_autonomous_clamp_records_what_was_requested() -> None:
    assert clamp_autonomous(12, available=4).requested == 12
    assert clamp_autonomous(None, available=4).requested is None


def test_negative_available_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        clamp_autonomous(1, available=-1)
