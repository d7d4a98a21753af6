"""A stage's optimizer calls start ahead of their task runs (``tasks/ahead.calls_first``), and each task takes
the reply made ahead as its own call: every request reaches the model once and the ledger holds it once, as
a call, not a cache hit.

The optimizer is the demo world behind the loopback OpenAI-compatible fake (a reply store, so the run works
ahead of its tasks, as ``skillopt train`` does).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, role_overrides

pytestmark = pytest.mark.slow


def _reflect_in_a_flow(world: DemoWorldServer, name: str) -> dict:
    from prefect import flow

    from skillopt.assembly import RunSpec
    from skillopt.config import load_config
    from skillopt.flows.stages import reflect
    from skillopt.tasks.rollout import evaluate
    from skillopt.tasks.run import started_run

    loaded = load_config("demo", overrides=[*role_overrides(world.server.openai_base_url),
                                            "benchmark.val_size=6", "gradient.minibatch_size=2",
                                            "model.retry.base=0.01", "model.retry.cap=0.02"],
                         env=dict(os.environ))
    spec = RunSpec.create(loaded, run_name=name)

    @flow(name="reflect-with-calls-first")
    def reflect_once() -> dict:
        with started_run(spec, loaded=loaded) as run:
            assert run.early is not None, "the run works ahead of its tasks"
            skill = run.starting_skill()
            rows = evaluate(run, skill, "val").rows
            failures, successes = reflect(run, skill, rows, seed=1, budget=3, buffer="", meta_skill="")
            records = run.clients.ledger.records()
        return {"patches": len(failures) + len(successes), "analyst_records": [r for r in records
                                                                               if r.stage == "analyst"]}

    return reflect_once()


def _analyst_requests(world: DemoWorldServer) -> list[str]:
    return [body for body in world.answered if "## Edit budget" in json.dumps(json.loads(body)["messages"])]


def test_a_stages_calls_made_ahead_of_its_tasks_are_made_once(prefect_settings, in_tmp, monkeypatch):
    from skillopt.tasks import ahead

    made_ahead = []
    original = ahead._ahead_quietly
    monkeypatch.setattr(ahead, "_ahead_quietly",
                        lambda fn, args, kwargs: (made_ahead.append(fn.__name__), original(fn, args, kwargs)))
    world = DemoWorldServer()
    with world.server:
        seen = _reflect_in_a_flow(world, "calls-first")
    analysts = _analyst_requests(world)
    assert seen["patches"] >= 2 and made_ahead == ["reflect_minibatch"] * seen["patches"]
    assert len(analysts) == seen["patches"] == len(set(analysts)), \
        "each analyst request reached the model once"
    records = seen["analyst_records"]
    assert len(records) == len(analysts) and not any(r.cache_hit for r in records), \
        "the ledger holds each call once, as a call"
