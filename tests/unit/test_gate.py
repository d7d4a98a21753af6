"""The validation gate: metrics, decisions, flips and the paired test."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from skillopt.core.gate import (
    GateResult,
    Scores,
    decide,
    gate_score,
    item_flips,
    paired_bootstrap_p_value,
    score_rows,
    sign_test_p_value,
)


def rows(hard: list[float], soft: list[float] | None = None, prefix: str = "item") -> list[dict]:
    """Result rows ``item00, item01, ...`` with the given hard (and soft, default = hard) scores."""
    soft = hard if soft is None else soft
    return [
        {"id": f"{prefix}{i:02d}", "hard": h, "soft": s}
        for i, (h, s) in enumerate(zip(hard, soft, strict=True))
    ]


def strict(candidate: list[dict], current: list[dict], *, best: float | None = None, **kwargs) -> GateResult:
    current_score = score_rows(current).hard
    return decide(
        candidate,
        current,
        current_score=current_score,
        best_score=current_score if best is None else best,
        metric=kwargs.pop("metric", "hard"),
        **kwargs,
    )


# --- metric and scores ---------------------------------------------------------------------------


def test_gate_score_picks_hard_soft_or_their_weighted_mix() -> None:
    assert gate_score(1.0, 0.4, "hard") == 1.0
    assert gate_score(1.0, 0.4, "soft") == 0.4
    assert gate_score(1.0, 0.4, "mixed") == pytest.approx(0.7)
    assert gate_score(1.0, 0.4, "mixed", mixed_weight=0.25) == pytest.approx(0.85)
    with pytest.raises(ValueError, match="gate_mixed_weight"):
        gate_score(1.0, 0.4, "mixed", mixed_weight=1.5)
    with pytest.raises(ValueError, match="gate_metric"):
        gate_score(1.0, 0.4, "median")  # type: ignore[arg-type]


def test_score_rows_averages_hard_and_soft() -> None:
    assert score_rows(rows([1, 0, 1, 0], [1, 0.5, 1, 0.5])) == Scores(hard=0.5, soft=0.75, n=4)


def test_score_rows_reads_attribute_rows_too() -> None:
    class Row:
        def __init__(self, hard: float, soft: float) -> None:
            self.id, self.hard, self.soft = "a", hard, soft

    assert score_rows([Row(1.0, 0.5)]) == Scores(hard=1.0, soft=0.5, n=1)


def test_score_rows_refuses_empty_or_non_numeric_rows() -> None:
    with pytest.raises(ValueError, match="empty"):
        score_rows([])
    with pytest.raises(ValueError, match="'x'.*soft"):
        score_rows([{"id": "x", "hard": 1.0, "soft": None}])
    with pytest.raises(ValueError, match="hard"):
        score_rows([{"id": "x", "hard": float("nan"), "soft": 0.0}])


# --- strict decisions ----------------------------------------------------------------------------


def test_a_tie_is_rejected() -> None:
    current = rows([1, 1, 1, 0, 0])
    candidate = rows([0, 1, 1, 1, 0])  # same 0.6, one item swapped for another

    result = strict(candidate, current)

    assert result.decision == "reject"
    assert not result.accepted and not result.new_best
    assert result.explain() == "reject: candidate 0.600 <= current 0.600 (ties reject); flips +1/-1"


def test_a_tie_is_rejected_whatever_the_order_of_soft_scores() -> None:
    soft = [0.1, 0.2, 0.3, 0.7, 0.9, 0.35]
    current = rows([0] * 6, soft)
    candidate = rows([0] * 6, list(reversed(soft)))
    current_score = score_rows(current).soft

    result = decide(candidate, current, current_score=current_score, best_score=1.0, metric="soft")

    assert result.candidate_gate == current_score
    assert result.decision == "reject"


def test_a_strict_improvement_that_beats_the_best_is_a_new_best() -> None:
    result = strict(rows([1, 1, 1, 1, 0]), rows([1, 1, 1, 0, 0]))

    assert result.decision == "accept_new_best"
    assert result.accepted and result.new_best
    assert result.candidate_gate == pytest.approx(0.8)
    assert result.explain() == "accept_new_best: candidate 0.800 > current 0.600 and best 0.600; flips +1/-0"


def test_an_improvement_below_the_best_is_a_plain_accept() -> None:
    result = strict(rows([1, 1, 1, 1, 0]), rows([1, 1, 1, 0, 0]), best=0.9)

    assert result.decision == "accept"
    assert result.accepted and not result.new_best
    assert "not above best 0.900" in result.explain()


def test_an_improvement_equal_to_the_best_is_not_a_new_best() -> None:
    assert strict(rows([1, 1, 1, 1, 0]), rows([1, 1, 1, 0, 0]), best=0.8).decision == "accept"


def test_with_the_gate_off_every_candidate_is_force_accepted_and_best_still_tracked() -> None:
    worse = strict(rows([1, 0, 0, 0, 0]), rows([1, 1, 1, 0, 0]), use_gate=False)
    better = strict(rows([1, 1, 1, 1, 1]), rows([1, 1, 1, 0, 0]), use_gate=False)

    assert worse.decision == better.decision == "force_accept"
    assert worse.accepted and better.accepted
    assert (worse.new_best, better.new_best) == (False, True)
    assert worse.candidate_gate == pytest.approx(0.2)
    assert worse.explain().startswith(
        "force_accept (gate off): candidate 0.200 vs current 0.600, not a new best"
    )


def test_mixed_metric_can_accept_a_soft_gain_that_hard_alone_would_reject() -> None:
    current = rows([1, 0, 0, 0], [1.0, 0.2, 0.2, 0.2])
    candidate = rows([1, 0, 0, 0], [1.0, 0.6, 0.6, 0.2])

    hard = decide(candidate, current, current_score=0.25, best_score=0.25, metric="hard")
    current_mixed = gate_score(0.25, 0.4, "mixed", 0.5)
    mixed = decide(
        candidate,
        current,
        current_score=current_mixed,
        best_score=current_mixed,
        metric="mixed",
        mixed_weight=0.5,
    )

    assert hard.decision == "reject"
    assert mixed.decision == "accept_new_best"
    assert mixed.candidate_gate == pytest.approx(0.5 * 0.25 + 0.5 * 0.6)
    assert mixed.flips.improved == ["item01", "item02"]


def test_the_result_round_trips_through_json() -> None:
    result = strict(rows([1, 1, 1, 1, 0]), rows([1, 1, 1, 0, 0]), test="paired")

    assert GateResult.model_validate(json.loads(result.model_dump_json())) == result


# --- flips ---------------------------------------------------------------------------------------


def test_flips_report_improved_and_regressed_ids_sorted() -> None:
    current = [{"id": i, "hard": h, "soft": h} for i, h in [("c", 0), ("a", 0), ("b", 1), ("d", 1), ("e", 0)]]
    candidate = [
        {"id": i, "hard": h, "soft": h} for i, h in [("e", 0), ("d", 0), ("c", 1), ("b", 1), ("a", 1)]
    ]

    flips = strict(candidate, current).flips

    assert flips.improved == ["a", "c"]
    assert flips.regressed == ["d"]
    assert flips.unchanged == 2


def test_rows_scored_on_different_items_are_an_error_naming_the_missing_ids() -> None:
    current = rows([1, 0, 1])
    candidate = [*rows([1, 0]), {"id": "stray", "hard": 1, "soft": 1}]

    with pytest.raises(ValueError) as excinfo:
        strict(candidate, current)

    message = str(excinfo.value)
    assert "missing from candidate rows: item02" in message
    assert "missing from current rows: stray" in message


def test_duplicate_ids_are_an_error() -> None:
    with pytest.raises(ValueError, match="'item00' more than once"):
        strict(rows([1, 0]) + rows([1]), rows([1, 0, 1]))


def test_item_flips_compares_plain_mappings() -> None:
    flips = item_flips({"x": 0.5, "y": 0.2}, {"x": 0.4, "y": 0.2})

    assert (flips.improved, flips.regressed, flips.unchanged) == (["x"], [], 1)


# --- paired test ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("improved", "regressed", "expected"),
    [
        (5, 0, Fraction(1, 32)),
        (3, 1, Fraction(5, 16)),  # (C(4,3) + C(4,4)) / 16
        (0, 0, Fraction(1)),
        (0, 3, Fraction(1)),
        (2, 2, Fraction(11, 16)),  # (6 + 4 + 1) / 16
        (8, 2, Fraction(56, 1024)),  # (45 + 10 + 1) / 1024
        (1, 0, Fraction(1, 2)),
    ],
)
def test_sign_test_p_value_is_the_exact_binomial_tail(
    improved: int, regressed: int, expected: Fraction
) -> None:
    assert sign_test_p_value(improved, regressed) == float(expected)


def test_sign_test_stays_exact_for_large_counts() -> None:
    assert sign_test_p_value(60, 0) == 2.0**-60
    assert sign_test_p_value(0, 5000) == 1.0
    assert sign_test_p_value(500, 500) == pytest.approx(0.5 + 0.5 * 0.02522501817, abs=1e-9)


def test_paired_uses_the_sign_test_on_binary_scores() -> None:
    current = rows([0] * 10 + [1] * 10)
    candidate = rows([1] * 5 + [0] * 5 + [1] * 10)  # five items fixed, none broken

    result = strict(candidate, current, test="paired", alpha=0.1)

    assert result.method == "sign"
    assert result.p_value == 1 / 32
    assert result.decision == "accept_new_best"
    assert "sign test p=0.031 <= alpha 0.100" in result.explain()


def test_paired_rejects_a_small_noisy_gain_that_strict_accepts() -> None:
    current = rows([1, 0, 0, 1, 0, 1, 0, 1, 0, 0])
    candidate = rows([1, 1, 1, 0, 1, 1, 0, 1, 0, 0])  # +3 / -1: 0.6 vs 0.4

    strict_result = strict(candidate, current)
    paired_result = strict(candidate, current, test="paired", alpha=0.1)

    assert strict_result.decision == "accept_new_best"
    assert paired_result.decision == "reject"
    assert paired_result.p_value == 5 / 16
    assert paired_result.explain() == (
        "reject: candidate 0.600 > current 0.400 but sign test p=0.312 > alpha 0.100; flips +3/-1"
    )


def test_paired_still_rejects_a_tie_even_with_a_tiny_p_value() -> None:
    current = rows([1] * 5 + [0] * 5)
    candidate = rows([1] * 5 + [0] * 5)

    result = strict(candidate, current, test="paired", alpha=1.0)

    assert result.p_value == 1.0
    assert result.decision == "reject"


def test_paired_on_soft_scores_uses_a_seeded_deterministic_bootstrap() -> None:
    current = rows([0] * 12, [0.2, 0.3, 0.5, 0.4, 0.1, 0.6, 0.2, 0.3, 0.5, 0.4, 0.1, 0.6])
    candidate = rows([0] * 12, [0.3, 0.2, 0.6, 0.5, 0.1, 0.7, 0.1, 0.4, 0.6, 0.4, 0.2, 0.6])
    current_score = score_rows(current).soft

    def run(seed: int) -> GateResult:
        return decide(
            candidate,
            current,
            current_score=current_score,
            best_score=current_score,
            metric="soft",
            test="paired",
            alpha=0.1,
            seed=seed,
        )

    first, again, other_seed = run(7), run(7), run(8)

    assert first.method == "bootstrap"
    assert first == again
    assert 0.0 <= first.p_value <= 1.0  # type: ignore[operator]
    assert other_seed.p_value != first.p_value
    assert first.flips.improved == ["item00", "item02", "item03", "item05", "item07", "item08", "item10"]
    assert first.flips.regressed == ["item01", "item06"]


def test_bootstrap_p_value_reflects_the_direction_of_the_differences() -> None:
    assert paired_bootstrap_p_value([0.1, 0.2, 0.3, 0.1], seed=1) == 0.0
    assert paired_bootstrap_p_value([-0.1, -0.2, 0.0], seed=1) == 1.0
    assert paired_bootstrap_p_value([0.0, 0.0], seed=1) == 1.0
    mostly_better = paired_bootstrap_p_value([0.1] * 18 + [-0.1] * 2, seed=3)
    assert 0.0 <= mostly_better < 0.01


def test_gate_off_still_records_the_paired_test() -> None:
    result = strict(rows([1, 1, 0]), rows([1, 0, 0]), test="paired", use_gate=False)

    assert result.decision == "force_accept"
    assert result.p_value == 0.5 and result.method == "sign"


def test_bad_test_or_alpha_is_an_error() -> None:
    with pytest.raises(ValueError, match="gate_test"):
        strict(rows([1]), rows([0]), test="bayes")
    with pytest.raises(ValueError, match="gate_alpha"):
        strict(rows([1]), rows([0]), test="paired", alpha=0.0)


def test_sign_test_matches_the_textbook_sum_for_every_small_count() -> None:
    for n in range(25):
        for improved in range(n + 1):
            textbook = Fraction(sum(math.comb(n, i) for i in range(improved, n + 1)), 2**n)
            assert sign_test_p_value(improved, n - improved) == float(textbook)
