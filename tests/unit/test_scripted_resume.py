"""A resumed run on the scripted backend takes the calls it already made from the reply store, as the HTTP
backends do, so they count once against ``budget.max_calls``."""

from __future__ import annotations

from pathlib import Path

from skillopt.core.config import load_config
from skillopt.run.assembly import Run
from skillopt.run.rollouts import roll_out


def _run(tmp_path: Path, max_calls: int) -> Run:
    """The demo run "resumed" as a new process builds it: the same run directory and cache folder."""
    overrides = [f"run.runs_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'cache'}",
                 f"budget.max_calls={max_calls}", "budget.hard_factor=1"]
    return Run.from_config(load_config("demo", overrides=overrides, env={}), env={}, run_name="resumed")


def test_a_resumed_scripted_run_does_not_pay_again_for_the_calls_it_made(tmp_path):
    first = _run(tmp_path, max_calls=2)
    assert first.clients.roles.target.backend == "scripted"
    items = [first.items[item_id] for item_id in first.split_ids["val"][:2]]
    rows = [roll_out(first, item, first.initial_skill, training=False, judge=None) for item in items]
    assert first.clients.ledger.totals().calls == 2  # the cap: any further call is refused

    again = _run(tmp_path, max_calls=2)  # a resume: the same two rollouts, then the run goes on
    assert again.clients.ledger.totals().calls == 2  # restored from usage.jsonl
    replayed = [roll_out(again, item, again.initial_skill, training=False, judge=None) for item in items]
    assert [(r.id, r.hard, r.predicted_answer) for r in replayed] == [
        (r.id, r.hard, r.predicted_answer) for r in rows]
    totals = again.clients.ledger.totals()
    assert (totals.calls, totals.cache_hits) == (2, 2)
