"""Multi-objective selection (``train.selection: pareto``): a front of accepted skills instead of one best.

Every skill the gate accepts (and the starting skill) is a *member* with its per-item gate values on the
selection split and its objectives (``evaluation.objectives``, each smaller-is-better): ``skill_tokens``
(the skill's length, paid on every call), ``target_tokens`` and ``cost`` (the target's per item). The front
keeps the members that

- are best (highest value, ties included) on at least one selection item, or best on some objective, and
- are not dominated: no other member is at least as good on every item and every objective and better on one.

A later step starts from any member: the parent of each step is drawn (seeded by ``train.seed`` and the step)
with weight the number of items the member is best on, plus one, so a member that alone solves some items is
tried again. The final choice follows one stated rule: the highest selection score; members whose score the
gate could not tell from it (``gate_tie``: equal scores with the strict gate, a paired test that is not
significant with the paired one) tie, and a tie goes to the shortest skill, then the earliest step.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pydantic import BaseModel

from skillopt.core.config import EvaluationSection, Objective
from skillopt.core.gate import decide
from skillopt.core.records import ItemResult
from skillopt.skill.document import skill_hash

#: The front's file in the run directory.
FRONT_FILE = "front.json"


class Member(BaseModel):
    """One accepted skill on the front."""

    skill: str
    sha: str
    step: int
    score: float
    #: Per-item gate values on the selection split, by item id.
    items: dict[str, float]
    #: Per-item hard and soft scores (for the gate's tie test).
    rows: list[dict[str, float | str]]
    objectives: dict[str, float | None]

    def value(self, objective: str) -> float:
        """An objective's value; an unknown one (an unpriced cost) counts as the worst."""
        found = self.objectives.get(objective)
        return math.inf if found is None else found


class Front(BaseModel):
    """The members kept, in the order they were accepted."""

    members: list[Member] = []
    objectives: list[Objective] = []

    def best_items(self, member: Member) -> list[str]:
        """The items ``member`` has the highest value on (ties included)."""
        return [item for item, value in member.items.items()
                if all(value >= other.items.get(item, -math.inf) for other in self.members)]

    def best_objectives(self, member: Member) -> list[str]:
        return [name for name in self.objectives
                if all(member.value(name) <= other.value(name) for other in self.members)]

    def add(self, member: Member) -> bool:
        """Admit ``member`` (a skill already on the front is not added twice), then drop what no longer
        qualifies. Whether it stays."""
        if any(existing.sha == member.sha for existing in self.members):
            return True
        self.members.append(member)
        self.prune()
        return any(existing.sha == member.sha for existing in self.members)

    def prune(self) -> None:
        kept = [m for m in self.members
                if not any(dominates(other, m, self.objectives) for other in self.members if other is not m)
                and (self.best_items(m) or self.best_objectives(m))]
        self.members = kept

    def parent(self, seed: int) -> Member:
        """The member a step starts from: drawn with weight 1 + the number of items it is best on."""
        weights = [1 + len(self.best_items(member)) for member in self.members]
        return random.Random(seed).choices(self.members, weights=weights, k=1)[0]

    def choose(self, settings: EvaluationSection, seed: int) -> Member:
        """The final choice: the highest score; members the gate cannot tell from it go to the shortest skill
        (then the earliest step)."""
        top = max(self.members, key=lambda m: (m.score, -m.step))
        tied = [m for m in self.members if m is top or gate_tie(top, m, settings, seed)]
        return min(tied, key=lambda m: (m.objectives.get("skill_tokens") or 0, m.step))


def dominates(a: Member, b: Member, objectives: Sequence[str]) -> bool:
    """``a`` is at least as good as ``b`` on every item and objective, and better on at least one."""
    pairs = [(a.items.get(item, -math.inf), value) for item, value in b.items.items()]
    pairs += [(-a.value(name), -b.value(name)) for name in objectives]
    return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)


def gate_tie(top: Member, other: Member, settings: EvaluationSection, seed: int) -> bool:
    """Whether the gate would not accept ``top`` over ``other`` (strict: equal scores; paired: p > alpha)."""
    if top.score > other.score and settings.gate_test == "strict":
        return False
    result = decide(top.rows, other.rows, current_score=other.score, best_score=other.score,
                    metric=settings.gate_metric, mixed_weight=settings.gate_mixed_weight,
                    test=settings.gate_test, alpha=settings.gate_alpha, seed=seed)
    return not result.accepted


def member_of(skill: str, *, step: int, score: float, rows: Sequence[ItemResult], settings: EvaluationSection,
              skill_tokens: int, target_tokens: float | None, cost: float | None) -> Member:
    """A member from its selection rows (``ItemResult``, error rows already left out) and its objectives."""
    from skillopt.core.gate import gate_score

    values: dict[str, float] = {}
    plain: list[dict[str, float | str]] = []
    for row in rows:
        item, hard, soft = row.id, float(row.hard), float(row.soft)
        values[item] = gate_score(hard, soft, settings.gate_metric, settings.gate_mixed_weight)
        plain.append({"id": item, "hard": hard, "soft": soft})
    objectives: dict[str, float | None] = {"skill_tokens": float(skill_tokens),
                                           "target_tokens": target_tokens, "cost": cost}
    return Member(skill=skill, sha=skill_hash(skill), step=step, score=score, items=values, rows=plain,
                  objectives=objectives)
