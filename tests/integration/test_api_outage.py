"""A run whose Prefect API server dies mid-run and comes back: the run keeps its reply store and run
directory, retries the API with a bound, and finishes (the server then shows the flow run Completed) or stops
with one line, and the same command finishes it. No flow run is left Running.

The server is a real Prefect server on a fixed loopback port with its own database (killed with SIGKILL and
started again on the same port and database); the run is the real command (spreadsheetbench, the scripted
target) against it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "spreadsheetbench"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(home: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_LOGGING_LEVEL": "WARNING"}
    env.pop("PREFECT_API_URL", None)
    server = subprocess.Popen([sys.executable, "-m", "skillopt.shell.prefect_server", "server", "start",
                               "--host",
                               "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, "the Prefect server did not start"
        time.sleep(0.5)


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=30)


def flow_runs(port: int) -> list[tuple[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/flow_runs/filter", method="POST",
                                     data=json.dumps({"limit": 50}).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return [(run["name"], run["state_type"]) for run in json.load(response)]


def killed_runs_temp(tmp_path: Path) -> str:
    """A temporary folder for the runs a test kills: a process killed with SIGKILL cannot remove its
    scratch folders (a rollout's sandbox, a spreadsheet copy): they stay under the test's own folder, not
    in /tmp."""
    folder = tmp_path / "tmp"
    folder.mkdir(exist_ok=True)
    return str(folder)


def train_command(run_name: str) -> list[str]:
    """Three epochs of one-item steps on the spreadsheetbench fixtures, offline: long enough to cut short."""
    return [sys.executable, "-m", "skillopt.shell.cli", "train", "spreadsheetbench", "--data", str(FIXTURES),
            "--backend", "scripted", "--run-name", run_name, "-o", "train.epochs=3",
            "-o", "train.batch_size=1"]


def test_a_run_outlives_its_api_server_dying_and_coming_back_or_stops_resumably(tmp_path):
    home, port = tmp_path / "prefect-home", free_port()
    server = start_server(home, port)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "TMPDIR": killed_runs_temp(tmp_path),
           "PREFECT_LOGGING_LEVEL": "WARNING"}
    command = train_command("outage")

    def start() -> subprocess.Popen:
        return subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

    run = start()
    try:
        # The server dies once the run has trained a little, and comes back 30 s later.
        deadline = time.monotonic() + 600
        while not list((tmp_path / "runs" / "outage").glob("steps/*")):
            assert run.poll() is None, run.communicate()[0][-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        stop(server)
        time.sleep(30)
        server = start_server(home, port)
        output, _ = run.communicate(timeout=900)
        assert "EventsWorker" not in output and "Traceback" not in output, output[-4000:]
        assert output.count("note: the Prefect API does not answer") <= 1, output[-4000:]
        if run.returncode != 0:
            # Prefect fails a request at once on a connection that never reached the server: the run then
            # stops with one line, and the same command resumes it.
            assert run.returncode == 1, output[-4000:]
            errors = [line for line in output.splitlines() if line.startswith("error:")]
            assert errors == [f"error: the Prefect API at http://127.0.0.1:{port}/api stopped answering and "
                              "did not come back: re-run the same command to resume once it is up"], output
            run = start()
            output, _ = run.communicate(timeout=900)
            assert run.returncode == 0, output[-4000:]
        assert "run outage finished" in output
        assert (tmp_path / "runs" / "outage" / "summary.json").exists()
        states = flow_runs(port)
        assert ("outage", "COMPLETED") in states
        assert not [name for name, state in states if state in ("RUNNING", "PENDING")], states
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
        stop(server)


def test_the_run_that_resumes_a_killed_run_settles_its_flow_run_left_running(tmp_path):
    """A process killed mid-run cannot report its end: its flow run (and its epoch's) stays Running on the
    server, holding whatever it held there, until the run that resumes the directory sets it Crashed."""
    home, port = tmp_path / "prefect-home", free_port()
    server = start_server(home, port)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_LOGGING_LEVEL": "WARNING", "TMPDIR": killed_runs_temp(tmp_path)}
    command = train_command("killed")
    run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not list((tmp_path / "runs" / "killed").glob("steps/*")):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0][-3000:]
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        # The kill leaves the flow run Running, with its epoch's sub-flow Running, or just created (Pending).
        # The server still commits what the process sent before it died (a sub-flow created, an epoch set
        # Completed), so the runs left unfinished are read once two looks a second apart agree.
        left = settled_unfinished_runs(port)
        assert ("killed", "RUNNING") in left.values(), left
        run = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
        output, _ = run.communicate(timeout=900)
        assert run.returncode == 0, output[-4000:]
        after = {run["id"]: (run["name"], run["state_type"])
                 for run in api_json(port, "/flow_runs/filter", {"limit": 50})}
        # every run the kill left unfinished is Crashed now (by id), and the resume said so
        assert all(after[run_id][1] == "CRASHED" for run_id in left), (left, after)
        assert "was still marked running: set Crashed (" in output, output[-3000:]
        assert not [name for name, state in after.values() if state in ("RUNNING", "PENDING")], after
        assert ("killed", "COMPLETED") in after.values()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
        stop(server)


def settled_unfinished_runs(port: int) -> dict[str, tuple[str, str]]:
    """The Running and Pending flow runs, by id, once the server has committed what it was sent."""
    def unfinished() -> dict[str, tuple[str, str]]:
        return {run["id"]: (run["name"], run["state_type"])
                for run in api_json(port, "/flow_runs/filter", {"limit": 50})
                if run["state_type"] in ("RUNNING", "PENDING")}

    looks = [unfinished()]
    for _ in range(30):
        time.sleep(1)
        looks.append(unfinished())
        if looks[-1] == looks[-2]:
            return looks[-1]
    raise AssertionError(f"the server's flow runs did not settle after the kill: {looks[-2:]}")


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, from ``/proc``."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in map(int, children.read_text().split()):
            found += [child, *descendants(child)]
    return found


def api_json(port: int, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api{path}",
                                     method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def test_a_deployment_slot_held_by_a_run_that_died_with_its_server_comes_back_when_serve_starts(tmp_path):
    """The machine goes down mid-run: the Prefect server, `skillopt serve` and its flow run all die at once.
    After the restart the server still counts the dead run's slot (one run per deployment at a time), so the
    next run of that deployment would wait for it; the next `skillopt serve` finds the dead run through its
    unlocked run directory and sets it Crashed, and the next run starts. A restart of the server alone under
    that run leaves no slot taken either."""
    home, port = tmp_path / "prefect-home", free_port()
    server = start_server(home, port)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "TMPDIR": killed_runs_temp(tmp_path)}
    log = tmp_path / "serve.log"

    def serve() -> subprocess.Popen:
        with log.open("a") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "skillopt.shell.cli", "serve", "spreadsheetbench", "--data",
                 str(FIXTURES), "--backend", "scripted", "--no-schedule", "-o", "train.epochs=3", "-o",
                 "train.batch_size=1"],
                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def state(flow_run_id: str) -> dict:
        return api_json(port, f"/flow_runs/{flow_run_id}")["state"]

    def wait(condition, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"{what}; serve log:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)

    serving = serve()
    try:
        deployment: dict = {}

        def registered() -> bool:
            try:
                deployment.update(api_json(port, "/deployments/name/skill-train/spreadsheetbench"))
            except OSError:
                return False
            return True

        wait(registered, "serve did not register its deployment")

        def trigger() -> str:
            created = api_json(port, f"/deployments/{deployment['id']}/create_flow_run", {"parameters": {}})
            return created["id"]

        first = trigger()
        wait(lambda: list(tmp_path.glob("runs/*/flow_run.json")), "the first run did not start")
        assert list((home / "concurrency_leases").glob("*.json")), "the run's lease is not kept on disk"
        for pid in descendants(serving.pid):
            os.kill(pid, signal.SIGKILL)
        os.killpg(serving.pid, signal.SIGKILL)
        serving.wait()
        stop(server)
        server = start_server(home, port)
        assert state(first)["type"] == "RUNNING"
        limit = api_json(port, f"/deployments/{deployment['id']}")["global_concurrency_limit"]
        assert limit["active_slots"] == 1, limit

        serving = serve()
        wait(lambda: "by a process that is gone" in log.read_text(), "serve did not settle the dead run")
        assert "keeps concurrency leases in memory" not in log.read_text()  # skillopt's server: on disk
        assert state(first)["type"] == "CRASHED"
        second = trigger()
        wait(lambda: state(second)["type"] in ("RUNNING", "COMPLETED"),
             "the next run of the deployment did not start")
        # Now only the server restarts under a live run: the run finishes (or stops, resumably), and either
        # way its slot is given back.
        stop(server)
        time.sleep(10)
        server = start_server(home, port)
        final = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
        wait(lambda: state(second)["type"] in final, "the run did not end after the restart", timeout=600)
        wait(lambda: api_json(port, f"/deployments/{deployment['id']}")["global_concurrency_limit"][
            "active_slots"] == 0, "the deployment's slot stayed taken", timeout=60)
    finally:
        if serving.poll() is None:
            os.killpg(serving.pid, signal.SIGTERM)
            try:
                serving.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(serving.pid, signal.SIGKILL)
        stop(server)
