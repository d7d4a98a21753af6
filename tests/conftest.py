"""Shared fixtures: the loopback fake servers (tests/fakes) and a clean skillopt environment."""

from __future__ import annotations

import os

import pytest

# Tests that touch Prefect start its ephemeral API server, which logs "Stopping temporary server" at
# interpreter exit, after pytest has closed the captured streams. INFO chatter is not what tests check.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

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
