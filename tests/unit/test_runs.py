"""The run directory, summary.json (§3) and the artifact builders (§5.4)."""

from __future__ import annotations

import io
import json
import math
import re
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from skillopt.core.config import SkillOptConfig
from skillopt.core.errors import ConfigError
from skillopt.core.gate import Scores, decide
from skillopt.core.records import ItemResult, StepRecord
from skillopt.core.redact import Redactor
from skillopt.run import artifacts
from skillopt.run.runs import (
    RunDir,
    RunDirError,
    build_summary,
    config_hash,
    default_run_name,
    per_task_type,
    run_directory_name,
    summary_dict,
    summary_line,
)
from skillopt.skill.document import Edit, apply_edits

SENTINEL = "sk-SENTINEL-0123456789abcdef"


def make_config(**sections) -> SkillOptConfig:
    return SkillOptConfig.model_validate({"benchmark": {"name": "demo"}, **sections})


def open_run(tmp_path: Path, config: SkillOptConfig | None = None, name: str = "run1") -> RunDir:
    config = config or make_config()
    return RunDir.open(
        tmp_path / "runs",
        name,
        config,
        config_hash=config_hash(config),
        provenance={"benchmark.name": "cli", "optimizer.learning_rate": "shipped:configs/demo.yaml"},
    )


def gate_result(candidate: list[float], current: list[float], best: float | None = None):
    def rows(values):
        return [{"id": f"q{i}", "hard": v, "soft": v} for i, v in enumerate(values)]

    current_score = sum(current) / len(current)
    return decide(
        rows(candidate),
        rows(current),
        current_score=current_score,
        best_score=current_score if best is None else best,
        metric="hard",
    )


def record(
    step: int, decision: str = "reject", *, epoch: int = 1, kind: str = "step", gate=None
) -> StepRecord:
    return StepRecord(
        step=step, epoch=epoch, step_in_epoch=step, budget=4, kind=kind, decision=decision, gate=gate,
        current_score=0.5, best_score=0.5,
    )


def item(item_id: str, task_type: str, hard: float, soft: float | None = None) -> ItemResult:
    return ItemResult(
        id=item_id,
        task_type=task_type,
        hard=hard,
        soft=hard if soft is None else soft,
        predicted_answer=f"answer {item_id}",
        trajectory=[{"type": "message", "role": "assistant", "content": "hi"}, {"type": "evaluation"}],
        target_system_prompt="You are a solver.",
        target_user_prompt=f"Solve {item_id}.",
    )


def temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


# --- names and hashes ----------------------------------------------------------------------------


def test_config_hash_ignores_only_fields_that_do_not_change_results() -> None:
    base = make_config()
    neutral = make_config(
        run={"run_name": "other", "runs_dir": "elsewhere", "refresh_cache": True},
        benchmark={"name": "demo", "workers": 3},
        gradient={"analyst_workers": 2},
    )
    assert config_hash(neutral) == config_hash(base)
    assert config_hash(make_config(optimizer={"learning_rate": 8})) != config_hash(base)
    assert config_hash(make_config(benchmark={"name": "demo", "extra_key": 1})) != config_hash(base)
    assert len(config_hash(base)) == 64


def test_run_names_follow_the_documented_patterns() -> None:
    now = datetime(2026, 11, 30, 4, 12, 9)
    digest = config_hash(make_config())
    assert default_run_name("searchqa", digest, now) == f"searchqa-20261130-041209-{digest[:6]}"
    assert run_directory_name("searchqa", make_config(), now=now) == f"searchqa-20261130-041209-{digest[:6]}"
    assert run_directory_name("searchqa", make_config(), prefix="eval", now=now).startswith(
        "searchqa-eval-2026"
    )
    assert run_directory_name("searchqa", make_config(run={"run_name": "mine"}), now=now) == "mine"


# --- layout, config.yaml, resume -----------------------------------------------------------------


def test_open_writes_config_yaml_with_hash_header_config_and_sources(tmp_path: Path) -> None:
    config = make_config(optimizer={"learning_rate": 6})
    run = open_run(tmp_path, config)
    text = run.config_path.read_text(encoding="utf-8")
    assert f"# config_hash: {config_hash(config)}" in text.splitlines()[:3]
    data = yaml.safe_load(text)
    assert data["optimizer"]["learning_rate"] == 6
    assert data["sources"] == {
        "benchmark.name": "cli",
        "optimizer.learning_rate": "shipped:configs/demo.yaml",
    }
    assert run.recorded_config_hash() == config_hash(config)


def test_every_writer_lands_in_its_documented_place_and_leaves_no_temp_files(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    run.write_skill_snapshot(0, "initial skill\n")
    run.write_skill_snapshot(12, "after step twelve\n")
    run.write_best_skill("best\n")
    run.write_step_json(3, "gate", gate_result([1, 1], [0, 1]))
    run.write_epoch_json(2, "slow_update", {"guidance": "be careful"})
    run.write_json("splits/manifest.json", {"train": ["a"], "val": ["b"]})
    run.write_jsonl("steps/0003/trajectories.jsonl", [item("a", "math", 1.0), {"id": "b"}])
    run.record_step(record(1))

    for rel in (
        "config.yaml",
        "history.jsonl",
        "best_skill.md",
        "skills/step_0000.md",
        "skills/step_0012.md",
        "steps/0003/gate.json",
        "steps/0003/trajectories.jsonl",
        "epochs/02/slow_update.json",
        "splits/manifest.json",
    ):
        assert (run.path / rel).is_file(), rel
    assert run.usage_path == run.path / "usage.jsonl"
    lines = (run.path / "steps/0003/trajectories.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b"]
    assert json.loads((run.path / "steps/0003/gate.json").read_text())["decision"] == "accept_new_best"
    assert temp_files(run.path) == []


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    run.write_json("steps/0001/patches.json", {"ok": True})
    with pytest.raises(TypeError, match="object"):
        run.write_json("steps/0001/patches.json", {"bad": object()})
    assert json.loads((run.path / "steps/0001/patches.json").read_text()) == {"ok": True}
    assert temp_files(run.path) == []


def test_writes_cannot_leave_the_run_directory(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    for rel in ("../escape.txt", "/tmp/absolute.txt", ""):
        with pytest.raises(RunDirError, match="inside the run directory"):
            run.write_text(rel, "x")
    with pytest.raises(ConfigError, match="run name"):
        open_run(tmp_path, name="../other")


def test_reopening_with_the_same_config_resumes_into_the_same_folder(tmp_path: Path) -> None:
    first = open_run(tmp_path)
    first.record_step(record(1))
    original = first.config_path.read_text()
    # A neutral field (parallelism) may differ on resume.
    second = open_run(tmp_path, make_config(benchmark={"name": "demo", "workers": 2}))
    assert second.path == first.path
    assert second.config_path.read_text() == original
    assert [r.step for r in second.read_history()] == [1]


def test_reopening_with_a_different_config_names_both_hashes_and_what_changed(tmp_path: Path) -> None:
    old = make_config()
    open_run(tmp_path, old).record_step(record(1))  # the run recorded a step
    new = make_config(optimizer={"learning_rate": 8})
    with pytest.raises(ConfigError) as error:
        open_run(tmp_path, new)
    message = str(error.value)
    assert config_hash(old)[:12] in message and config_hash(new)[:12] in message
    assert "changed: optimizer.learning_rate;" in message and "--run-name" in message


def test_a_secret_in_the_environment_never_reaches_config_yaml(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SENTINEL)
    monkeypatch.setenv("MY_SERVICE_TOKEN", "plain-sentinel-token-value")
    # A value that equals the secret (it cannot come from a config file, which refuses literal keys)
    # and a provenance label holding the other one.
    config = make_config(benchmark={"name": "demo", "data_path": f"/data/{SENTINEL}"})
    run = RunDir.open(
        tmp_path, "secret-run", config, config_hash=config_hash(config),
        provenance={"benchmark.data_path": "env:plain-sentinel-token-value"},
    )
    text = run.config_path.read_text(encoding="utf-8")
    assert "SENTINEL" not in text and "plain-sentinel-token-value" not in text
    assert "[REDACTED]" in text
    assert run.recorded_config_hash() == config_hash(config)


# --- skill snapshots and history -----------------------------------------------------------------


def test_skill_snapshot_is_never_changed_once_written(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    run.write_skill_snapshot(3, "skill v3\n")
    run.write_skill_snapshot(3, "skill v3\n")  # a resumed run writing the same skill: fine
    with pytest.raises(RunDirError, match="step_0003.md.*never overwritten"):
        run.write_skill_snapshot(3, "a different skill\n")
    assert run.skill_snapshot_path(3).read_text() == "skill v3\n"


def test_recording_a_step_twice_keeps_one_line_in_step_order(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    for step in (1, 3, 2):
        run.record_step(record(step))
    run.record_step(record(2, kind="slow_update", decision="force_accept"))
    run.record_step(record(3, decision="accept"))  # step 3 again, e.g. after a resume
    lines = run.history_path.read_text().splitlines()
    assert len(lines) == 4
    history = run.read_history()
    assert [(r.step, r.kind, r.decision) for r in history] == [
        (1, "step", "reject"),
        (2, "step", "reject"),
        (2, "slow_update", "force_accept"),
        (3, "step", "accept"),
    ]
    # A new RunDir on the same folder (a restarted process) keeps the earlier lines.
    again = open_run(tmp_path)
    again.record_step(record(4))
    assert [r.step for r in again.read_history()] == [1, 2, 2, 3, 4]
    assert temp_files(run.path) == []


# --- evaluations -----------------------------------------------------------------------------------


def test_per_task_type_breaks_scores_down_by_task_type() -> None:
    rows = [item("a", "math", 1.0), item("b", "math", 0.0, 0.5), item("c", "code", 1.0)]
    assert per_task_type(rows) == {
        "code": {"hard": 1.0, "soft": 1.0, "n": 1},
        "math": {"hard": 0.5, "soft": 0.75, "n": 2},
    }


def test_write_evaluation_writes_results_scores_and_predictions(tmp_path: Path) -> None:
    run = open_run(tmp_path)
    rows = [item("a", "math", 1.0), item("b", "math", 0.0), item("weird/id", "code", 1.0)]
    folder = run.write_evaluation("baseline_test", rows, split="test", skill_sha="abc123")
    assert folder == run.path / "eval" / "baseline_test"

    results = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in results] == ["a", "b", "weird/id"]
    assert "trajectory" not in results[0] and results[0]["predicted_answer"] == "answer a"

    scores = json.loads((folder / "scores.json").read_text())
    assert scores["split"] == "test" and scores["skill_sha"] == "abc123" and scores["n"] == 3
    assert scores["hard"] == pytest.approx(2 / 3)
    assert scores["per_task_type"]["math"] == {"hard": 0.5, "soft": 0.5, "n": 2}

    prediction = folder / "predictions" / "a"
    assert json.loads((prediction / "trajectory.json").read_text())[-1] == {"type": "evaluation"}
    assert (prediction / "target_system_prompt.txt").read_text() == "You are a solver."
    assert (prediction / "target_user_prompt.txt").read_text() == "Solve a."
    # An id that is not a file name still gets its own folder inside predictions/.
    others = sorted(p.name for p in (folder / "predictions").iterdir())
    assert len(others) == 3 and all("/" not in name for name in others)
    assert temp_files(run.path) == []

    with pytest.raises(ValueError, match="duplicate item ids: a"):
        run.write_evaluation(
            "dup", [item("a", "math", 1.0), item("a", "math", 0.0)], split="val", skill_sha="x"
        )


# --- summary.json ----------------------------------------------------------------------------------


def test_summary_has_exactly_the_documented_shape_with_numeric_scores(tmp_path: Path) -> None:
    history = [
        record(1, "accept_new_best", gate=gate_result([1, 1], [0, 1])),
        record(2, "reject"),
        record(3, "skip_no_patches", epoch=2),
        record(4, "force_accept", epoch=2),
        record(2, "force_accept", kind="slow_update"),
    ]
    usage = {"by_stage": [], "by_role": [], "by_model": [], "total": {"calls": 0, "usd": 0.0}}
    summary = build_summary(
        run_name="run1", benchmark="demo", config=make_config(),
        baseline_selection=Scores(hard=0.5, soft=0.6, n=10), baseline_test={"hard": 0.4, "soft": 0.5},
        best_selection={"hard": 0.7, "soft": 0.8}, best_test={"hard": 0.6, "soft": 0.65},
        final_selection={"hard": 0.7, "soft": 0.8}, history=history, usage=usage, wall_s=12.5,
    )
    run = open_run(tmp_path)
    run.write_summary(summary)
    data = json.loads(run.summary_path.read_text())

    assert set(data["scores"]) == {"baseline", "best", "final"}
    assert set(data["scores"]["baseline"]) == {"selection", "test"}
    assert set(data["scores"]["best"]) == {"selection", "test"}
    assert set(data["scores"]["final"]) == {"selection"}
    for phase in data["scores"].values():
        for split in phase.values():
            assert set(split) == {"hard", "soft"}
            assert all(isinstance(v, float) and math.isfinite(v) for v in split.values())
    assert data["stopped_by"] is None and data["usage"] == usage
    assert data["counts"]["total"] == {
        "n": 4,
        "accepts": 2,
        "new_best": 1,
        "rejects": 1,
        "skips": 1,
        "other": 0,
    }
    assert data["counts"]["per_epoch"]["2"] == {"n": 2, "accepts": 1, "new_best": 0, "rejects": 0, "skips": 1,
                                                "other": 0}
    assert data["counts"]["slow_updates"]["accepts"] == 1
    assert data == summary_dict(summary)


def test_summary_omits_test_scores_only_when_eval_test_is_off() -> None:
    common = dict(run_name="r", benchmark="demo", baseline_selection={"hard": 0.1, "soft": 0.2},
                  best_selection={"hard": 0.3, "soft": 0.4}, final_selection={"hard": 0.3, "soft": 0.4})
    no_test = build_summary(config=make_config(evaluation={"eval_test": False}), **common)
    assert set(summary_dict(no_test)["scores"]["baseline"]) == {"selection"}
    with pytest.raises(ValueError, match="baseline_test scores are required"):
        build_summary(config=make_config(), **common)
    with pytest.raises(ValueError, match="finite number"):
        build_summary(config=make_config(evaluation={"eval_test": False}),
                      **{**common, "final_selection": {"hard": float("nan"), "soft": 0.0}})


def test_a_run_stopped_in_its_baseline_has_a_summary_without_scores() -> None:
    """The budget stopped the run before the starting skill was scored: no phase has scores, and the run's
    log line and the command's summary say so instead of failing on the missing scores."""
    from skillopt.core.redact import Redactor
    from skillopt.shell.cli import _Output, _print_summary

    summary = build_summary(run_name="r", benchmark="demo", config=make_config(), baseline_selection=None,
                            best_selection=None, final_selection=None, stopped_by="budget",
                            stopped_message="budget: hard budget stop: …; stopped in the baseline evaluation")
    data = summary_dict(summary)
    assert data["scores"] == {} and data["stopped_by"] == "budget"
    assert summary_line(data).startswith("finished r (stopped by budget): best not scored (baseline: not "
                                         "scored); 0 steps")
    printed = io.StringIO()
    _print_summary({**data, "run_dir": "runs/r"},
                   _Output(Redactor.from_environment(), printed, io.StringIO()))
    assert "  baseline  not scored\n  best      not scored\n" in printed.getvalue()
    with pytest.raises(ValueError, match="selection scores are required for a run that was not stopped"):
        build_summary(run_name="r", benchmark="demo", config=make_config(), baseline_selection=None,
                      best_selection=None, final_selection=None)


# --- artifacts -------------------------------------------------------------------------------------


def test_artifact_keys_contain_only_what_prefect_accepts() -> None:
    assert re.fullmatch(r"searchqa-my-run-2-[0-9a-f]{6}-gates",
                        artifacts.artifact_key("SearchQA", "My_Run.2", "gates"))
    assert re.fullmatch(r"demo-run-1---[0-9a-f]{6}-skill-diff",
                        artifacts.artifact_key("demo", "run 1/é", artifacts.SKILL_DIFF))


def test_artifact_keys_do_not_repeat_the_benchmark_a_run_name_starts_with() -> None:
    assert artifacts.artifact_key("demo", "demo-20261201-101500-3fa9c1", "progress") == \
        "demo-20261201-101500-3fa9c1-progress"
    assert artifacts.artifact_key("SearchQA", "searchqa", "cost") == "searchqa-cost"
    assert artifacts.artifact_key("qa", "qax-1", "cost") == "qa-qax-1-cost"  # only a whole-word prefix


def test_run_names_that_slug_alike_get_keys_of_their_own() -> None:
    """``Exp_1`` and ``exp.1`` once both published ``demo-exp-1-report``: the UI showed one run's report under
    the other's key."""
    keys = {artifacts.artifact_key("demo", name, "report") for name in ("Exp_1", "exp.1", "exp-1", "EXP-1")}
    assert len(keys) == 4 and "demo-exp-1-report" in keys  # a name the slug keeps is keyed as it is
    assert all(re.fullmatch(r"demo-exp-1(-[0-9a-f]{6})?-report", key) for key in keys)


def test_progress_markdown_shows_position_and_scores() -> None:
    text = artifacts.progress_markdown(2, 4, 7, 16, 0.625, 0.7)
    assert "Epoch 2/4" in text and "step 7/16" in text and "43.8%" in text
    assert "| current | 0.625 |" in text and "| best | 0.700 |" in text
    assert "| current | – |" in artifacts.progress_markdown(1, 4, 0, 16, None, None)
    final = artifacts.progress_markdown(4, 4, 16, 16, 0.75, 1.0, finished=True)
    assert final.startswith("**Finished · Epoch 4/4 · step 16/16 (100.0%)**") and "| best | 1.000 |" in final
    why = "budget reached: 55 of 60 calls; stopped before epoch 1 step 3/6; raise budget.max_calls and resume"
    stopped = artifacts.progress_markdown(1, 2, 2, 6, 0.75, 0.75, finished=True, stopped=why)
    assert stopped.startswith(f"**Stopped · Epoch 1/2 · step 2/6 (33.3%)**\n\n{why}\n\n")  # not Finished
    spend = "120 model calls, 45,000 tokens, $0.0310"
    spent = artifacts.progress_markdown(2, 4, 7, 16, 0.625, 0.7, spend=spend)
    assert spent.rstrip().endswith(f"Spend so far: {spend}")


def test_skill_diff_markdown_holds_the_decision_and_a_fenced_diff() -> None:
    gate = gate_result([1, 1], [0, 1])
    text = artifacts.skill_diff_markdown(5, "Rule A\n", "Rule A\n```code```\n", gate)
    assert text.startswith("### Step 5: accept_new_best")
    assert "````diff\n" in text and "+```code```" in text and text.rstrip().endswith("````")
    assert "did not change" in artifacts.skill_diff_markdown(5, "same\n", "same\n", gate)


def test_artifact_builders_redact_secrets(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SENTINEL)
    gate = gate_result([1, 1], [0, 1])
    text = artifacts.skill_diff_markdown(1, "old\n", f"new {SENTINEL}\n", gate)
    rows = artifacts.edits_table([Edit(op="replace", target=f"key {SENTINEL}", content=f"use {SENTINEL}")])
    assert SENTINEL not in text and SENTINEL not in json.dumps(rows)


def test_edits_table_lists_rank_op_target_support_status_and_decision() -> None:
    skill = "Always check units.\n"
    edits = [
        Edit(op="append", content="Show your work.", support_count=5),
        Edit(op="replace", target="Always check units." + " really" * 20, content="x", support_count=2),
    ]
    _, report = apply_edits(skill, edits)
    rows = artifacts.edits_table(edits, report, "reject")
    assert [r["rank"] for r in rows] == [1, 2]
    assert rows[0] == {"rank": 1, "file": "SKILL.md", "op": "append", "target": "(end of body)",
                       "content": "Show your work.", "support": 5, "status": "applied",
                       "decision": "rejected"}
    assert rows[1]["status"] == "skipped_target_not_found" and rows[1]["decision"] == "–"
    assert len(rows[1]["target"]) == artifacts.TARGET_WIDTH and rows[1]["target"].endswith("…")
    long_rule = Edit(op="append", content="Check\nunits. " + "word " * 200)
    (row,) = artifacts.edits_table([long_rule])
    assert row["content"].startswith("Check units. word") and len(row["content"]) == artifacts.CONTENT_WIDTH
    assert artifacts.edits_table(edits[:1], report, "accept_new_best")[0]["decision"] == "accepted"


def test_gate_table_lists_each_decision_with_scores_and_flips() -> None:
    history = [record(1, "accept_new_best", gate=gate_result([1, 1], [0, 1])), record(2, "skip_no_patches")]
    history[0] = history[0].model_copy(
        update={"gate_error_ids": ["v7"], "replies_parsed": 3, "replies_fallback": 1,
                "files_changed": ["SKILL.md", "references/rules.md"]}
    )
    rows = artifacts.gate_table(history)
    assert rows[0] == {"step": 1, "epoch": 1, "decision": "accept_new_best", "candidate": 1.0, "current": 0.5,
                       "best": 0.5, "flips": "+1/-0", "errors": 1, "replies": "3/4",
                       "files": "SKILL.md, references/rules.md"}
    assert rows[1]["candidate"] is None and rows[1]["flips"] is None and rows[1]["current"] == 0.5


def test_cost_table_has_a_row_per_stage_and_a_total() -> None:
    usage = {
        "by_stage": [
            {"stage": "rollout", "calls": 40, "tokens": 12000, "usd": 0.12345},
            {"stage": "analyst", "calls": 5, "tokens": 30000, "usd": 0.5},
        ],
        "total": {"calls": 45, "tokens": 42000, "usd": 0.62345},
    }
    rows = artifacts.cost_table({"usage": usage})
    assert rows == [
        {"stage": "rollout", "role": "target", "calls": 40, "tokens": 12000, "usd": 0.12345},
        {"stage": "analyst", "role": "optimizer", "calls": 5, "tokens": 30000, "usd": 0.5},
        {"stage": "total", "role": "", "calls": 45, "tokens": 42000, "usd": 0.62345},
    ]
    assert artifacts.cost_table(usage) == rows


def test_a_redactor_can_be_passed_explicitly() -> None:
    text = artifacts.progress_markdown(1, 1, 1, 1, 0.5, 0.5, redactor=Redactor(["0.500"]))
    assert "0.500" not in text


def test_the_cost_table_says_unknown_for_unpriced_calls():
    from skillopt.run.artifacts import cost_table

    usage = {"by_stage": [{"stage": "rollout", "calls": 3, "tokens": 90, "usd": 0.0, "unpriced_calls": 3},
                          {"stage": "analyst", "calls": 1, "tokens": 50, "usd": 0.002, "unpriced_calls": 0}],
             "total": {"calls": 4, "tokens": 140, "usd": 0.002, "unpriced_calls": 3}}
    rows = {row["stage"]: row["usd"] for row in cost_table({"usage": usage})}
    assert rows == {"rollout": "unknown", "analyst": 0.002, "total": "0.002 + unknown (3 unpriced calls)"}


def test_the_finished_progress_keeps_the_run_s_reply_counts():
    from skillopt.run.artifacts import progress_markdown

    totals = {"optimizer_replies": {"parsed": 1, "fallback": 5}, "errors": {"rollout": 2, "gate": 0}}
    text = progress_markdown(1, 1, 3, 3, 0.4, 0.5, finished=True, totals=totals)
    assert text.startswith("**Finished")
    assert "optimizer replies 1 parsed, 5 fallback" in text and "error rows 2 in batches" in text
    assert "**Warning:**" in text


def test_summary_line_counts_steps_in_the_right_number() -> None:
    def summary(n: int) -> dict[str, object]:
        return {"run_name": "demo-x", "scores": {}, "usage": {"total": {"calls": 3}},
                "counts": {"total": {"n": n, "accepts": n, "rejects": 0, "skips": 0}}}

    assert "; 1 step: 1 accepted, 0 rejected" in summary_line(summary(1))
    assert "; 2 steps: 2 accepted, 0 rejected" in summary_line(summary(2))
