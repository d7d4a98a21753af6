"""Early rollouts are taken once each: waited for in flight, cancelled if not begun, their errors raised."""

from __future__ import annotations

import threading

import pytest

from skillopt.config import load_config
from skillopt.early_start import EarlyRollouts, early_key, eligible
from skillopt.records import ItemResult


def _row(item_id: str) -> ItemResult:
    return ItemResult(id=item_id, task_type="qa", hard=1.0, soft=1.0)


def test_a_rollout_in_flight_is_waited_for_and_taken_once():
    early = EarlyRollouts(workers=1)
    started, go = threading.Event(), threading.Event()

    def slow() -> ItemResult:
        started.set()
        go.wait(5)
        return _row("a")

    key = early_key("skill", "a", training=False)
    early.submit(key, slow)
    assert started.wait(5)
    threading.Timer(0.05, go.set).start()
    assert early.take(key) == _row("a")
    assert early.take(key) is None  # taken: the next ask makes the call itself
    early.close()


def test_a_rollout_not_begun_is_cancelled_and_left_to_the_task():
    early = EarlyRollouts(workers=1)
    go, ran = threading.Event(), []
    early.submit(early_key("skill", "a", training=False), lambda: (go.wait(5), _row("a"))[1])
    queued = early_key("skill", "b", training=True, sample=0, epoch=1, view_seed=7)
    early.submit(queued, lambda: ran.append("b") or _row("b"))
    assert early.take(queued) is None
    go.set()
    early.close()
    assert ran == []
    assert early.pending() == 0


def test_an_early_call_error_reaches_the_task_that_takes_it():
    early = EarlyRollouts(workers=1)

    def failing() -> ItemResult:
        raise RuntimeError("the endpoint refused")

    key = early_key("skill", "a", training=False)
    early.submit(key, failing)
    with pytest.raises(RuntimeError, match="the endpoint refused"):
        early.take(key)
    early.close()


def test_the_draw_and_the_skill_tell_early_rollouts_apart():
    keys = {early_key("s", "a", training=False), early_key("s", "a", training=True),
            early_key("s", "a", training=True, epoch=1),
            early_key("s", "a", training=True, epoch=1, sample=1),
            early_key("s", "a", training=True, epoch=1, view_seed=3), early_key("t", "a", training=False)}
    assert len(keys) == 6


@pytest.mark.parametrize(("overrides", "expected"), [
    ([], True),
    (["run.task_runner=dask"], False),  # the rollouts run on the cluster's workers
    (["model.rate_limit_mode=prefect"], False),  # the limits are Prefect's, taken inside the flow
])
def test_only_runs_whose_rollouts_run_here_under_local_limits_start_early(overrides, expected):
    loaded = load_config("demo", overrides=overrides, env={})
    assert eligible(loaded.config) is expected
