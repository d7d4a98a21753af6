"""Error rows are not failures, and unusable optimizer replies are visible.

Error rows (a model call that failed after its retries) never reach analysts, the probe or the epoch
comparison, are left out of the gate on both sides paired by item, skip a gate with too many of them, and stop
the run after ``model.failfast_n`` in a row. Parsed / fallback counts of optimizer replies reach summary.json,
the progress artifact and the report, with a warning when most replies were unusable."""

from __future__ import annotations

import pytest

from skillopt.core.config import SkillOptConfig
from skillopt.core.error_rows import (
    ErrorStreak,
    TooManyErrors,
    answered_rows,
    paired_answered,
    too_many_errors,
)
from skillopt.core.records import ItemResult, StepRecord
from skillopt.optimizer.probe import pick_probe_items
from skillopt.optimizer.reflect import split_and_batch
from skillopt.optimizer.slow_update import pair_by_id
from skillopt.optimizer.step_buffer import failure_patterns
from skillopt.run import artifacts
from skillopt.run.report import RunData, render_report
from skillopt.run.runs import build_summary, summary_dict


def result(item_id: str, hard: float = 0.0, *, error: bool = False) -> ItemResult:
    if error:
        return ItemResult(id=item_id, task_type="t", hard=0.0, soft=0.0, phase="error",
                          fail_reason="error: ServerError: HTTP 500 from 127.0.0.1 after 6 attempts")
    return ItemResult(id=item_id, task_type="t", hard=hard, soft=hard, answered=True,
                      fail_reason="" if hard else "wrong")


def test_error_rows_are_never_shown_as_failures():
    rows = [result("a"), result("b", error=True), result("c", 1.0), result("d", error=True)]
    failures, successes = split_and_batch(rows, size=8, seed=1, failure_only=False)
    assert [r.id for batch in failures for r in batch] == ["a"]
    assert [r.id for batch in successes for r in batch] == ["c"]
    assert [r.id for r in pick_probe_items(rows, failures=4, successes=4)] == ["a", "c"]
    assert [p.ids for p in failure_patterns(rows, [])] == [["a"]]
    pairs = pair_by_id([result("a"), result("b"), result("c", 1.0)],
                       [result("a", 1.0), result("b", error=True), result("c", 1.0)])
    assert pairs.ids() == ["a", "c"]
    assert [r.id for r in answered_rows(rows)] == ["a", "c"]


def test_the_gate_leaves_error_items_out_on_every_side_paired_by_item():
    candidate = [result("v1", 1.0), result("v2", error=True), result("v3", 0.0), result("v4", 1.0)]
    current = [result("v1", 0.0), result("v2", 1.0), result("v3", error=True), result("v4", 1.0)]
    (kept_candidate, kept_current), dropped = paired_answered(candidate, current)
    assert dropped == ["v2", "v3"]
    assert [r.id for r in kept_candidate] == [r.id for r in kept_current] == ["v1", "v4"]


def test_a_gate_with_too_many_error_items_is_skipped_with_a_reason():
    assert too_many_errors(1, 10, 0.1) is None
    reason = too_many_errors(2, 10, 0.1)
    assert reason is not None and "2 of 10" in reason and "evaluation.max_error_share 10%" in reason
    assert "all 3" in (too_many_errors(3, 3, 1.0) or "")


def test_failfast_n_error_rows_in_a_row_stop_the_run_with_the_last_error():
    streak = ErrorStreak(3)
    streak.observe([result("a", error=True), result("b", error=True), result("c", 1.0)])  # reset by an answer
    streak.observe([result("d", error=True), result("e", error=True)])
    with pytest.raises(
        TooManyErrors, match=r"3 model calls in a row .*model.failfast_n 3.*item f: error: ServerError"
    ):
        streak.observe([result("f", error=True)])


def steps_with_replies() -> list[StepRecord]:
    return [
        StepRecord(step=1, epoch=1, step_in_epoch=1, budget=4, decision="reject", replies_parsed=1,
                   replies_fallback=4, n_error=2, gate_error_ids=["v1"]),
        StepRecord(step=2, epoch=1, step_in_epoch=2, budget=4, decision="skip_errors", replies_parsed=0,
                   replies_fallback=3),
    ]


def test_summary_counts_parsed_and_unusable_replies_and_error_rows_and_warns():
    config = SkillOptConfig.model_validate(
        {"benchmark": {"name": "demo"}, "evaluation": {"eval_test": False}}
    )
    summary = summary_dict(build_summary(
        run_name="r", benchmark="demo", config=config, baseline_selection={"hard": 0.1, "soft": 0.1},
        best_selection={"hard": 0.1, "soft": 0.1}, final_selection={"hard": 0.1, "soft": 0.1},
        history=steps_with_replies()))
    assert summary["counts"]["optimizer_replies"] == {"parsed": 1, "fallback": 7}
    assert summary["counts"]["errors"] == {"rollout": 2, "gate": 1}
    assert any("most optimizer replies were unusable: 7 of 8" in w for w in summary["warnings"])
    assert any("2 training rollouts and 1 gate items were error rows" in w for w in summary["warnings"])


def test_progress_artifact_and_report_show_the_counts_and_the_warning(tmp_path):
    text = artifacts.progress_markdown(1, 2, 1, 4, 0.5, 0.5, last_step=steps_with_replies()[0])
    assert (
        "optimizer replies 1 parsed, 4 fallback" in text
        and "error rows 2 in the batch, 1 in the gate" in text
    )
    assert "**Warning:** most optimizer replies were unusable: 4 of 5" in text
    calm = steps_with_replies()[0].model_copy(update={"replies_parsed": 4, "replies_fallback": 1})
    assert "Warning" not in artifacts.progress_markdown(1, 2, 1, 4, 0.5, 0.5, last_step=calm)
    config = SkillOptConfig.model_validate(
        {"benchmark": {"name": "demo"}, "evaluation": {"eval_test": False}}
    )
    summary = summary_dict(build_summary(
        run_name="r", benchmark="demo", config=config, baseline_selection={"hard": 0.1, "soft": 0.1},
        best_selection={"hard": 0.1, "soft": 0.1}, final_selection={"hard": 0.1, "soft": 0.1},
        history=steps_with_replies()))
    html = render_report(
        RunData(name="r", path=tmp_path, history=steps_with_replies(), summary=summary, skills={})
    )
    assert "1 parsed, 7 unusable" in html and "most optimizer replies were unusable" in html
    assert "<td>skip_errors</td>" in html
