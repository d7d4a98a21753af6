"""Without a Prefect API and without a running local server, ``skillopt demo`` starts the local server in the
background, says so in one line with how to stop it, and the next command uses it; ``--ephemeral`` keeps the
temporary server of one run. The test's server lives in its own ``PREFECT_HOME`` and is stopped at the end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.e2e import skillopt_env
from tests.processes import alive

pytestmark = pytest.mark.slow


def test_demo_starts_the_background_server_once_and_the_next_command_uses_it(tmp_path):
    home = tmp_path / "prefect-home"
    env = skillopt_env(home)
    env.pop("SKILLOPT_PREFECT_SERVER", None)

    def skillopt(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "skillopt.shell.cli", *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, check=False)

    pid = None
    try:
        ephemeral = skillopt("demo", "--ephemeral", "--run-name", "throwaway")
        assert ephemeral.returncode == 0, ephemeral.stdout + ephemeral.stderr
        assert "temporary Prefect server" in ephemeral.stdout
        assert not (home / "skillopt-server.json").exists(), "--ephemeral leaves no server running"

        first = skillopt("demo", "--run-name", "first")
        assert first.returncode == 0, first.stdout + first.stderr
        said = [line for line in first.stdout.splitlines() if "in the background" in line]
        assert len(said) == 1 and "skillopt server stop" in said[0], first.stdout
        pid = json.loads((home / "skillopt-server.json").read_text())["pid"]
        assert alive(pid)

        second = skillopt("demo", "--run-name", "second")
        assert second.returncode == 0, second.stdout + second.stderr
        assert "in the background" not in second.stdout and "temporary Prefect server" not in second.stdout
        assert json.loads((home / "skillopt-server.json").read_text())["pid"] == pid, "the same server"
    finally:
        stopped = skillopt("server", "stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert pid is None or not alive(pid)


def test_serve_starts_the_local_server_watches_it_and_starts_no_temporary_server(tmp_path):
    """``skillopt serve`` with no PREFECT_API_URL and no server running starts the local server in the
    background, as ``train`` does, says so, and serves on it; its thread that announces picked-up runs must
    ask that server too (a thread of its own had lost the setting, so its client started Prefect's temporary
    server: a second server process on the same SQLite database, whose writes then failed with "database is
    locked")."""
    import os
    import signal
    import time

    home = tmp_path / "prefect-home"
    env = skillopt_env(home)
    env.pop("SKILLOPT_PREFECT_SERVER", None)
    env.pop("PREFECT_LOGGING_LEVEL", None)  # Prefect's INFO lines, the temporary server's among them

    def skillopt(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "skillopt.shell.cli", *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, check=False)

    log = tmp_path / "serve.log"
    serve = None
    try:
        with log.open("w") as out:
            serve = subprocess.Popen([sys.executable, "-m", "skillopt.shell.cli", "serve", "demo",
                                      "--no-schedule", "--mode", "train"], env=env, cwd=tmp_path, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)

        def wait_for(text: str, timeout_s: float = 180.0) -> None:
            deadline = time.monotonic() + timeout_s
            while text not in log.read_text() and time.monotonic() < deadline:
                assert serve.poll() is None, log.read_text()
                time.sleep(0.5)
            assert text in log.read_text(), log.read_text()

        wait_for("start a run:")
        said = [line for line in log.read_text().splitlines() if "in the background" in line]
        assert len(said) == 1 and "skillopt server stop" in said[0], log.read_text()
        assert alive(json.loads((home / "skillopt-server.json").read_text())["pid"])
        # The line to copy names the local server's API: the `prefect` command finds it no other way.
        line = next(line for line in log.read_text().splitlines() if "start a run:" in line)
        command = line.split("start a run:", 1)[1].split("(stop serving", 1)[0].strip()
        api = skillopt("server", "status", "--api-url").stdout.strip()
        assert command == f"PREFECT_API_URL={api} prefect deployment run skill-train/demo", line
        bin_dir = os.path.dirname(sys.executable)  # this environment's `prefect`, as an activated venv has it
        run = subprocess.run(f"{command} --param epochs=1", shell=True, cwd=tmp_path, capture_output=True,
                             text=True, timeout=300, check=False,
                             env={**env, "PATH": bin_dir + os.pathsep + env.get("PATH", "")})
        assert run.returncode == 0, run.stdout + run.stderr
        assert "Starting temporary server" not in run.stdout + run.stderr
        wait_for("follow its log:")  # the watcher saw the run on the local server
        assert "Starting temporary server" not in log.read_text()
    finally:
        if serve is not None and serve.poll() is None:
            os.killpg(serve.pid, signal.SIGINT)
            serve.wait(timeout=120)
        skillopt("server", "stop")
