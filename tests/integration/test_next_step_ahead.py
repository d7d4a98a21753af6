"""The next step's first rollouts leave as soon as a step has decided, before its records and artifacts are
written, and the next step takes them: each call is made once.

The target is the demo world behind the loopback OpenAI-compatible fake (a reply store, so the run starts its
rollouts early). Step 1's record waits until the world has answered every rollout of step 2's batch: without
the calls started ahead, none of them comes while step 1 is still being recorded.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, train_two_steps

pytestmark = pytest.mark.slow


def test_the_next_steps_rollouts_are_answered_while_a_step_is_recorded(prefect_settings, in_tmp, monkeypatch):
    from skillopt.flows import train as train_flow
    from skillopt.runs import RunDir

    world = DemoWorldServer()
    runs, answered_ahead = [], []
    original_step, original_record = train_flow.train_step, RunDir.record_step

    def keeping_the_run(run, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        runs.append(run)
        return original_step(run, *args, **kwargs)

    def recording_after_step_two_is_answered(self, record) -> None:  # noqa: ANN001
        if record.step == 1 and not answered_ahead:
            run = runs[0]
            step_two = run.epoch_plan(1).steps[1].batches[0].item_ids
            questions = {run.items[item_id]["question"] for item_id in step_two}
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not questions <= _answered_questions(world):
                time.sleep(0.02)
            answered_ahead.append(questions <= _answered_questions(world))
        original_record(self, record)

    monkeypatch.setattr(train_flow, "train_step", keeping_the_run)
    monkeypatch.setattr(RunDir, "record_step", recording_after_step_two_is_answered)
    train_two_steps(world, "next-step-ahead")
    assert runs[0].early is not None, "the run starts its rollouts early"
    assert answered_ahead == [True], "step 2's rollouts were answered while step 1 was being recorded"
    assert len(runs) == 2, "two steps"
    assert len(set(world.answered)) == len(world.answered), "each request reached the model once"
    usage = [json.loads(line) for line in (runs[0].dir.path / "usage.jsonl").read_text().splitlines()]
    calls = [u for u in usage if not u.get("cache_hit")]
    assert len(calls) == len(world.answered), "the ledger holds each call once"


def _answered_questions(world: DemoWorldServer) -> set[str]:
    with world.lock:
        bodies = [json.loads(body) for body in world.answered]
    return {message["content"] for body in bodies for message in body["messages"]
            if message["role"] == "user"}


def test_a_capped_budget_starts_nothing_ahead(prefect_settings, in_tmp, monkeypatch):
    from skillopt.flows import train as train_flow

    started = []
    original = train_flow.start_rollouts
    monkeypatch.setattr(train_flow, "start_rollouts",
                        lambda *args, **kwargs: (started.append(args), original(*args, **kwargs)))
    world = DemoWorldServer()
    train_two_steps(world, "capped", "budget.max_calls=1000")
    assert started == [], "a capped run decides before each step whether it may spend"
