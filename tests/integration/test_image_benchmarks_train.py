"""The image benchmarks train end to end from their fixtures with the scripted backend, as a user runs
them: ``skillopt train docvqa|babyvision|mathverse|mmrb --data tests/fixtures/<id> --backend scripted``.
The judge benchmarks account their verdicts under the stage ``judge``; no run file holds image bytes."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["docvqa", "babyvision", "mathverse", "mmrb"])
def test_the_fixture_trains_with_the_scripted_backend(name, train_fixture, tmp_path):
    run = train_fixture(name, tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]

    folder = tmp_path / "runs" / name
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["benchmark"] == name
    usage = [json.loads(line) for line in (folder / "usage.jsonl").read_text().splitlines()]
    judged = {(r["role"], r["stage"]) for r in usage if r["role"] == "judge"}
    assert judged == ({("judge", "judge")} if name in ("babyvision", "mathverse") else set())
    rows = [
        json.loads(line) for path in folder.rglob("results.jsonl") for line in path.read_text().splitlines()
    ]
    rows += [
        json.loads(line)
        for path in folder.rglob("trajectories.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert rows and any(row["hard"] == 1.0 for row in rows) and any(row["hard"] == 0.0 for row in rows)
    events = [event for path in folder.rglob("trajectory.json") for event in json.loads(path.read_text())]
    events += [event for row in rows for event in row.get("trajectory", [])]
    prompts = [event["content"] for event in events if event["type"] == "message" and event["role"] == "user"]
    assert prompts and all("[image] " in text for text in prompts)
    assert not any(
        "base64," in path.read_text(errors="ignore") for path in folder.rglob("*") if path.is_file()
    )
