"""The failure and success merge trees of a step are merged side by side: each level's merge
calls of both trees are submitted before the flow waits for any of them, and the result is the same as merging
the trees one after the other."""

from __future__ import annotations

from types import SimpleNamespace

import skillopt.flows.stages as stages
from skillopt.core.records import Patch
from skillopt.skill.document import Edit


class Future:
    def __init__(self, log: list, patch: Patch) -> None:
        self.log, self.patch = log, patch

    def result(self) -> Patch:
        self.log.append(("wait", self.patch.reasoning))
        return self.patch


class MergeTask:
    """Stands in for the bound ``merge_patches`` task: a merge keeps the union of its patches' edits."""

    def __init__(self) -> None:
        self.log: list = []

    def submit(self, run, kind, skill, patches, level, meta_skill):  # merge_patches' parameters
        name = f"{kind}-L{level}-" + "+".join(p.reasoning for p in patches)
        self.log.append(("submit", name))
        edits = [e for p in patches for e in p.edits]
        return Future(self.log, Patch(reasoning=name, edits=edits, merge_level=level))


def patches(kind: str, n: int) -> list[Patch]:
    return [
        Patch(reasoning=f"{kind[0]}{i}", edits=[Edit(op="append", target="", content=f"- {kind} rule {i}")])
        for i in range(n)
    ]


def context(task: MergeTask, monkeypatch):
    monkeypatch.setattr(stages, "bound", lambda _run, _task: task)
    no_hints = SimpleNamespace(calls=lambda fn, arguments: None)  # a run without a prefetch layer
    return SimpleNamespace(config=SimpleNamespace(gradient=SimpleNamespace(merge_batch_size=2)),
                           prefetch=no_hints)


def test_both_trees_submit_each_level_before_waiting(monkeypatch):
    task = MergeTask()
    trees = {"failure": patches("failure", 4), "success": patches("success", 2)}
    merged = stages.merge_trees(context(task, monkeypatch), "skill", trees, meta_skill="")
    first_wait = next(i for i, (what, _) in enumerate(task.log) if what == "wait")
    level_one = [name for what, name in task.log[:first_wait] if what == "submit"]
    assert level_one == ["failure-L1-f0+f1", "failure-L1-f2+f3", "success-L1-s0+s1"]
    assert merged["failure"].reasoning == "failure-L2-failure-L1-f0+f1+failure-L1-f2+f3"
    assert merged["success"].reasoning == "success-L1-s0+s1" and merged["success"].merge_level == 1


def test_side_by_side_gives_what_one_tree_at_a_time_gives(monkeypatch):
    trees = {"failure": patches("failure", 5), "success": patches("success", 3)}
    together = stages.merge_trees(context(MergeTask(), monkeypatch), "skill", trees, meta_skill="")
    one_by_one = {kind: stages.merge_trees(context(MergeTask(), monkeypatch), "skill", {kind: ps},
                                           meta_skill="")[kind]
                  for kind, ps in trees.items()}
    assert together == one_by_one

    final = stages.aggregate(context(MergeTask(), monkeypatch), "skill", trees["failure"], trees["success"],
                             meta_skill="")
    assert final.reasoning.startswith("final-L4-") and len(final.edits) == 8  # failure tree: 3 levels
