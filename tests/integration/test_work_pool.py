"""`deployments/prefect.yaml` deployed with `prefect deploy` against a real server, run by a process worker.

In a module of its own so that no `skillopt serve` process (test_deployments.py) is still serving
skill-train/demo: a served deployment's runs go to the serving process, not to the work pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SMALL = ["train.epochs=1"]


def _prefect(*args: str, cwd: Path, env: dict[str, str]) -> str:
    """``prefect ARGS`` in ``cwd``; it must succeed. Returns its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def test_prefect_yaml_registers_the_work_pool_deployments(prefect_api: str, tmp_path: Path):
    """`prefect deploy` from deployments/ (as docs/self-hosting.md says) against the real server, then a
    process worker runs one of the deployments.

    Two of the thirteen deployments keep it short (they share one YAML anchor; the parse test checks
    every entry).
    """
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "SKILLOPT_WORKDIR": str(tmp_path)}
    folder = Path(__file__).resolve().parents[2] / "deployments"
    _prefect("work-pool", "create", "skillopt", "--type", "process", cwd=folder, env=env)
    _prefect("deploy", "--name", "demo", "--name", "qa", cwd=folder, env=env)

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("skill-train/qa")
    assert deployment.work_pool_name == "skillopt"
    assert deployment.entrypoint == "skillopt.flows.train.skill_train"
    assert deployment.parameters == {"benchmark": "qa", "mode": "nightly"}
    assert [(s.schedule.cron, s.schedule.timezone) for s in deployment.schedules] == [("0 3 * * *", "UTC")]
    assert deployment.global_concurrency_limit.limit == 1
    mode = deployment.parameter_openapi_schema["properties"]["mode"]
    assert mode["enum"] == ["train", "nightly"] and mode["description"]
    # SKILLOPT_WORKDIR is filled in at deploy time: the workers run flows in that (shared) folder.
    assert deployment.pull_steps == [{"prefect.deployments.steps.set_working_directory": {
        "directory": str(tmp_path)}}]

    # A process worker picks up a run of the demo deployment and runs it in SKILLOPT_WORKDIR.
    _prefect("deployment", "run", "skill-train/demo", "--params", json.dumps({"overrides": SMALL}),
             cwd=tmp_path, env=env)
    _prefect("worker", "start", "--pool", "skillopt", "--run-once", cwd=tmp_path, env=env)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "best_skill.md").is_file() and (run_dir / "promotion.json").is_file()
    assert (tmp_path / "skills" / "demo" / "history.jsonl").is_file()
