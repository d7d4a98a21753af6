"""``gradient.deep_probe`` under ``--backend scripted`` on a benchmark other than the demo: the run
finishes, the probe gets an instruction from the ``auto`` set, and the probed items are re-run with
it under ``## Training readout`` (it used to fail: the auto set could not answer the probe stage)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skillopt.llm.scripted import AUTO_PROBE_INSTRUCTION

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_deep_probe_runs_under_the_scripted_backend_on_livemath(prefect_api, tmp_path):
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": "WARNING"}
    trained = subprocess.run(
        [sys.executable, "-m", "skillopt.cli", "train", "livemathematicianbench", "--data",
         str(FIXTURES / "livemathematicianbench"), "--backend", "scripted", "-o", "train.epochs=1",
         "-o", "gradient.deep_probe=true", "--run-name", "probe"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    steps = [
        json.loads(line) for line in (tmp_path / "runs" / "probe" / "history.jsonl").read_text().splitlines()
    ]
    probes = [step["probe"] for step in steps if step.get("probe")]
    assert probes and probes[0]["instruction"] == AUTO_PROBE_INSTRUCTION and probes[0]["fallback"] is None
    assert probes[0]["item_ids"] == ["202601-1"]  # the one train item, re-run with the readout
