"""The baseline ends when its own rollouts are in: step 1's first batch, started with it as one wave, is
taken by step 1 when it is answered, not waited for by the baseline.

Where the run has its rollout pool (a reply store, local limits), the first batch's calls start there
without a task run (``flows.stages.start_first_rollouts``). The world holds every reply of that batch until
the baseline's evaluation is written (at most 15 s): had the baseline waited for them, it could only be
written once the world gave up holding. The world runs the demo's target and optimizer behind the loopback
OpenAI-compatible fake.
"""

from __future__ import annotations

import json
import threading

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, train_two_steps

pytestmark = pytest.mark.slow


class HoldingWorld(DemoWorldServer):
    """Holds the replies to ``hold`` questions until ``let_go`` is set or 15 s have passed; ``sent`` counts
    the held replies that have left."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: set[str] = set()
        self.let_go = threading.Event()
        self.sent = 0

    def reply(self, request):  # noqa: ANN001, ANN201
        body = request.body
        if isinstance(body, dict) and "messages" in body:
            asked = {m["content"] for m in body["messages"] if m["role"] == "user"}
            with self.lock:
                held = bool(asked & self.hold)
            if held:
                self.let_go.wait(timeout=15)
                with self.lock:
                    self.sent += 1
        return super().reply(request)


def test_the_baseline_is_written_while_step_ones_first_batch_is_still_in_flight(prefect_settings, in_tmp,
                                                                                monkeypatch):
    from skillopt.flows import train as train_flow
    from skillopt.rollouts import first_batch
    from skillopt.runs import RunDir

    world = HoldingWorld()
    runs, still_held = [], []
    original_start, original_write = train_flow.start_first_rollouts, RunDir.write_evaluation

    def holding_the_first_batch(run, skill):  # noqa: ANN001, ANN202
        runs.append(run)
        batch, _ = first_batch(run)
        with world.lock:
            world.hold |= {run.items[item_id]["question"] for item_id in batch.item_ids}
        return original_start(run, skill)

    def noting_the_hold(self, name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if name == "baseline_selection":
            with world.lock:
                still_held.append(world.sent == 0)
            world.let_go.set()
        return original_write(self, name, *args, **kwargs)

    monkeypatch.setattr(train_flow, "start_first_rollouts", holding_the_first_batch)
    monkeypatch.setattr(RunDir, "write_evaluation", noting_the_hold)
    train_two_steps(world, "baseline-own")
    assert runs and runs[0].early is not None, "the run has its rollout pool"
    assert still_held == [True], "the baseline was written while step 1's first batch was held"
    assert len(set(world.answered)) == len(world.answered), "each request reached the model once"
    usage = [json.loads(line) for line in (runs[0].dir.path / "usage.jsonl").read_text().splitlines()]
    calls = [u for u in usage if not u.get("cache_hit")]
    assert len(calls) == len(world.answered), "the ledger holds each call once"
    training = [u for u in calls if u["stage"] == "rollout" and u["tags"].get("training")]
    assert len(training) == 8, "two steps of four: step 1 took the first batch's calls"
