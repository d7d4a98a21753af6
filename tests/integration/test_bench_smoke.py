"""The benchmark script end to end at tiny sizes: `bench/run.py --smoke` trains the demo through the real
openai_compatible backend against the latency world, kills and resumes a run, soaks one in faults, and writes
its report. Only completion and the report's content are checked, never timings."""

from __future__ import annotations

import json

import pytest

from bench import run as bench

pytestmark = pytest.mark.slow


def test_smoke_run_completes_and_writes_the_report(prefect_api, tmp_path, capsys):
    out = tmp_path / "smoke.json"
    assert (
        bench.main(["--smoke", "--api", prefect_api, "--workdir", str(tmp_path / "work"), "--out", str(out)])
        == 0
    )

    results = json.loads(out.read_text())
    headline = results["headline"]["measured"]
    assert headline["returncode"] == 0
    assert headline["steps"], "no step was measured"
    step = headline["steps"][0]
    # Step 1's rollouts start together with the baseline, so they fall in the baseline's time window: count
    # the training rollouts over the whole run (one target call per batch item of the single step).
    assert headline["stages"]["rollout"]["calls"] == 4
    assert step["calls"]["analyst"]["calls"] >= 1
    assert headline["task_runs_by_name"]["rollout_item"] >= 4
    assert headline["world"]["rollout"]["answered"] >= 4
    summary = results["headline"]["summary"]
    assert summary["bound_s"] > 0 and summary["ratio"] is not None and summary["task_runs_per_step"] > 0

    resume = results["resume"]
    assert [t["killed_returncode"] for t in resume["trials"]] == [-9]
    assert resume["all_resumed"] and resume["repeated_total"] == 0

    verdict = results["soak"]["verdict"]
    assert verdict["completed"] and verdict["same_best_skill"] and verdict["same_scores"]
    assert verdict["lost_results"] == 0

    printed = capsys.readouterr().out
    assert "| actual / bound" in printed and "| fault soak at 20%" in printed and str(out) in printed
