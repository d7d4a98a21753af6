"""``gradient.analyst_workers`` bounds how many analyst calls of one step run at once."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from prefect import flow, task
from prefect.cache_policies import NONE

import skillopt.flows.stages as stages
from skillopt.core.records import ItemResult, Patch


class Gauge:
    def __init__(self) -> None:
        self.lock, self.now, self.peak, self.seen = threading.Lock(), 0, 0, []

    def enter(self, ids: list[str]) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.seen.append(ids)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


GAUGE = Gauge()


@task(cache_policy=NONE, persist_result=False)
def fake_analyst(run, kind, skill, rows, budget, step_buffer, meta_skill) -> Patch:
    GAUGE.enter([row.id for row in rows])
    time.sleep(0.2)
    GAUGE.leave()
    return Patch(reasoning=f"{kind}:" + ",".join(row.id for row in rows))


def rows(n: int) -> list[ItemResult]:
    return [ItemResult(id=f"i{i}", task_type="t", hard=float(i % 2), soft=float(i % 2)) for i in range(n)]


class StandInRun:
    """What ``reflect`` reads of a run; hashed by identity and weakly referenceable, as a ``Run`` is (the task
    pools are kept by run)."""

    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)


def context(workers: int) -> StandInRun:
    gradient = SimpleNamespace(minibatch_size=1, failure_only=False, analyst_workers=workers)
    no_hints = SimpleNamespace(calls=lambda fn, arguments: None)  # a run without a prefetch layer
    return StandInRun(config=SimpleNamespace(gradient=gradient), prefetch=no_hints)


@flow(validate_parameters=False)
def one_reflection(run, batch):
    return stages.reflect(run, "skill", batch, seed=1, budget=2, buffer="", meta_skill="")


def test_analyst_calls_never_exceed_analyst_workers_and_every_minibatch_is_reflected(monkeypatch):
    GAUGE.__init__()
    monkeypatch.setattr(stages, "bound", lambda _run, _task: fake_analyst)
    failures, successes = one_reflection(context(2), rows(6))
    assert GAUGE.peak == 2
    assert sorted(ids[0] for ids in GAUGE.seen) == [f"i{i}" for i in range(6)]
    assert sorted(p.reasoning for p in failures) == ["failure:i0", "failure:i2", "failure:i4"]
    assert sorted(p.reasoning for p in successes) == ["success:i1", "success:i3", "success:i5"]
