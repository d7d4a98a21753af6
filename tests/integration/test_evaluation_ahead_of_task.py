"""An evaluation whose calls all started early is the flow's as soon as its replies are in: its
``evaluate_skill`` task (one ``rollout_item`` per item) finishes in the background, and the run waits for it
before it ends. A failed call leaves the evaluation to its task, as before.

The target is the demo world behind the loopback OpenAI-compatible fake, so the run has a reply store and
its rollouts start early (``Run.early``), as in ``skillopt train``.
"""

from __future__ import annotations

import os
import threading

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, role_overrides

pytestmark = pytest.mark.slow


def _evaluate_while_the_task_is_held(world: DemoWorldServer, monkeypatch: pytest.MonkeyPatch, name: str, *,
                                     failing_first: bool = False, hold_s: float = 20.0):
    """``evaluate`` of the selection split in a flow, with the body of every ``evaluate_skill`` task held
    until ``evaluate`` has returned (or ``hold_s`` passed); what the flow saw. ``failing_first``: the world
    fails every call of the split's first item."""
    from prefect import flow

    from skillopt.assembly import RunSpec
    from skillopt.config import load_config
    from skillopt.tasks import rollout
    from skillopt.tasks.run import started_run

    loaded = load_config("demo", overrides=[*role_overrides(world.server.openai_base_url),
                                            "benchmark.val_size=4", "model.retry.base=0.01",
                                            "model.retry.cap=0.02"], env=dict(os.environ))
    spec = RunSpec.create(loaded, run_name=name)
    returned, task_done = threading.Event(), threading.Event()
    original = rollout.run_rollouts

    def held(*args, **kwargs):  # noqa: ANN002, ANN003
        returned.wait(hold_s)
        try:
            return original(*args, **kwargs)
        finally:
            task_done.set()

    monkeypatch.setattr(rollout, "run_rollouts", held)

    @flow(name="evaluate-ahead-of-its-task")
    def evaluate_once() -> dict:
        with started_run(spec, loaded=loaded) as run:
            assert run.early is not None, "the run starts its rollouts early"
            skill = run.starting_skill()
            first = run.items[run.selection_ids("val")[0]]
            if failing_first:
                world.failing = frozenset({first["question"]})
            evaluation = rollout.evaluate(run, skill, "val")
            before_its_task = not task_done.is_set()
            returned.set()
            key = rollout._evaluation_key({"run": run, "skill": skill, "split": "val",
                                           "item_ids": run.selection_ids("val")})
            cache_dir = run.cache_dir
        return {"evaluation": evaluation, "before_its_task": before_its_task, "first": first.id,
                "cached": (cache_dir / key).exists()}

    return evaluate_once()


def test_an_evaluation_whose_calls_started_early_is_the_flows_before_its_task_ends(
        prefect_settings, in_tmp, monkeypatch):
    world = DemoWorldServer()
    with world.server:
        seen = _evaluate_while_the_task_is_held(world, monkeypatch, "ahead-of-task")
    evaluation = seen["evaluation"]
    assert seen["before_its_task"], "evaluate returned while its task was still held"
    assert len(evaluation.rows) == 4 and not any(row.is_error for row in evaluation.rows)
    assert len(world.answered) == 4, "each item was called once: the task took the early calls"
    assert seen["cached"], "the run waited for the task, which cached the evaluation"


def test_a_failed_call_leaves_the_evaluation_to_its_task(prefect_settings, in_tmp, monkeypatch):
    world = DemoWorldServer()
    with world.server:
        seen = _evaluate_while_the_task_is_held(world, monkeypatch, "failed-call", failing_first=True,
                                                hold_s=2.0)
    evaluation = seen["evaluation"]
    assert not seen["before_its_task"], "with a failed call the flow waited for the task"
    assert [row.id for row in evaluation.rows if row.is_error] == [seen["first"]]
    assert not seen["cached"], "an evaluation with an error row is not cached"
