"""The evaluations left finishing in the background (``tasks/rollout._ahead_of_its_task``) are settled when
the run ends: all waited for and the first error raised on a normal end; on an error or Ctrl-C, waited for
a bounded time and nothing of theirs raised, so the run's own error is the one told."""

from __future__ import annotations

import pytest

from skillopt.tasks import rollout


class StandInRun:
    """Hashed by identity and weakly referenceable, as a ``Run`` is."""


class Submitted:
    """The ``wait``/``result`` of a Prefect future."""

    def __init__(self, error: Exception | None = None, *, done: bool = True) -> None:
        self.error, self.done, self.waits = error, done, []

    def wait(self, timeout: float | None = None) -> None:
        self.waits.append(timeout)

    def result(self) -> str:
        if self.error:
            raise self.error
        return "evaluation"


def _left(run: StandInRun, *submitted: Submitted) -> None:
    rollout._in_background[run] = list(submitted)
    rollout._flow_shown[run] = {(f"skill-{i}", "val") for i in range(len(submitted))}


def test_a_normal_end_waits_for_every_task_and_raises_the_first_error():
    run = StandInRun()
    first, failed, last = Submitted(), Submitted(OSError("the cache folder is full")), Submitted()
    _left(run, first, failed, last)
    with pytest.raises(OSError, match="the cache folder is full"):
        rollout.settle_evaluations(run)
    assert [s.waits for s in (first, failed, last)] == [[None], [None], [None]], "each waited for, to the end"
    assert run not in rollout._in_background and run not in rollout._flow_shown


def test_an_ending_on_an_error_waits_a_bounded_time_and_raises_nothing():
    run = StandInRun()
    stuck, failed = Submitted(done=False), Submitted(OSError("the cache folder is full"))
    _left(run, stuck, failed)
    rollout.settle_evaluations(run, wait_s=0.5)
    waits = stuck.waits + failed.waits
    assert len(waits) == 2 and all(w is not None and 0.0 <= w <= 0.5 for w in waits)
    assert run not in rollout._in_background and run not in rollout._flow_shown


def test_a_run_without_background_evaluations_settles_at_once():
    rollout.settle_evaluations(StandInRun())
