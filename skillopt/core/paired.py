"""Paired comparison of two skills scored on the same items: the difference, its interval, a p-value, flips.

Skill B is compared with skill A item by item (``difference = B - A`` of the per-item gate value, hard,
soft or mixed as ``evaluation.gate_metric`` says). It uses the gate's statistics (``skillopt.core.gate``):

- flips: the items B gets better (``improved``) or worse (``regressed``) than A;
- the p-value of "the skills score the same": the exact sign test on flips when every value is 0 or 1,
  else the seeded paired bootstrap of the mean difference; both two-sided (twice the smaller one-sided
  tail, at most 1), with the one-sided "B is better" p-value the gate would use beside it;
- a 95% interval of the mean difference: the percentile interval of a seeded paired bootstrap
  (``BOOTSTRAP_RESAMPLES`` resamples), so the same rows always give the same interval.

Items that are error rows under either skill are left out on both sides (``skillopt.core.error_rows``).
A skill compared with itself has difference 0, interval [0, 0], no flips and p = 1.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from skillopt.core.error_rows import paired_answered
from skillopt.core.gate import (
    BOOTSTRAP_RESAMPLES,
    GateMetric,
    ItemFlips,
    PairedMethod,
    Scores,
    gate_score,
    item_flips,
    paired_bootstrap_p_value,
    score_rows,
    sign_test_p_value,
)
from skillopt.core.records import ItemResult

#: The interval's coverage.
CONFIDENCE = 0.95


class ItemCost(BaseModel):
    """Mean target tokens and cost per item of one skill's rollouts; ``usd`` None = not priced."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: float
    completion_tokens: float
    tokens: float
    usd: float | None
    calls: float
    #: How many rows had usage to measure (the others are not in the means).
    measured: int = 0


class SideSummary(BaseModel):
    """One skill of a comparison: where it came from, its scores and its cost per item."""

    label: str
    origin: str
    sha: str
    skill_tokens: int
    scores: Scores
    gate: float
    per_item: ItemCost


class PairedComparison(BaseModel):
    """Everything ``compare.json`` records about skill B against skill A."""

    benchmark: str
    split: str
    metric: GateMetric
    n: int
    a: SideSummary
    b: SideSummary
    difference: float
    ci_low: float
    ci_high: float
    confidence: float = CONFIDENCE
    method: PairedMethod
    p_value: float
    p_b_better: float
    flips: ItemFlips
    excluded: list[str] = []
    #: Per-item values (``{id: [a, b]}``), in id order.
    items: dict[str, list[float]] = {}

    def verdict(self, alpha: float = 0.05) -> str:
        """One sentence a person reads: which skill is better, or that the data cannot tell."""
        if self.p_value > alpha or self.difference == 0:
            return f"no significant difference (p={self.p_value:.3f} > {alpha:g})" if self.p_value > alpha \
                else "no difference"
        better = "B" if self.difference > 0 else "A"
        return f"{better} is better (p={self.p_value:.3f} <= {alpha:g})"

    def lines(self) -> list[str]:
        """What the CLI prints."""
        sign = "+" if self.difference >= 0 else ""
        return [
            f"A {self.a.label}: {self.metric} {self.a.gate:.3f}  (n={self.n}, {_cost_text(self.a.per_item)}, "
            f"skill {self.a.skill_tokens} tokens)",
            f"B {self.b.label}: {self.metric} {self.b.gate:.3f}  (n={self.n}, {_cost_text(self.b.per_item)}, "
            f"skill {self.b.skill_tokens} tokens)",
            f"difference B - A: {sign}{self.difference:.3f}  95% interval [{self.ci_low:+.3f}, "
            f"{self.ci_high:+.3f}]",
            f"{self.method} test: p = {self.p_value:.4f} (two-sided); one-sided p for B better = "
            f"{self.p_b_better:.4f}",
            f"flips: {len(self.flips.improved)} items better with B, {len(self.flips.regressed)} worse, "
            f"{self.flips.unchanged} unchanged" + (f"; {len(self.excluded)} error items left out"
                                                   if self.excluded else ""),
            self.verdict(),
        ]


def _cost_text(cost: ItemCost) -> str:
    usd = f"${cost.usd:.5f}" if cost.usd is not None else "cost unknown"
    return f"{cost.tokens:.0f} tokens/item, {usd}/item"


def item_values(rows: Sequence[ItemResult], metric: GateMetric, mixed_weight: float) -> dict[str, float]:
    """Per-item gate values keyed by id."""
    return {row.id: gate_score(row.hard, row.soft, metric, mixed_weight) for row in rows}


def two_sided_p(a_values: Mapping[str, float], b_values: Mapping[str, float], *,
                seed: int = 0) -> tuple[PairedMethod, float, float]:
    """``(method, two-sided p, one-sided p that B is better)`` of the paired values, by the gate's tests."""
    flips = item_flips(b_values, a_values)
    values = [*a_values.values(), *b_values.values()]
    if all(value in (0.0, 1.0) for value in values):
        better = sign_test_p_value(len(flips.improved), len(flips.regressed))
        worse = sign_test_p_value(len(flips.regressed), len(flips.improved))
        return "sign", min(1.0, 2 * min(better, worse)), better
    ids = sorted(a_values)
    differences = [b_values[item] - a_values[item] for item in ids]
    better = paired_bootstrap_p_value(differences, seed=seed)
    worse = paired_bootstrap_p_value([-d for d in differences], seed=seed)
    return "bootstrap", min(1.0, 2 * min(better, worse)), better


def bootstrap_interval(differences: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
                       confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``differences`` (seeded, so deterministic)."""
    if not differences:
        raise ValueError("a paired interval needs at least one item")
    if all(d == differences[0] for d in differences):
        return float(differences[0]), float(differences[0])
    rng = random.Random(seed)
    n = len(differences)
    means = sorted(math.fsum(rng.choices(differences, k=n)) / n for _ in range(resamples))
    tail = (1.0 - confidence) / 2
    low = means[max(0, math.floor(tail * resamples))]
    high = means[min(resamples - 1, math.ceil((1.0 - tail) * resamples) - 1)]
    return low, high


def per_item_cost(rows: Sequence[ItemResult]) -> ItemCost:
    """Mean target tokens, calls and USD per item from the rows' ``usage`` (``skillopt.run.item_usage``); rows
    without usage (rolled out before it was recorded, exec targets) are left out and counted apart."""
    measured = [row.usage for row in rows if row.usage]
    n = max(1, len(measured))
    prompt = math.fsum(float(u.get("prompt_tokens") or 0) for u in measured)
    completion = math.fsum(float(u.get("completion_tokens") or 0) for u in measured)
    costs = [u.get("usd") for u in measured]
    unknown = not measured or any(c is None for c in costs)
    usd = None if unknown else math.fsum(float(c or 0.0) for c in costs) / n
    return ItemCost(prompt_tokens=prompt / n, completion_tokens=completion / n,
                    tokens=(prompt + completion) / n, usd=usd,
                    calls=math.fsum(float(u.get("calls") or 0) for u in measured) / n, measured=len(measured))


def compare_rows(a_rows: Sequence[ItemResult], b_rows: Sequence[ItemResult], *, benchmark: str, split: str,
                 a: dict[str, Any], b: dict[str, Any], metric: GateMetric = "hard", mixed_weight: float = 0.5,
                 seed: int = 0) -> PairedComparison:
    """The paired comparison of two evaluations of the same items. ``a`` and ``b`` carry each side's
    ``label``, ``origin``, ``sha``, ``skill_tokens`` and ``per_item`` (an ``ItemCost``)."""
    (a_kept, b_kept), excluded = paired_answered(list(a_rows), list(b_rows))
    if not a_kept:
        raise ValueError(f"no item to compare on: all {len(a_rows)} items are error rows under a skill")
    a_values = item_values(a_kept, metric, mixed_weight)
    b_values = item_values(b_kept, metric, mixed_weight)
    flips = item_flips(b_values, a_values)
    method, p_value, p_better = two_sided_p(a_values, b_values, seed=seed)
    ids = sorted(a_values)
    differences = [b_values[item] - a_values[item] for item in ids]
    low, high = bootstrap_interval(differences, seed=seed)
    a_scores, b_scores = score_rows(a_kept), score_rows(b_kept)
    a_gate = gate_score(a_scores.hard, a_scores.soft, metric, mixed_weight)
    b_gate = gate_score(b_scores.hard, b_scores.soft, metric, mixed_weight)
    return PairedComparison(
        benchmark=benchmark, split=split, metric=metric, n=len(ids),
        a=SideSummary(scores=a_scores, gate=a_gate, **a), b=SideSummary(scores=b_scores, gate=b_gate, **b),
        difference=math.fsum(differences) / len(ids), ci_low=low, ci_high=high, method=method,
        p_value=p_value, p_b_better=p_better, flips=flips, excluded=excluded,
        items={item: [a_values[item], b_values[item]] for item in ids},
    )
