"""The prefetch layer (``skillopt.run.prefetch``): a hinted rollout is made once, on the run's rollout slots,
and the task that asks for it afterwards (or while it is in flight) takes its reply as that same call."""

from __future__ import annotations

import threading

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, role_overrides


def _run(tmp_path, monkeypatch, *overrides: str):  # noqa: ANN001, ANN202
    from skillopt.core.config import load_config
    from skillopt.llm.limiter import NoLimits
    from skillopt.run.assembly import Run, RunSpec

    monkeypatch.chdir(tmp_path)
    loaded = load_config("demo", overrides=["benchmark.val_size=6", *overrides], env={})
    # Prefect's limits are the task layer's to supply; any limiter stands in for them here.
    limiter = NoLimits() if loaded.config.model.rate_limit_mode == "prefect" else None
    return Run.build(RunSpec.create(loaded, run_name="prefetch"), env={}, loaded=loaded, limiter=limiter)


@pytest.mark.parametrize(("overrides", "applies"), [
    ((), True),
    (("budget.max_calls=1000",), False),
    (("run.task_runner=dask",), False),
    (("model.rate_limit_mode=prefect",), False),
])
def test_prefetch_applies_only_where_the_flow_s_tasks_can_take_its_replies(tmp_path, monkeypatch, overrides,
                                                                           applies):
    run = _run(tmp_path, monkeypatch, *role_overrides("http://127.0.0.1:9/v1"), *overrides)
    assert run.prefetch.enabled is applies


def test_the_scripted_backend_prefetches_nothing(tmp_path, monkeypatch):
    run = _run(tmp_path, monkeypatch)
    run.prefetch.run_start()
    assert not run.prefetch.enabled and run.clients.ledger.records() == []


def test_a_prefetched_rollout_is_made_once_within_the_workers_and_its_task_takes_it(tmp_path, monkeypatch):
    from skillopt.run.rollouts import roll_out

    world = DemoWorldServer(latency_s=0.3)
    with world.server:
        url = world.server.openai_base_url
        run = _run(tmp_path, monkeypatch, *role_overrides(url), "benchmark.workers=2")
        skill, ids = run.starting_skill(), run.selection_ids("val")
        run.prefetch.rollouts(skill, ids, training=False)
        rows: dict[str, object] = {}

        def task(item_id: str) -> None:  # what the rollout_item task does
            rows[item_id] = roll_out(run, run.items[item_id], skill, training=False, judge=None)

        tasks = [threading.Thread(target=task, args=(item_id,)) for item_id in ids]
        for thread in tasks:
            thread.start()
        for thread in tasks:
            thread.join()
        run.prefetch.close()
        assert world.server.max_in_flight <= 2, "prefetch and tasks share benchmark.workers"
    assert len(world.answered) == len(set(world.answered)) == len(ids), "one call per rollout"
    records = run.clients.ledger.records()
    assert len(records) == len(ids) and not [r for r in records if r.cache_hit]
    assert sorted(rows) == sorted(ids)


def test_a_hinted_task_call_is_made_once_and_the_task_takes_its_reply(tmp_path, monkeypatch):
    from skillopt.llm.chat import ChatRequest, user

    world = DemoWorldServer(latency_s=0.3)
    with world.server:
        run = _run(tmp_path, monkeypatch, *role_overrides(world.server.openai_base_url))
        request = ChatRequest(messages=[user("What is 2 + 2? Reply with the number.")], stage="rollout")

        def task_function(run, request):  # noqa: ANN001, ANN202 - a task's function: one model call
            return run.clients.optimizer.chat(request).text

        run.prefetch.calls(task_function, [{"run": run, "request": request}])
        asked = task_function(run, request)  # the task, while the hinted call is in flight
        run.prefetch.close()
    assert len(world.answered) == 1, "one call"
    records = run.clients.ledger.records()
    assert [r.cache_hit for r in records] == [False] and asked


def test_a_waiting_flow_rollout_gets_the_next_slot_before_a_prefetched_one():
    import time

    from skillopt.llm.reply_store import PREFETCH
    from skillopt.run.rollouts import RolloutSlots

    slots, order = RolloutSlots(1), []

    def rollout(name: str, prefetched: bool) -> None:
        PREFETCH.set(prefetched)  # this thread's own context
        with slots.hold():
            order.append(name)

    with slots.hold():
        prefetch = threading.Thread(target=rollout, args=("prefetched", True))
        prefetch.start()
        time.sleep(0.1)  # the prefetched rollout waits first
        flow = threading.Thread(target=rollout, args=("flow", False))
        flow.start()
        time.sleep(0.1)
    prefetch.join()
    flow.join()
    assert order == ["flow", "prefetched"]


def test_a_closed_layer_starts_nothing_more(tmp_path, monkeypatch):
    """A hint still running when the run ends (its thread waited on a call that finished after ``close``)
    must not start the calls that follow: the run is over and nobody will take their replies."""
    from skillopt.llm.chat import ChatRequest, user
    from skillopt.run.prefetch import NotPrefetched

    world = DemoWorldServer()
    with world.server:
        run = _run(tmp_path, monkeypatch, *role_overrides(world.server.openai_base_url))
        request = ChatRequest(messages=[user("What is 2 + 2? Reply with the number.")], stage="rollout")

        def task_function(run, request):  # noqa: ANN001, ANN202 - a task's function: one model call
            return run.clients.optimizer.chat(request).text

        assert run.prefetch.results(task_function, [{"run": run, "request": request}])
        run.prefetch.close()
        with pytest.raises(NotPrefetched):
            run.prefetch.results(task_function, [{"run": run, "request": request.model_copy(
                update={"messages": [user("What is 3 + 3?")]})}])
        run.prefetch.calls(task_function, [{"run": run, "request": request.model_copy(
            update={"messages": [user("What is 4 + 4?")]})}])
        assert run.prefetch.rollouts(run.starting_skill(), run.selection_ids("val"), training=False) == []
    assert len(world.answered) == 1, "nothing after close"
