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
