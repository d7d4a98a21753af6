"""Every optimizer mode end to end on the offline demo world, each showing its own behaviour in
history.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def train(*overrides: str, run_name: str) -> tuple[dict, list[dict], Path]:
    from skillopt.flows.train import skill_train

    summary = skill_train(benchmark="demo", overrides=list(overrides), run_name=run_name)
    run_dir = Path(summary["run_dir"])
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    return summary, history, run_dir


def improved(summary: dict) -> bool:
    return summary["scores"]["best"]["test"]["hard"] > summary["scores"]["baseline"]["test"]["hard"]


def test_rewrite_from_suggestions_records_the_rewrite_and_its_change_summary(prefect_settings, in_tmp):
    summary, history, _ = train("optimizer.skill_update_mode=rewrite_from_suggestions", run_name="m-suggest")
    rewrites = [r for r in history if r["kind"] == "step" and r["change_summary"]]
    assert rewrites, "no step recorded a rewrite"
    assert all(r["edits"] == [] for r in rewrites)  # suggestions, not edits
    assert improved(summary)


def test_full_rewrite_minibatch_restores_dropped_protected_blocks_and_reports_it(prefect_settings, in_tmp):
    summary, history, run_dir = train("optimizer.skill_update_mode=full_rewrite_minibatch", run_name="m-full")
    steps = [r for r in history if r["kind"] == "step"]
    assert any(r["protected_restored"] for r in steps), "no rewrite dropped a protected block"
    assert any("protected block" in w for r in steps for w in r["warnings"])
    for snapshot in sorted((run_dir / "skills").glob("step_*.md"))[1:]:
        assert "<!-- SLOW_UPDATE_START -->" in snapshot.read_text(), snapshot.name
    assert improved(summary)


def test_autonomous_budget_records_each_decision_with_its_reasoning(prefect_settings, in_tmp):
    summary, history, _ = train("optimizer.lr_control_mode=autonomous", run_name="m-auto")
    decisions = [r["budget_decision"] for r in history if r["kind"] == "step" and r["budget_decision"]]
    assert decisions
    for decision in decisions:
        assert decision["reasoning"] and decision["confidence"] in ("low", "medium", "high")
        assert 0 <= decision["learning_rate"] <= decision["available"]
    assert [r["budget"] for r in history if r["budget_decision"]] == [d["learning_rate"] for d in decisions]
    assert improved(summary)


def test_deep_probe_reruns_items_with_a_readout_and_reflects_on_them(prefect_settings, in_tmp):
    summary, history, run_dir = train("gradient.deep_probe=true", run_name="m-probe")
    probes = [r["probe"] for r in history if r["kind"] == "step" and r["probe"]]
    assert probes and probes[0]["instruction"] and probes[0]["item_ids"]
    records = [json.loads(x) for x in (run_dir / "usage.jsonl").read_text().splitlines()]
    assert any(r["stage"] == "deep_probe" for r in records)
    readouts = [r for r in records if r["stage"] == "rollout" and r["tags"].get("training")]
    assert readouts
    # The diagnostic re-runs are reflected on as extra minibatches: more patches than the batch alone gives.
    size = 8  # gradient.minibatch_size
    probed = [r for r in history if r["kind"] == "step" and r["probe"] and r["probe"]["item_ids"]]
    assert any(r["patches_proposed"] > -(-r["n_fail"] // size) + -(-(r["n_total"] - r["n_fail"]) // size)
               for r in probed)
    assert improved(summary)


def test_execution_notes_reach_the_appendix_of_the_final_skill(prefect_settings, in_tmp):
    summary, history, run_dir = train("optimizer.use_appendix=true", run_name="m-appendix")
    steps = [r for r in history if r["kind"] == "step"]
    noted = [r for r in steps if r["appendix_notes"]]
    assert noted, "no execution notes reached the appendix"
    final = (run_dir / "skills" / f"step_{steps[-1]['step']:04d}.md").read_text()
    assert "<!-- APPENDIX_START -->" in final and noted[0]["appendix_notes"][0] in final
    assert improved(summary)


def test_accumulation_paired_gate_and_changed_pairs_in_one_run(prefect_settings, in_tmp):
    summary, history, run_dir = train("train.accumulation=2", "evaluation.gate_test=paired",
                                      "optimizer.longitudinal_pair_policy=changed", run_name="m-combo")
    steps = [r for r in history if r["kind"] == "step"]
    assert all(len(r["batch_ids"]) == 16 for r in steps)  # two batches of 8 feed each update
    gated = [r for r in steps if r["gate"]]
    assert gated and all(r["gate"]["method"] in ("sign", "bootstrap") and r["gate"]["p_value"] is not None
                         for r in gated)
    assert all("improved" in r["gate"]["flips"] and "regressed" in r["gate"]["flips"] for r in gated)
    pairs = json.loads((run_dir / "epochs" / "02" / "pairs.json").read_text())
    assert pairs["persistent_fail"] == [] and pairs["stable_success"] == []
    assert improved(summary)
