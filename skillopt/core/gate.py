"""The validation gate: does a candidate skill replace the current one?

Both skills are scored on the same selection items. The gate score is ``hard``, ``soft`` or
``mixed = (1 - w) * hard + w * soft`` (``evaluation.gate_metric``, ``evaluation.gate_mixed_weight``).

- ``strict`` test (default): accept only if the candidate's gate score is strictly greater than
  the current score; ties reject.
- ``paired`` test: additionally require a one-sided paired test on the per-item differences to
  reach ``p <= alpha`` — the exact sign test on flips when every per-item value is 0 or 1,
  otherwise a seeded paired bootstrap of the mean difference.

An accepted candidate that also beats the best score is a new best. With the gate off every
candidate is force-accepted, and its scores and new-best status are still recorded. Per-item
flips (improved / regressed ids) are always reported, so a reader can tell a gain from noise.

Means are computed with ``math.fsum`` (correctly rounded), so two row sets with the same true
total give bit-identical scores and a tie is a tie whatever the row order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

GateMetric = Literal["hard", "soft", "mixed"]
GateTest = Literal["strict", "paired"]
GateDecision = Literal["accept_new_best", "accept", "reject", "force_accept"]
PairedMethod = Literal["sign", "bootstrap"]

BOOTSTRAP_RESAMPLES = 2000
_SHOWN_IDS = 10  # how many missing ids an error message lists before summarising


def gate_score(hard: float, soft: float, metric: GateMetric, mixed_weight: float = 0.5) -> float:
    """The gate score of one item or one mean: ``hard``, ``soft`` or ``(1 - w) * hard + w * soft``.

    An unknown metric or a ``mixed_weight`` outside [0, 1] is a ValueError.
    """
    if metric == "hard":
        return hard
    if metric == "soft":
        return soft
    if metric == "mixed":
        if not 0.0 <= mixed_weight <= 1.0:
            raise ValueError(f"evaluation.gate_mixed_weight must be in [0, 1], got {mixed_weight}")
        return (1.0 - mixed_weight) * hard + mixed_weight * soft
    raise ValueError(f"evaluation.gate_metric must be one of hard, soft, mixed; got {metric!r}")


class Scores(BaseModel):
    """Mean hard and soft score over ``n`` rows."""

    model_config = ConfigDict(frozen=True)

    hard: float
    soft: float
    n: int


def score_rows(rows: Iterable[object]) -> Scores:
    """Mean ``hard`` and mean ``soft`` of result rows (``ItemResult`` objects or mappings).

    Empty rows, or a row whose ``hard`` / ``soft`` is missing or not a finite number, is a ValueError.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("cannot score an empty set of rows")
    hard = [_number(row, "hard") for row in rows]
    soft = [_number(row, "soft") for row in rows]
    return Scores(hard=math.fsum(hard) / len(rows), soft=math.fsum(soft) / len(rows), n=len(rows))


class ItemFlips(BaseModel):
    """Per-item comparison of candidate and current gate values, by item id (ids sorted)."""

    model_config = ConfigDict(frozen=True)

    improved: list[str]
    regressed: list[str]
    unchanged: int

    def label(self) -> str:
        """Short form for logs and tables: ``+improved/-regressed``."""
        return f"+{len(self.improved)}/-{len(self.regressed)}"


def item_flips(candidate: Mapping[str, float], current: Mapping[str, float]) -> ItemFlips:
    """Compare per-item gate values keyed by item id; different id sets are a ValueError."""
    _require_same_ids(candidate, current)
    improved = sorted(item for item in candidate if candidate[item] > current[item])
    regressed = sorted(item for item in candidate if candidate[item] < current[item])
    return ItemFlips(
        improved=improved, regressed=regressed, unchanged=len(candidate) - len(improved) - len(regressed)
    )


def sign_test_p_value(improved: int, regressed: int) -> float:
    """Exact one-sided sign test: ``P(X >= improved)`` for ``X ~ Binomial(improved + regressed, 1/2)``.

    Items that did not change carry no information and are left out. No flips at all gives 1.0.
    """
    if improved < 0 or regressed < 0:
        raise ValueError(f"flip counts must be >= 0, got +{improved}/-{regressed}")
    n = improved + regressed
    if n == 0:
        return 1.0
    # Exact integers until the single final (correctly rounded) division. By symmetry
    # sum_{i>=k} C(n, i) = sum_{j<=n-k} C(n, j), so sum whichever side is shorter.
    if improved > n // 2:
        tail = _lower_binomial_sum(n, n - improved)
    else:
        tail = 2**n - _lower_binomial_sum(n, improved - 1)
    return tail / 2**n


def _lower_binomial_sum(n: int, last: int) -> int:
    """``sum(math.comb(n, i) for i in range(last + 1))``, one multiplication per term."""
    total, term = 0, 1
    for i in range(last + 1):
        total += term
        term = term * (n - i) // (i + 1)
    return total


def paired_bootstrap_p_value(
    differences: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES
) -> float:
    """One-sided paired bootstrap: the fraction of resamples (with replacement, ``random.Random(seed)``)
    whose mean of ``candidate - current`` differences is ``<= 0``. Deterministic for a given seed."""
    if not differences:
        raise ValueError("paired bootstrap needs at least one difference")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = random.Random(seed)
    n = len(differences)
    not_better = sum(math.fsum(rng.choices(differences, k=n)) <= 0.0 for _ in range(resamples))
    return not_better / resamples


class GateResult(BaseModel):
    """One gate decision with everything needed to audit it."""

    model_config = ConfigDict(frozen=True)

    decision: GateDecision
    new_best: bool
    candidate: Scores
    current: Scores
    candidate_gate: float
    current_gate: float
    best_gate: float
    metric: GateMetric
    mixed_weight: float
    flips: ItemFlips
    test: GateTest
    method: PairedMethod | None = None
    p_value: float | None = None
    alpha: float
    #: Selection items left out on both sides because they were error rows under some skill (``error_rows``).
    excluded: list[str] = []

    @property
    def accepted(self) -> bool:
        """Whether the candidate becomes the current skill (accept, accept_new_best, force_accept)."""
        return self.decision != "reject"

    def explain(self) -> str:
        """One line a person reads, e.g.
        ``reject: candidate 0.600 <= current 0.600 (ties reject); flips +2/-2``."""
        cand, cur = f"{self.candidate_gate:.3f}", f"{self.current_gate:.3f}"
        test_note = ""
        if self.p_value is not None:
            relation = "<=" if self.p_value <= self.alpha else ">"
            test_note = f"{self.method} test p={self.p_value:.3f} {relation} alpha {self.alpha:.3f}"
        flips = f"flips {self.flips.label()}"

        if self.decision == "force_accept":
            best = (
                f"new best (previous best {self.best_gate:.3f})"
                if self.new_best
                else f"not a new best (best {self.best_gate:.3f})"
            )
            parts = [f"force_accept (gate off): candidate {cand} vs current {cur}, {best}"]
        elif self.candidate_gate <= self.current_gate:
            parts = [f"reject: candidate {cand} <= current {cur} (ties reject)"]
        elif self.decision == "reject":
            parts = [f"reject: candidate {cand} > current {cur} but {test_note}"]
            test_note = ""
        elif self.decision == "accept_new_best":
            parts = [f"accept_new_best: candidate {cand} > current {cur} and best {self.best_gate:.3f}"]
        else:
            parts = [f"accept: candidate {cand} > current {cur}, not above best {self.best_gate:.3f}"]
        if test_note:
            parts.append(test_note)
        parts.append(flips)
        if self.excluded:
            parts.append(f"{len(self.excluded)} error item{'s' if len(self.excluded) != 1 else ''} left out")
        return "; ".join(parts)


def decide(
    candidate_rows: Iterable[object],
    current_rows: Iterable[object],
    *,
    current_score: float,
    best_score: float,
    metric: GateMetric,
    mixed_weight: float = 0.5,
    use_gate: bool = True,
    test: GateTest = "strict",
    alpha: float = 0.1,
    seed: int = 0,
) -> GateResult:
    """Decide whether the candidate skill replaces the current one.

    ``candidate_rows`` and ``current_rows`` are the two skills' results on the same selection items
    (rows with ``id``, ``hard``, ``soft``; ``ItemResult`` objects or mappings). The comparison is
    against ``current_score`` and ``best_score`` as given — the current skill's gate score is
    normally the gate score of ``current_rows``; ``current_rows`` supply the per-item values for
    flips and the paired test.

    Decision: ``reject`` unless the candidate's gate score is strictly greater than
    ``current_score`` (and, with ``test="paired"``, the paired test gives ``p <= alpha``); an
    accepted candidate above ``best_score`` is ``accept_new_best``, otherwise ``accept``. With
    ``use_gate=False`` the decision is always ``force_accept`` and ``new_best`` still tells whether
    it beats ``best_score``; the paired test, if configured, is still computed and recorded.

    Raises ValueError for empty rows, duplicate or mismatched item ids (naming the missing ids),
    an unknown metric or test, or ``alpha`` outside (0, 1].
    """
    if test not in ("strict", "paired"):
        raise ValueError(f"evaluation.gate_test must be strict or paired, got {test!r}")
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"evaluation.gate_alpha must be in (0, 1], got {alpha}")
    candidate_rows, current_rows = list(candidate_rows), list(current_rows)
    candidate, current = score_rows(candidate_rows), score_rows(current_rows)
    candidate_items = _item_gate_values(candidate_rows, metric, mixed_weight, "candidate")
    current_items = _item_gate_values(current_rows, metric, mixed_weight, "current")
    flips = item_flips(candidate_items, current_items)
    candidate_gate = gate_score(candidate.hard, candidate.soft, metric, mixed_weight)

    method: PairedMethod | None = None
    p_value: float | None = None
    if test == "paired":
        values = [*candidate_items.values(), *current_items.values()]
        if all(value in (0.0, 1.0) for value in values):
            method, p_value = "sign", sign_test_p_value(len(flips.improved), len(flips.regressed))
        else:
            ids = sorted(candidate_items)
            differences = [candidate_items[item] - current_items[item] for item in ids]
            method, p_value = "bootstrap", paired_bootstrap_p_value(differences, seed=seed)

    beats_current = candidate_gate > current_score
    new_best = candidate_gate > best_score
    if not use_gate:
        decision: GateDecision = "force_accept"
    elif beats_current and (p_value is None or p_value <= alpha):
        decision = "accept_new_best" if new_best else "accept"
    else:
        decision, new_best = "reject", False

    return GateResult(
        decision=decision,
        new_best=new_best,
        candidate=candidate,
        current=current,
        candidate_gate=candidate_gate,
        current_gate=current_score,
        best_gate=best_score,
        metric=metric,
        mixed_weight=mixed_weight,
        flips=flips,
        test=test,
        method=method,
        p_value=p_value,
        alpha=alpha,
    )


def _item_gate_values(
    rows: Sequence[object], metric: GateMetric, mixed_weight: float, side: str
) -> dict[str, float]:
    values: dict[str, float] = {}
    for row in rows:
        item = _field(row, "id")
        if not isinstance(item, str):
            raise ValueError(f"{side} row has no string 'id' (got {type(item).__name__})")
        if item in values:
            raise ValueError(f"{side} rows contain item id {item!r} more than once")
        values[item] = gate_score(_number(row, "hard"), _number(row, "soft"), metric, mixed_weight)
    return values


def _require_same_ids(candidate: Mapping[str, float], current: Mapping[str, float]) -> None:
    missing_from_candidate = sorted(set(current) - set(candidate))
    missing_from_current = sorted(set(candidate) - set(current))
    if not missing_from_candidate and not missing_from_current:
        return
    problems = []
    if missing_from_candidate:
        problems.append(f"missing from candidate rows: {_show_ids(missing_from_candidate)}")
    if missing_from_current:
        problems.append(f"missing from current rows: {_show_ids(missing_from_current)}")
    raise ValueError("candidate and current were scored on different items; " + "; ".join(problems))


def _show_ids(ids: list[str]) -> str:
    shown = ", ".join(ids[:_SHOWN_IDS])
    return shown if len(ids) <= _SHOWN_IDS else f"{shown} … and {len(ids) - _SHOWN_IDS} more"


def _field(row: object, name: str) -> object:
    if isinstance(row, Mapping):
        return row.get(name)
    return getattr(row, name, None)


def _number(row: object, name: str) -> float:
    value = _field(row, name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        item = _field(row, "id")
        where = f"row {item!r}" if isinstance(item, str) else "a row"
        raise ValueError(f"{where} has no finite numeric {name!r} (got {type(value).__name__})")
    return float(value)
