"""The agentic benchmarks train end to end from their fixtures with the scripted backend, as a user
runs them: ``skillopt train alfworld|swebench --data tests/fixtures/<id> --backend scripted``. Under
``scripted`` the fake environment (ALFWorld) and the fake agent runner and harness (SWE-bench) are
picked automatically and the run header says so."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("name", "solved_item"), [("alfworld", "train-0000"), ("swebench", "acme__widgets-101")]
)
def test_the_fixture_trains_with_the_scripted_backend_and_the_fakes(name, solved_item, train_fixture,
                                                                   tmp_path):
    limit = "benchmark.max_steps=5" if name == "alfworld" else "benchmark.step_limit=5"
    run = train_fixture(name, tmp_path, limit)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"{name}: the environment is simulated" in run.stdout

    folder = tmp_path / "runs" / name
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["benchmark"] == name
    assert summary["scores"]["baseline"]["selection"]["hard"] == 0.0  # the lamp game / the partial repr fix
    assert summary["scores"]["baseline"]["test"]["hard"] == 0.0  # no action tag / no diff
    trained = [json.loads(line) for path in sorted(folder.glob("steps/*/trajectories.jsonl"))
               for line in path.read_text().splitlines()]
    assert trained and {(row["id"], row["hard"]) for row in trained} == {(solved_item, 1.0)}
    assert trained[0]["trajectory"][-1]["type"] == "evaluation"
    usage = [json.loads(line) for line in (folder / "usage.jsonl").read_text().splitlines()]
    assert {(record["role"], record["stage"]) for record in usage if record["role"] == "target"} == \
        {("target", "rollout")}
