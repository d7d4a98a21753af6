"""A run on Prefect's temporary server (no ``PREFECT_API_URL``, no ``skillopt server start``) leaves every
task and flow run final in the server's database once the server has stopped, and the server recorded the
task runs in batches (``skillopt.shell.prefect_server.batched_task_run_recorder``)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import servers_stopped

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_a_run_on_the_temporary_server_leaves_only_final_runs_recorded_in_batches(tmp_path: Path):
    home = tmp_path / "prefect-home"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    run = subprocess.run([sys.executable, "-m", "skillopt.shell.cli", "demo", "--run-name", "recorded",
                          "-o", "train.epochs=1", "-o", f"run.runs_dir={tmp_path / 'runs'}",
                          "-o", f"run.cache_dir={tmp_path / 'cache'}"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "temporary Prefect server" in run.stdout + run.stderr

    # The run has exited; its server finishes its shutdown (and its last batch) on its own.
    assert servers_stopped(str(home), 60), "the temporary server outlived its run by a minute"

    with sqlite3.connect(home / "prefect.db") as db:
        flow_runs = dict(db.execute("select state_type, count(*) from flow_run group by 1").fetchall())
        task_runs = dict(db.execute("select state_type, count(*) from task_run group by 1").fetchall())
        total, stamps = db.execute("select count(*), count(distinct created) from task_run").fetchone()
    assert set(flow_runs) == {"COMPLETED"} and flow_runs["COMPLETED"] >= 2, flow_runs  # the run and its epoch
    assert set(task_runs) <= {"COMPLETED", "CACHED"} and total > 40, task_runs
    # One time per transaction that created task runs: one event per transaction would give one per task run.
    assert stamps <= total // 4, (stamps, total)
