"""Shared fixtures: the loopback fake servers (tests/fakes) and a clean skillopt environment."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# The suite never uses the developer's Prefect home or API: a `skillopt server` left running there (the
# README's `skillopt demo` starts one) would be found by the commands under test, and `skillopt serve`
# would serve it instead of saying that no server is set. Set before Prefect is imported (it reads its
# settings then); subprocesses inherit it. The home's database is made once per session.
_PREFECT_HOME = tempfile.mkdtemp(prefix="skillopt-tests-prefect-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
for _name in ("PREFECT_API_URL", "PREFECT_PROFILES_PATH"):
    os.environ.pop(_name, None)
atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)

# Tests that touch Prefect start its ephemeral API server, which logs "Stopping temporary server" at
# interpreter exit, after pytest has closed the captured streams. INFO chatter is not what tests check.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# The first test that calls a flow in this process starts that temporary server and creates its database in
# the new home: it gets the start-up limit skillopt's own runs give theirs (flows/run.py imports no Prefect).
from skillopt.flows.run import TEMPORARY_SERVER_START_TIMEOUT_S  # noqa: E402

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                      str(TEMPORARY_SERVER_START_TIMEOUT_S))

pytest_plugins = ["tests.fakes.fixtures"]
# Repository snapshots inside fixtures (the SWE-bench fake harness runs their tests itself) are not ours to
# collect.
collect_ignore_glob = ["fixtures/*/repos/*"]


@pytest.fixture(autouse=True)
def _isolated_skillopt_environment(monkeypatch):
    """No test depends on the developer's own SKILLOPT_* settings or provider keys, and no command a test
    runs without a Prefect API leaves a background server behind: it uses a temporary one (a test of the
    background server unsets ``SKILLOPT_PREFECT_SERVER`` in its own ``PREFECT_HOME`` and stops it)."""
    for name in list(os.environ):
        if name.startswith("SKILLOPT_") or name.endswith("_API_KEY") or name in (
            "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "AZURE_OPENAI_ENDPOINT", "OPENAI_COMPATIBLE_BASE_URL",
        ):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SKILLOPT_PREFECT_SERVER", "temporary")
