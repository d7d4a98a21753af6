"""The skill-train flow end to end on the offline demo world (scripted backend), against a real Prefect
API."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from skillopt.optimizer.schedule import EditBudgetSchedule

pytestmark = pytest.mark.slow


def train(*overrides: str, run_name: str) -> dict:
    from skillopt.flows.train import skill_train

    return skill_train(benchmark="demo", overrides=list(overrides), run_name=run_name)


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def test_demo_improves_on_test_with_accepts_rejects_slow_update_and_meta_skill(prefect_settings, in_tmp):
    summary = train(run_name="demo-e2e")
    run_dir = Path(summary["run_dir"])
    scores = summary["scores"]
    assert scores["best"]["test"]["hard"] > scores["baseline"]["test"]["hard"]
    decisions = Counter(r["decision"] for r in history(run_dir) if r["kind"] == "step")
    assert decisions["accept_new_best"] + decisions["accept"] >= 1
    assert decisions["reject"] >= 1
    assert any(r["kind"] == "slow_update" for r in history(run_dir))
    meta = json.loads((run_dir / "epochs" / "02" / "meta_skill.json").read_text())
    assert meta["memory"].strip()
    assert "<!-- SLOW_UPDATE_START -->" in (run_dir / "skills" / "step_0006.md").read_text() or \
        "SLOW_UPDATE" in (run_dir / "best_skill.md").read_text()
    # Budgets follow the cosine schedule over the whole run.
    steps = [r for r in history(run_dir) if r["kind"] == "step"]
    expected = EditBudgetSchedule.from_config("cosine", 4, 2, len(steps)).budgets()
    assert [r["budget"] for r in steps] == expected
    # The step buffer after each step: this epoch's steps only (it is reset at each epoch start).
    buffers = {step: json.loads((run_dir / "steps" / f"{step:04d}" / "step_buffer.json").read_text())
               for step in (2, 4)}
    assert [e["step"] for e in buffers[2]["entries"]] == [1, 2] and "Step 2:" in buffers[2]["formatted"]
    assert [e["step"] for e in buffers[4]["entries"]] == [4]
    # Files a person reads.
    for name in ("config.yaml", "summary.json", "best_skill.md", "usage.jsonl", "skills/step_0000.md",
                 "eval/baseline_test/scores.json", "eval/best_test/scores.json"):
        assert (run_dir / name).is_file(), name


def test_an_identical_skill_is_never_rolled_out_twice(prefect_settings, in_tmp):
    summary = train(run_name="demo-identical")
    records = [
        json.loads(line) for line in (Path(summary["run_dir"]) / "usage.jsonl").read_text().splitlines()
    ]
    # A training rollout is one draw of its epoch (epoch and sample index); an evaluation rollout is not.
    rollouts = [(r["tags"]["skill_sha"], r["tags"]["item_id"], r["tags"]["training"], r["tags"].get("epoch"),
                 r["tags"]["sample"]) for r in records if r["stage"] == "rollout" and not r.get("cache_hit")]
    assert rollouts, "the demo made no rollouts"
    duplicates = [key for key, n in Counter(rollouts).items() if n > 1]
    assert duplicates == []


def test_same_seed_same_batches_and_history_with_caching_off(prefect_settings, in_tmp):
    def comparable(run_dir: Path) -> list[dict]:
        rows = history(run_dir)
        for row in rows:
            row.pop("wall_s", None)
            row.pop("usage", None)
        return rows

    first = train("run.refresh_cache=true", run_name="demo-seed-a")
    second = train("run.refresh_cache=true", run_name="demo-seed-b")
    assert comparable(Path(first["run_dir"])) == comparable(Path(second["run_dir"]))
    assert first["scores"] == second["scores"]


def test_gate_off_force_accepts_and_still_tracks_the_best(prefect_settings, in_tmp):
    summary = train("evaluation.use_gate=false", run_name="demo-gate-off")
    steps = [r for r in history(Path(summary["run_dir"])) if r["kind"] == "step" and r["gate"]]
    assert steps and {r["decision"] for r in steps} == {"force_accept"}
    # The best is the highest validated score: the baseline, every candidate, and the final skill
    # (the last skill is promoted when it beats the best).
    best_seen = max(
        [summary["scores"]["baseline"]["selection"]["hard"], summary["scores"]["final"]["selection"]["hard"]]
        + [r["gate"]["candidate_gate"] for r in steps]
    )
    assert summary["scores"]["best"]["selection"]["hard"] == pytest.approx(best_seen)


def test_skill_eval_scores_a_skill_file_like_training_did(prefect_settings, in_tmp):
    from skillopt.flows.evaluate import skill_eval

    summary = train(run_name="demo-for-eval")
    best = Path(summary["run_dir"]) / "best_skill.md"
    result = skill_eval(benchmark="demo", skill_file=str(best), split="test", run_name="demo-eval")
    assert result["hard"] == pytest.approx(summary["scores"]["best"]["test"]["hard"])
    assert result["n"] == 24
    assert (Path(result["run_dir"]) / "eval" / "test" / "scores.json").is_file()
