"""An evaluation the run already finished, asked for again (the current skill at every gate, the final stage's
selection checks), is answered without a task run and still counted as the cache hits it stands for."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow


def test_a_finished_evaluation_asked_again_makes_no_task_run_and_counts_its_cache_hits(
        prefect_settings, in_tmp):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.context import get_run_context

    from skillopt.core.config import load_config
    from skillopt.run.assembly import RunSpec
    from skillopt.tasks.rollout import evaluate, evaluate_many
    from skillopt.tasks.run import started_run

    loaded = load_config("demo", overrides=["benchmark.val_size=6"], env={})
    spec = RunSpec.create(loaded, run_name="finished-evaluations")

    @flow(name="evaluate-three-times")
    def three_times() -> tuple:
        with started_run(spec, loaded=loaded) as run:
            skill = run.starting_skill()
            first = evaluate(run, skill, "val")
            again = evaluate(run, skill, "val")
            (side_by_side,) = evaluate_many(run, [(skill, "val", run.selection_ids("val"))])
            context = get_run_context()
            return str(context.flow_run.id), first, again, side_by_side, run.clients.ledger.records()

    flow_run_id, first, again, side_by_side, records = three_times()
    assert len(first.rows) == 6
    assert again == first and side_by_side == first
    rollouts = [r for r in records if r.stage == "rollout"]
    assert sum(not r.cache_hit for r in rollouts) == 6, "each item was rolled out once"
    assert sum(r.cache_hit for r in rollouts) == 2 * 6, "each answer again counts one cache hit per item"

    # The server records task runs from the client's events: wait for the six rollouts' task runs.
    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:
            names = [t.name for t in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))]
            if sum(n.startswith("rollout_item") for n in names) >= 6 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert sum(n.startswith("rollout_item") for n in names) == 6, names
    assert sum(n.startswith("evaluate_skill") for n in names) == 1, names
