"""A real Prefect API for the flow tests: one `prefect server start` on loopback per test session.

Starting it takes ~10-20 s on a 2-core machine; every flow test shares it. Flows run in this
process point at it through `temporary_settings`; flows run in subprocesses get `PREFECT_API_URL`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``PREFECT_HOME`` of the session's server (its output is ``server.log`` there)."""
    return tmp_path_factory.mktemp("prefect-home")


@pytest.fixture(scope="session")
def prefect_api(prefect_home: Path) -> Iterator[str]:
    home = prefect_home
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    # PREFECT_UI_API_URL: the UI this server serves talks to this port (the browser tests open it).
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_UI_API_URL": url,
           # A request the API answers 503 (e.g. SQLite refused a write) is logged with its exception.
           "PREFECT_API_LOG_RETRYABLE_ERRORS": "true"}
    env.pop("PREFECT_API_URL", None)
    log = (home / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "skillopt.shell.prefect_server", "server", "start", "--host", "127.0.0.1",
         "--port",
         str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("prefect server did not start: "
                                   f"{(home / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture
def prefect_settings(prefect_api: str) -> Iterator[str]:
    """Flows called in this process talk to the session's server, quietly."""
    from prefect.settings import PREFECT_API_URL, PREFECT_LOGGING_LEVEL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_api, PREFECT_LOGGING_LEVEL: "WARNING"}):
        yield prefect_api


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run with the working directory in a fresh folder (runs/ and .skillopt/cache land there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def train_fixture(prefect_api: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Train a benchmark from its fixture as a user runs it, in a subprocess against the session's server:
    ``skillopt train NAME --data tests/fixtures/NAME --backend scripted -o train.epochs=1 [-o OVERRIDE]
    --run-name RUN_NAME`` in ``cwd`` (RUN_NAME defaults to NAME); the run lands in ``cwd/runs/RUN_NAME``."""

    def train(name: str, cwd: Path, *overrides: str, run_name: str | None = None
              ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": "WARNING"}
        options = [arg for override in ("train.epochs=1", *overrides) for arg in ("-o", override)]
        return subprocess.run(
            [sys.executable, "-m", "skillopt.shell.cli", "train", name, "--data", str(FIXTURES / name),
             "--backend", "scripted", *options, "--run-name", run_name or name],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
        )

    return train
