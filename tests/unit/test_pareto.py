"""The Pareto front of ``train.selection: pareto`` (``skillopt.optimizer.pareto``): what is kept, where a step
starts, what is chosen."""

from __future__ import annotations

from skillopt.core.config import EvaluationSection
from skillopt.optimizer.pareto import Front, Member, dominates

STRICT = EvaluationSection()
PAIRED = EvaluationSection(gate_test="paired", gate_alpha=0.1)


def member(step: int, values: dict[str, float], tokens: float) -> Member:
    rows = [{"id": item, "hard": value, "soft": value} for item, value in values.items()]
    return Member(skill=f"skill {step}\n" + "x" * int(tokens), sha=f"sha{step}", step=step,
                  score=sum(values.values()) / len(values), items=dict(values), rows=rows,
                  objectives={"skill_tokens": tokens, "target_tokens": None, "cost": None})


def test_two_skills_winning_on_different_items_are_both_kept_and_a_dominated_one_is_not():
    front = Front(objectives=[])
    assert front.add(member(1, {"a": 1, "b": 1, "c": 0, "d": 0}, 50))
    assert front.add(member(2, {"a": 0, "b": 1, "c": 1, "d": 1}, 60))  # wins c, d; loses a
    assert [m.step for m in front.members] == [1, 2]
    assert front.best_items(front.members[0]) == ["a", "b"]
    assert front.best_items(front.members[1]) == ["b", "c", "d"]
    # Solves everything the first one does and more: the first one is dominated and leaves the front.
    assert front.add(member(3, {"a": 1, "b": 1, "c": 1, "d": 0}, 70))
    assert [m.step for m in front.members] == [2, 3]
    # Dominated on every item: not admitted.
    assert not front.add(member(4, {"a": 0, "b": 1, "c": 0, "d": 0}, 80))


def test_an_objective_keeps_a_shorter_skill_that_wins_no_item():
    front = Front(objectives=["skill_tokens"])
    front.add(member(1, {"a": 1, "b": 0}, 90))
    front.add(member(2, {"a": 1, "b": 1}, 120))
    assert [m.step for m in front.members] == [1, 2]
    assert front.best_objectives(front.members[0]) == ["skill_tokens"]
    longer, shorter = front.members[1], front.members[0]
    assert dominates(longer, shorter, []) and not dominates(longer, shorter, ["skill_tokens"])


def test_the_final_choice_is_the_highest_score_and_ties_within_the_gate_noise_go_to_the_shorter_skill():
    front = Front(objectives=["skill_tokens"])
    front.add(member(1, {"a": 1, "b": 1, "c": 0, "d": 1}, 40))   # 0.75, short
    front.add(member(2, {"a": 1, "b": 1, "c": 1, "d": 0}, 200))  # 0.75, long: an exact tie
    assert front.choose(STRICT, seed=0).step == 1
    front.add(member(3, {"a": 1, "b": 1, "c": 1, "d": 1}, 300))  # 1.0
    assert front.choose(STRICT, seed=0).step == 3  # the strict gate tells 1.0 from 0.75
    # One flip on four items is noise for the paired gate: the shortest of the tied skills wins.
    assert front.choose(PAIRED, seed=0).step == 1


def test_a_step_starts_from_any_member_with_a_seeded_draw():
    front = Front(objectives=[])
    front.add(member(1, {"a": 1, "b": 0}, 10))
    front.add(member(2, {"a": 0, "b": 1}, 10))
    parents = {front.parent(seed).step for seed in range(40)}
    assert parents == {1, 2}
    assert front.parent(7).step == front.parent(7).step
