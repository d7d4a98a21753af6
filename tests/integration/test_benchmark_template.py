"""The benchmark template in docs/ is a working plug-in: copy it, register it like an installed
package (a dist-info folder with an entry point), list it and train on it with the scripted backend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TEMPLATE = Path(__file__).resolve().parents[2] / "docs" / "benchmark-template"


def test_the_template_is_registered_listed_and_trained_on(prefect_api, tmp_path):
    site = tmp_path / "site"
    shutil.copytree(TEMPLATE / "skillopt_mybench", site / "skillopt_mybench")
    dist_info = site / "skillopt_mybench-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: skillopt-mybench\nVersion: 0.1.0\n")
    (dist_info / "entry_points.txt").write_text('[skillopt.benchmarks]\nmybench = skillopt_mybench:plugin\n')
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "PREFECT_API_URL": prefect_api,
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }

    listed = subprocess.run([sys.executable, "-m", "skillopt.shell.cli", "benchmarks"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert any(
        line.startswith("mybench ") and "unavailable" not in line for line in listed.stdout.splitlines()
    )

    trained = subprocess.run(
        [sys.executable, "-m", "skillopt.shell.cli", "train", "mybench", "--data", str(TEMPLATE / "fixtures"),
         "--backend", "scripted", "-o", "train.epochs=1", "--run-name", "template"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    summary = json.loads((work / "runs" / "template" / "summary.json").read_text())
    assert summary["benchmark"] == "mybench"
    assert summary["scores"]["baseline"]["test"]["hard"] == pytest.approx(0.5)  # Rome solved, Cairo missed
