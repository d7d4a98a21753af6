"""`skillopt server start|stop|status` against a real `prefect server start`, and a run that uses it.

The test starts and stops its own server (in a temporary PREFECT_HOME, on a free port). After the
run exits normally, every task and flow run it created must be in a final state in the server's
database: the run drains Prefect's event queue before it exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from bench.e2e import skillopt_env
from bench.run import api_post, free_port
from tests.processes import alive

pytestmark = pytest.mark.slow

NOT_FINAL = ["SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"]


def _count(api: str, kind: str, states: list[str] | None = None) -> int:
    body = {kind: {"state": {"type": {"any_": states}}}} if states else {}
    return int(api_post(api, f"/{kind}/count", body))


def test_server_start_status_a_run_that_uses_it_and_stop(tmp_path):
    home = tmp_path / "prefect-home"
    port = free_port()
    env = skillopt_env(home)  # a user's: no PREFECT_API_URL, and no Prefect logging level of their own
    env.pop("PREFECT_LOGGING_LEVEL", None)

    def skillopt(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "skillopt.shell.cli", *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=timeout, check=False)

    assert skillopt("server", "status").returncode == 1
    started = skillopt("server", "start", "--port", str(port))
    pid = preloaded = None
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        pid = json.loads((home / "skillopt-server.json").read_text())["pid"]
        ui, api = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api"
        assert f"UI:  {ui}" in started.stdout
        # its own session: the terminal's Ctrl-C never reaches it
        assert os.getsid(pid) == pid != os.getsid(0)
        with urllib.request.urlopen(f"{ui}/ui-settings", timeout=10) as response:
            assert json.loads(response.read())["api_url"] == api  # the UI finds its API on this port
        assert (home / "prefect.db").exists()  # Prefect's own database under PREFECT_HOME

        # and the preloaded process that runs train/demo/eval without their start-up imports
        preloaded = json.loads((home / "skillopt-runner.json").read_text())["pid"]
        assert f"start in a preloaded process (pid {preloaded})" in started.stdout
        assert os.getsid(preloaded) == preloaded != os.getsid(0)

        status = skillopt("server", "status")
        assert status.returncode == 0 and f"running: UI {ui}" in status.stdout
        assert f"preloaded process (pid {preloaded})" in status.stdout
        again = skillopt("server", "start")
        assert again.returncode == 0 and f"already running: Prefect server (pid {pid})" in again.stdout
        elsewhere = skillopt("server", "start", "--port", "1")  # a running server is not moved: said so
        assert elsewhere.returncode == 0 and "--port 1 not used: this server already runs" in elsewhere.stdout

        run = skillopt("demo", "--run-name", "via-local-server", "-o", "train.epochs=1")
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert f"Prefect: the local server at {ui}" in run.stdout
        assert "temporary Prefect server" not in run.stdout + run.stderr
        runner_log = (home / "skillopt-runner.log").read_text()
        assert "started pid" in runner_log and "skillopt demo" in runner_log, runner_log  # ran preloaded
        assert runner_log.rstrip().endswith("ended: exit 0"), runner_log
        # with the output of a run in its own process: Prefect's INFO lines stay quiet (its logging is set up
        # under the command's Prefect defaults there too)
        assert "| INFO    |" not in run.stdout + run.stderr
        assert _count(api, "flow_runs") >= 2 and _count(api, "task_runs") > 0
        # The server records task runs from the run's events, seconds behind on a busy machine: a task run's
        # row may not exist yet while the rows that do are all final. Settled = nothing non-final and no new
        # row for 8 s; a state event lost at exit never arrives, and its task run stays non-final.
        deadline = time.monotonic() + 90
        seen, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            total = _count(api, "task_runs")
            if total != seen:
                seen, quiet_since = total, time.monotonic()
            unsettled = _count(api, "task_runs", NOT_FINAL) + _count(api, "flow_runs", NOT_FINAL)
            if not unsettled and time.monotonic() - quiet_since >= 8.0:
                break
            time.sleep(0.5)
        assert _count(api, "task_runs", NOT_FINAL) == 0
        assert _count(api, "flow_runs", NOT_FINAL) == 0
    finally:
        stopped = skillopt("server", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert pid is not None and f"(pid {pid})" in stopped.stdout
    assert not alive(pid)
    assert not alive(preloaded) and not (home / "skillopt-runner.sock").exists()
    assert skillopt("server", "status").returncode == 1
    assert "no local Prefect server was running" in skillopt("server", "stop").stdout
