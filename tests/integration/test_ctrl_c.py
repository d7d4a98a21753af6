"""Ctrl-C on a real `skillopt demo` with Prefect's temporary API server, as a terminal sends it.

A terminal's Ctrl-C goes to its whole foreground process group; the run must stop with exit 130,
one line and no traceback, the temporary server must not get the signal (it lives in its own
session), and re-running the same command resumes without repeating a finished model call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skillopt.shell.interrupt import INTERRUPTED_MESSAGE

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)  # the temporary server is the point here
    return env


def _demo(tmp_path: Path, run_name: str) -> list[str]:
    return [sys.executable, "-m", "skillopt.shell.cli", "demo", "--run-name", run_name,
            "-o", f"run.runs_dir={tmp_path / 'runs'}", "-o", f"run.cache_dir={tmp_path / 'cache'}"]


def _start_and_wait_for(command: list[str], env: dict[str, str], cwd: Path, marker: str,
                        ) -> tuple[subprocess.Popen[str], list[str]]:
    """Start ``command`` as the leader of a new process group (a terminal's foreground job) and read its
    stdout until a line contains ``marker``."""
    process = subprocess.Popen(command, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return process, lines
    process.kill()
    raise AssertionError(f"never saw {marker!r}; stdout: {''.join(lines)} stderr: {process.stderr.read()}")


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (the temporary server is started from a helper thread)."""
    return [
        int(child)
        for path in Path(f"/proc/{pid}/task").glob("*/children")
        for child in path.read_text().split()
    ]


def _usage_lines(run_dir: Path) -> int:
    """The model calls ``usage.jsonl`` records (its cache-hit lines stand for calls not made)."""
    path = run_dir / "usage.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(not json.loads(line)["cache_hit"] for line in lines if line.strip())


def test_ctrl_c_to_the_process_group_stops_the_demo_and_the_rerun_resumes(tmp_path: Path):
    env = _env(tmp_path / "prefect-home")
    process, _ = _start_and_wait_for(_demo(tmp_path, "ctrlc"), env, tmp_path, "step 2/")
    server = _children(process.pid)
    assert server, "the temporary API server should be a child of the run"
    assert all(os.getsid(pid) != os.getsid(process.pid) for pid in server), "server in the terminal's session"

    started = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
    out, err = process.communicate(timeout=60)
    print(f"exit {process.returncode} {time.monotonic() - started:.2f} s after SIGINT")
    assert process.returncode == 130
    assert err.strip().splitlines()[-1] == INTERRUPTED_MESSAGE
    assert "Traceback" not in out + err
    assert "Crash detected" not in err
    time.sleep(1)
    assert not any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
                   for pid in server), "the temporary server outlived the run"

    run_dir = tmp_path / "runs" / "ctrlc"
    before = _usage_lines(run_dir)
    assert before > 0 and not (run_dir / "summary.json").exists()

    resumed = subprocess.run(_demo(tmp_path, "ctrlc"), env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "calls served from cache" in resumed.stdout
    added = _usage_lines(run_dir) - before

    # The same demo from scratch (another cache) makes every call once: the resumed run made only those
    # the interrupted one had not finished (a call in flight at the interrupt may be made again).
    fresh = subprocess.run(_demo(tmp_path / "fresh", "fresh"), env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=600)
    assert fresh.returncode == 0, fresh.stderr
    total = _usage_lines(tmp_path / "fresh" / "runs" / "fresh")
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"interrupted run: {before} calls, resumed run: {added} calls, a run from scratch: {total} calls")
    assert 0 < added < total
    assert before + added <= total + 16  # at most one call per worker thread was in flight
    fresh_summary = json.loads((tmp_path / "fresh" / "runs" / "fresh" / "summary.json").read_text())
    assert summary["scores"] == fresh_summary["scores"]


def test_a_dead_api_server_stops_the_run_with_a_message(tmp_path: Path):
    env = _env(tmp_path / "prefect-home")
    process, _ = _start_and_wait_for(_demo(tmp_path, "dead"), env, tmp_path, "baseline")
    server = _children(process.pid)
    assert server
    started = time.monotonic()
    for pid in server:
        os.kill(pid, signal.SIGKILL)
    out, err = process.communicate(timeout=120)
    print(f"exit {process.returncode} {time.monotonic() - started:.2f} s after the server died")
    assert process.returncode == 1
    assert "temporary Prefect API server" in err and "re-run the same command to resume" in err
    assert "Traceback" not in out + err


def _signal_while_slow_calls_are_in_flight(tmp_path: Path, prefect_api: str, run_name: str, signum: int,
                                           ) -> tuple[subprocess.Popen[str], str]:
    """A demo run against a model whose every reply outlasts the 1.5 s grace, sent ``signum`` once six calls
    are in flight; returns the ended process and its stderr."""
    from tests.fakes.demo_world_http import DemoWorldServer, role_overrides

    world = DemoWorldServer(latency_s=4.0)
    with world.server:
        env = {**_env(tmp_path / "prefect-home"), "PREFECT_API_URL": prefect_api}
        options = [arg for o in role_overrides(world.server.openai_base_url) for arg in ("-o", o)]
        process, _ = _start_and_wait_for([*_demo(tmp_path, run_name), *options], env, tmp_path,
                                         "run directory")
        deadline = time.monotonic() + 60
        while len(world.server.requests) < 6 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        os.kill(process.pid, signum)
        _, err = process.communicate(timeout=60)
    return process, err


def test_ctrl_c_while_slow_calls_are_in_flight_leaves_the_flow_run_crashed_not_running(tmp_path: Path,
                                                                                       prefect_api: str):
    """Model calls longer than the first Ctrl-C's grace: the process exits before Prefect reports the flow
    run, which the server showed *Running* for good. The exit sets it *Crashed* with the interrupt's line."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # as `kill -INT` or a supervisor sends it
    process, err = _signal_while_slow_calls_are_in_flight(tmp_path, prefect_api, "slowc", signal.SIGINT)
    assert process.returncode == 130, err
    # the last line, although a reply arriving while the exit cleans up may warn (about its price) then
    assert err.strip().splitlines()[-1] == INTERRUPTED_MESSAGE, err
    with temporary_settings(updates={PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["slowc"])))
    assert run.state is not None and run.state.type.value == "CRASHED", run.state
    assert run.state.message == INTERRUPTED_MESSAGE, run.state.message


def test_sigterm_while_slow_calls_are_in_flight_exits_143_with_one_line(tmp_path: Path, prefect_api: str):
    """SIGTERM (``timeout``, a container stop) in the middle of a run on threads: exit 143 with the resume
    line only. The guard's handler runs before Prefect's, so Prefect's "Crash detected" ERROR lines of each
    run and task are not printed under it (they were, when the guard stood in front only on Dask)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    process, err = _signal_while_slow_calls_are_in_flight(tmp_path, prefect_api, "slowt", signal.SIGTERM)
    assert process.returncode == 143, err
    assert err.strip().splitlines()[-1] == INTERRUPTED_MESSAGE, err
    assert "Crash detected" not in err and "ERROR" not in err, err
    with temporary_settings(updates={PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["slowt"])))
    assert run.state is not None and run.state.type.value == "CRASHED", run.state
