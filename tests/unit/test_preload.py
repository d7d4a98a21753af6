"""The preloaded process of ``skillopt server start`` (``skillopt.shell.preload``), run as users run it: the
real
``python -m skillopt.shell.preload HOME`` process and the real ``skillopt`` command as its client, in separate
processes. No Prefect server is needed: the commands used here stop before a flow starts (a dry run, an
input error, an endpoint that never answers).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.e2e import skillopt_env
from skillopt.shell import preload
from tests.processes import alive


def _wait(predicate, timeout_s: float = 60.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A preloaded process for a temporary PREFECT_HOME, started as ``skillopt server start`` starts it."""
    home = tmp_path_factory.mktemp("home")
    env = skillopt_env(home)
    env.pop(preload.DISABLE_ENV, None)
    with socket.socket(socket.AF_UNIX) as dead:  # the socket file of a preloaded process that was killed
        dead.bind(str(preload.socket_path(home)))
    pid = preload.start_process(home, env)
    assert pid is not None, (home / preload.LOG).read_text()
    assert preload.recorded_process(home) == pid
    with socket.socket(socket.AF_UNIX) as probe:  # started means listening, not a leftover file
        probe.connect(str(preload.socket_path(home)))
    yield home, env
    assert preload.stop_process(home) == pid
    assert _wait(lambda: not alive(pid), 10)
    assert not preload.socket_path(home).exists()


def _log(home: Path) -> str:
    return (home / preload.LOG).read_text()


def _served_pids(home: Path) -> list[int]:
    return [int(pid) for pid in re.findall(r"started pid (\d+): skillopt", _log(home))]


def _skillopt(env: dict[str, str], cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skillopt.shell.cli", *argv], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_command_runs_in_the_preloaded_process_with_this_process_stdio_cwd_and_exit_code(served, tmp_path):
    home, env = served
    (tmp_path / "here").mkdir()
    before = len(_served_pids(home))
    (tmp_path / "here" / "mine.yaml").write_text("train:\n  epochs: 1\n")  # found from this folder only
    argv = ("train", "demo", "--dry-run", "--config", "mine.yaml")
    handed = _skillopt(env, tmp_path / "here", *argv)
    assert len(_served_pids(home)) == before + 1  # it ran there ...
    alone = _skillopt({**env, preload.DISABLE_ENV: "1"}, tmp_path / "here", *argv)
    assert len(_served_pids(home)) == before + 1  # ... and this one here
    assert handed.returncode == alone.returncode == 0
    assert handed.stdout == alone.stdout and "calls" in handed.stdout  # the same estimate, on this stdout

    # An input error: its message on this stderr, and its exit code.
    bad = _skillopt(env, tmp_path / "here", "train", "demo", "--data", "missing-folder")
    assert len(_served_pids(home)) == before + 2
    assert bad.returncode == 2
    assert bad.stderr == "error: --data: nothing at missing-folder\n"
    assert re.search(rf"pid {_served_pids(home)[-1]} ended: exit 2", _log(home))


def test_another_prefect_environment_runs_in_its_own_process(served, tmp_path):
    home, env = served
    before = len(_served_pids(home))
    result = _skillopt({**env, "PREFECT_LOGGING_LEVEL": "ERROR"}, tmp_path, "train", "demo", "--dry-run")
    assert result.returncode == 0 and "calls" in result.stdout
    assert len(_served_pids(home)) == before
    assert "refused a command: another PREFECT_* environment" in _log(home)
    assert result.stderr.startswith("note: this command's PREFECT_* variables differ from those `skillopt "
                                    "server start` had; it runs without the preloaded process"), result.stderr


def test_another_sys_path_runs_in_its_own_process_and_says_so(served, tmp_path):
    home, env = served
    before = len(_served_pids(home))
    (tmp_path / "extra").mkdir()
    other = {**env, "PYTHONPATH": os.pathsep.join([env["PYTHONPATH"], str(tmp_path / "extra")])}
    result = _skillopt(other, tmp_path, "train", "demo", "--dry-run")
    assert result.returncode == 0 and "calls" in result.stdout
    assert len(_served_pids(home)) == before
    assert "refused a command: another Python, sys.path or skillopt installation" in _log(home)
    (note,) = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert "another Python, sys.path or skillopt installation" in note
    assert "`skillopt server stop && skillopt server start`" in note


class _SilentEndpoint:
    """A TCP server that accepts connections and never answers: a command's endpoint check waits on it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def _start_hanging(env: dict[str, str], cwd: Path, endpoint: _SilentEndpoint) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "skillopt.shell.cli", "train", "demo", "--backend", "openai_compatible",
            "-o", f"model.target.base_url={endpoint.url}", "-o", f"model.optimizer.base_url={endpoint.url}",
            "-o", "model.target.model=m", "-o", "model.optimizer.model=m"]
    return subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_ctrl_c_reaches_the_run_and_a_killed_command_takes_its_run_with_it(served, tmp_path):
    home, env = served
    endpoint = _SilentEndpoint()
    try:
        # Ctrl-C: the command forwards SIGINT; the run stops as it would in this process (exit 130).
        before = len(_served_pids(home))
        command = _start_hanging(env, tmp_path, endpoint)
        assert _wait(lambda: len(_served_pids(home)) > before and len(endpoint.conns) > 0)
        child = _served_pids(home)[-1]
        command.send_signal(signal.SIGINT)
        _out, err = command.communicate(timeout=30)
        assert command.returncode == 130, err
        assert "interrupted" in err
        assert _wait(lambda: not alive(child), 10)

        # kill -9 of the command: its run ends too, at once.
        before = len(_served_pids(home))
        command = _start_hanging(env, tmp_path, endpoint)
        assert _wait(lambda: len(_served_pids(home)) > before)
        child = _served_pids(home)[-1]
        assert alive(child)
        os.killpg(command.pid, signal.SIGKILL)
        command.wait(timeout=10)
        assert _wait(lambda: not alive(child), 10)
        assert _wait(lambda: f"pid {child} ended: signal {int(signal.SIGKILL)}" in _log(home), 10)
    finally:
        endpoint.close()


def test_a_connection_that_sends_nothing_does_not_stop_the_server(served, tmp_path):
    home, env = served
    dropped = _log(home).count("dropped a connection")
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(preload.socket_path(home)))
    assert _wait(lambda: _log(home).count("dropped a connection") == dropped + 1, 10)
    before = len(_served_pids(home))
    result = _skillopt(env, tmp_path, "train", "demo", "--dry-run")
    assert result.returncode == 0 and "calls" in result.stdout
    assert len(_served_pids(home)) == before + 1


def test_commands_that_run_no_flow_are_not_handed_over():
    assert preload.command_of(["--version"]) is None
    assert preload.command_of(["train", "demo"]) == "train"
    assert preload.run_preloaded(["config", "show", "demo"], {"PREFECT_HOME": "/nonexistent"}) is None
    # with PREFECT_API_URL set the user chose their own API: a run stays in its own process
    assert preload.run_preloaded(["train", "demo"], {"PREFECT_API_URL": "http://x/api"}) is None


def test_the_record_names_a_live_preloaded_process_only(tmp_path):
    (tmp_path / preload.RECORD).write_text(json.dumps({"pid": os.getpid()}))
    # this process is not `python -m skillopt.shell.preload`
    assert preload.recorded_process(tmp_path) is None


def test_the_preloaded_process_holds_what_a_run_would_load_on_first_use():
    """What ``main`` loads before it forks any command: the run's lazily imported modules, every built-in
    backend and benchmark, the pydantic models Prefect and the SDK build on first use, and the SDKs' TLS
    context; and still no thread (a fork copies none)."""
    script = """
import importlib, json, sys, threading
from importlib.metadata import entry_points
from prefect.settings import temporary_settings
from skillopt.shell import preload
from skillopt.flows.run import command_line_defaults
from skillopt.llm import http_common
from skillopt.llm.base import builtin_backend_modules
with temporary_settings(set_defaults=command_line_defaults()):
    for module in preload.PRELOAD:
        importlib.import_module(module)
    preload._warm()
benchmarks = [e.module for e in entry_points(group="skillopt.benchmarks") if e.module.startswith("skillopt.")]
print(json.dumps({
    "threads": threading.active_count(),
    "deferred": [m.__qualname__ for m in preload._deferred_models(preload.DEFERRED_MODELS)],
    "missing": [m for m in [*builtin_backend_modules(), *benchmarks, "prefect.task_engine",
                            "prefect.flow_engine"] if m not in sys.modules],
    "benchmarks": len(benchmarks),
    "tls": http_common._tls_context.cache_info().currsize,
}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["threads"] == 1
    assert found["deferred"] == []
    assert found["missing"] == []
    assert found["benchmarks"] >= 11
    assert found["tls"] == 1, "the SDKs' TLS context is built"
