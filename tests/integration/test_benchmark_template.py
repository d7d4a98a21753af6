"""The benchmark template in docs/ is a working plug-in: copy it, build it into a wheel with its own
pyproject.toml and install that (its prompt files must travel as package data), list it and train on it
with the scripted backend."""

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


def pip(arguments: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *arguments],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_template_is_registered_listed_and_trained_on(prefect_api, tmp_path):
    package, wheels, site = tmp_path / "mybench", tmp_path / "wheels", tmp_path / "site"
    shutil.copytree(TEMPLATE, package)
    # Offline: the environment's own hatchling builds it, and skillopt is already installed.
    pip(["wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(package)])
    pip(["install", "--no-deps", "--target", str(site), *map(str, wheels.glob("*.whl"))])
    assert sorted(p.name for p in (site / "skillopt_mybench" / "prompts").iterdir()) == [
        "analyst_error.md", "analyst_success.md", "initial_skill.md"]
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
    # The models the run called, as --backend chose them (no config names one: openai by default).
    assert {summary["config"]["model"][role]["backend"] for role in ("target", "optimizer")} == {"scripted"}
    assert summary["scores"]["baseline"]["test"]["hard"] == pytest.approx(0.5)  # Rome solved, Cairo missed
