"""``gradient.deep_probe`` under ``--backend scripted`` on a benchmark other than the demo: the run
finishes, the probe gets an instruction from the ``auto`` set, and the probed items are re-run with
it under ``## Training readout`` (it used to fail: the auto set could not answer the probe stage)."""

from __future__ import annotations

import json

import pytest

from skillopt.llm.scripted import AUTO_PROBE_INSTRUCTION

pytestmark = pytest.mark.slow


def test_deep_probe_runs_under_the_scripted_backend_on_livemath(train_fixture, tmp_path):
    trained = train_fixture("livemathematicianbench", tmp_path, "gradient.deep_probe=true", run_name="probe")
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    steps = [
        json.loads(line) for line in (tmp_path / "runs" / "probe" / "history.jsonl").read_text().splitlines()
    ]
    probes = [step["probe"] for step in steps if step.get("probe")]
    assert probes and probes[0]["instruction"] == AUTO_PROBE_INSTRUCTION and probes[0]["fallback"] is None
    assert probes[0]["item_ids"] == ["202601-1"]  # the one train item, re-run with the readout
