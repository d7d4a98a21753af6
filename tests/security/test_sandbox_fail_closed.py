"""Without an OS sandbox, benchmarks that run model-written code stop before their first rollout.

"No sandbox" is simulated the way a host without bubblewrap looks: ``bwrap`` is not on PATH (the
probe is cached per PATH, so each test sees its own PATH). ``benchmark.sandbox: none`` is the only
way past, and it warns.
"""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path

import pytest

from skillopt.benchmarks.base import BenchmarkSetupError
from skillopt.benchmarks.spreadsheetbench import plugin as spreadsheetbench
from skillopt.benchmarks.swebench import plugin as swebench
from skillopt.sandbox.confine import SandboxUnavailable, run_sandboxed, sandbox_status
from skillopt.shell.cli import main
from tests.fakes.benchmark_target import fixture_config_of
from tests.security.test_sandbox_escapes import requires_sandbox


@pytest.fixture
def no_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    empty = tmp_path / "bin-without-bwrap"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return empty


def test_the_status_says_bubblewrap_is_missing(no_bwrap):
    status = sandbox_status()
    assert not status.available and status.bwrap is None
    assert "bubblewrap (bwrap) is not installed" in status.detail


def test_spreadsheetbench_stops_in_preflight_with_the_reason_and_both_fixes(no_bwrap):
    config = fixture_config_of(spreadsheetbench)
    with pytest.raises(BenchmarkSetupError) as caught:
        spreadsheetbench.preflight(config)
    message = str(caught.value)
    assert "spreadsheetbench runs model-written code and no OS sandbox can be made" in message
    assert "bubblewrap (bwrap) is not installed" in message
    assert "install bubblewrap" in message and "benchmark.sandbox: none" in message


def test_the_swebench_fake_harness_with_repositories_stops_too(no_bwrap):
    (no_bwrap / "git").symlink_to(shutil.which("git", path="/usr/bin:/bin:/usr/local/bin"))
    config = fixture_config_of(swebench, ["benchmark.harness=fake", "benchmark.agent_runner=fake"])
    assert (Path(config.data_root) / "repos").is_dir()  # the fixtures hold repository snapshots
    with pytest.raises(BenchmarkSetupError, match="swebench \\(fake harness\\) runs model-written code"):
        swebench.preflight(config)


def test_sandbox_none_runs_with_a_warning_every_time(no_bwrap, caplog, tmp_path):
    config = fixture_config_of(spreadsheetbench, ["benchmark.sandbox=none"])
    caplog.set_level(logging.WARNING, logger="skillopt.sandbox.confine")
    spreadsheetbench.preflight(config)
    spreadsheetbench.preflight(config)
    warnings = [r.getMessage() for r in caplog.records if "WITHOUT an OS sandbox" in r.getMessage()]
    assert len(warnings) == 2
    workspace = tmp_path / "ws"
    workspace.mkdir()
    result = run_sandboxed(["-c", "print('ran')"], workspace, 20, mode="none")
    assert result.ok and result.stdout.strip() == "ran" and result.isolation == "none"


def test_the_sandbox_api_refuses_instead_of_running_unconfined(no_bwrap, tmp_path):
    with pytest.raises(SandboxUnavailable, match="no OS sandbox can be made"):
        run_sandboxed(["-c", "print('ran')"], tmp_path, 20)


def test_skillopt_benchmarks_reports_the_sandbox_status(no_bwrap):
    out = io.StringIO()
    assert main(["benchmarks"], stdout=out, stderr=io.StringIO()) == 0
    line = next(x for x in out.getvalue().splitlines() if x.startswith("sandbox for model-written code"))
    assert "unavailable: bubblewrap (bwrap) is not installed" in line and "benchmark.sandbox: none" in line


@requires_sandbox
def test_skillopt_benchmarks_reports_a_working_sandbox():
    out = io.StringIO()
    assert main(["benchmarks"], stdout=out, stderr=io.StringIO()) == 0
    assert f"sandbox for model-written code (spreadsheetbench, swebench's fake harness): bubblewrap " \
           f"({sandbox_status().bwrap})" in out.getvalue()


def test_skillopt_backends_check_reports_the_sandbox_status(no_bwrap):
    out, err = io.StringIO(), io.StringIO()
    assert main(["backends", "check", "--backend", "scripted"], stdout=out, stderr=err) == 0, err.getvalue()
    line = next(x for x in out.getvalue().splitlines() if x.startswith("sandbox (model-written code"))
    assert "unavailable: bubblewrap (bwrap) is not installed" in line and "install bubblewrap" in line
