"""A planted secret reaches the provider and nothing a run writes: every file, and the Prefect database.

``skillopt eval qa`` runs in a subprocess with a fresh ``PREFECT_HOME`` (so its temporary Prefect server
keeps its SQLite database there) against the loopback OpenAI-compatible fake. The secrets come in the
ways that are allowed: the target's key in a variable of the user's choosing named by
``model.target.api_key_env``, the conventional key variables, and other credential-named variables.
Afterwards the fake must have received the target's key, and no byte of any secret may be in any file
below the working directory (run directory, cache) or ``PREFECT_HOME`` (the database included), nor in
what the CLI printed.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_benchmarks_over_http import scripted_reply_server
from tests.processes import servers_stopped

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SECRETS = {
    "MY_TARGET_KEY": "tk-SENTINEL-9d2e-target-key-0001",
    "OPENAI_API_KEY": "sk-SENTINEL-9d2e-openai-0002",
    "ANTHROPIC_API_KEY": "sk-ant-SENTINEL-9d2e-anthropic-0003",
    "OPENAI_COMPATIBLE_API_KEY": "SENTINEL-9d2e-compat-0004",
    "MY_SERVICE_PASSWORD": "SENTINEL-9d2e-password-0005",
}


@pytest.mark.slow
def test_no_planted_secret_in_any_file_a_run_writes_or_in_the_prefect_database(tmp_path, openai_server):
    from skillopt.benchmarks.base import load_benchmark

    scripted_reply_server(openai_server, load_benchmark("qa"))
    work, prefect_home = tmp_path / "work", tmp_path / "prefect-home"
    work.mkdir()
    prefect_home.mkdir()
    (work / "skill.md").write_text("Answer with the short answer only.\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLOPT_", "PREFECT_"))}
    env.update(SECRETS, PREFECT_HOME=str(prefect_home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    command = [
        sys.executable, "-m", "skillopt.shell.cli", "eval", "qa", "--skill", "skill.md",
        "--data", str(FIXTURES / "qa"), "--run-name", "sentinel",
        "-o", "model.target.backend=openai_compatible",
        "-o", f"model.target.base_url={openai_server.openai_base_url}",
        "-o", "model.target.model=fixture-model",
        "-o", "model.target.api_key_env=MY_TARGET_KEY", "-o", "model.optimizer.backend=scripted",
        "-o", "model.judge.backend=scripted",
    ]
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    # With no Prefect API configured the run started the local server in the background, as for any user;
    # stopped, it writes what it still holds (its last batch of events) before the database is scanned.
    stop = subprocess.run([sys.executable, "-m", "skillopt.shell.cli", "server", "stop"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert servers_stopped(str(prefect_home), 60), "the local server outlived its stop by a minute"

    received = [r.headers.get("authorization", "") for r in openai_server.requests]
    assert received and all(h == f"Bearer {SECRETS['MY_TARGET_KEY']}" for h in received)  # the key was used

    files = [p for root in (work, prefect_home) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and any(p.suffix == ".db" for p in files)
    for name, value in SECRETS.items():
        assert value not in proc.stdout + proc.stderr, f"{name} printed"
        for path in files:
            assert value.encode() not in path.read_bytes(), f"{name} written to {path}"
    # The database read through SQLite as well (text in a WAL or compressed page would escape a byte scan).
    for database in (p for p in files if p.suffix == ".db"):
        with sqlite3.connect(database) as db:
            tables = [row[0] for row in db.execute("select name from sqlite_master where type='table'")]
            assert "flow_run" in tables
            for table in tables:
                for row in db.execute(f'select * from "{table}"'):
                    text = " ".join(str(cell) for cell in row)
                    for name, value in SECRETS.items():
                        assert value not in text, f"{name} in the Prefect table {table}"
