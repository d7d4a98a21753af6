"""The exec targets' CLIs run under bubblewrap: a hostile tool call inside sees no file of the host but
the system, the CLI's installation, its workspace and its private home; no secret of the parent; and
nothing it starts outlives the run. Without bubblewrap the backend stops at preflight.

The fake ``codex`` (tests/fakes/bin) plays the CLI with its ``jail_report`` scenario: it tries to read
and write the paths ``task.md`` names, reads pid 1's environment, starts a ``setsid`` daemon, and
answers with what happened.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from skillopt.core.errors import ConfigError
from skillopt.llm import codex_exec
from skillopt.llm.exec_harness import ExecTask, installation_paths
from tests.llm.test_exec_backends import fake_cli, make_backend  # noqa: F401 - fake_cli is a fixture
from tests.security.test_sandbox_escapes import live_in_namespace, requires_sandbox

SECRET = "SENTINEL-exec-jail-77aa"


@requires_sandbox
def test_a_hostile_cli_sees_only_its_workspace_and_leaves_nothing_running(
        tmp_path_factory, tmp_path, fake_cli, monkeypatch):  # noqa: F811
    outside = tmp_path_factory.mktemp("outside")
    secret = outside / "id_rsa"
    secret.write_text(SECRET, encoding="utf-8")
    target = outside / "planted.txt"
    monkeypatch.setenv("OPENAI_API_KEY", f"sk-{SECRET}")
    monkeypatch.setenv("SKILLOPT_PLANTED_TOKEN", SECRET)
    fake_cli.scenario("jail_report")
    backend = make_backend(codex_exec.INFO, tmp_path, workspace_sandbox="bwrap")
    task = ExecTask(item_id="i1", skill="s", task=f"READ={secret}\nREAD=/etc/shadow\nWRITE={target}\n")
    result = backend.run(task)
    report = json.loads(result.answer)
    assert report["read"] == {str(secret): "FileNotFoundError", "/etc/shadow": "FileNotFoundError"}
    assert "wrote" not in report and not target.exists()
    assert SECRET not in report["pid1_environ"] and "OPENAI_API_KEY" not in report["pid1_environ"]
    # Mount points of the binds, never the host's own folders: the system's, and the top folder of each
    # bound path (the CLI's installation and its interpreter's, wherever this checkout lives).
    system = {"bin", "dev", "etc", "lib", "lib32", "lib64", "proc", "sbin", "tmp", "usr"}
    bound = {Path(path).parts[1] for path in installation_paths(str(fake_cli.folder / "codex"))}
    assert set(report["root"]) <= system | bound, set(report["root"]) - system - bound
    assert report["daemon_pid"] > 0
    assert live_in_namespace(report["pid_namespace"]) == []  # the daemon died with the namespace
    assert backend.preflight()["sandbox"] == "bwrap"


def test_without_bubblewrap_the_exec_target_stops_at_preflight(tmp_path, fake_cli, monkeypatch):  # noqa: F811
    # The fake CLIs stay on PATH; bwrap does not.
    monkeypatch.setenv("PATH", str(fake_cli.folder))
    backend = make_backend(codex_exec.INFO, tmp_path, workspace_sandbox="bwrap")
    with pytest.raises(ConfigError) as caught:
        backend.preflight()
    message = str(caught.value)
    assert "the CLI's workspace runs under an OS sandbox and none can be made" in message
    assert "install bubblewrap" in message and "model.target.options.workspace_sandbox: none" in message


def test_the_cli_installation_is_bound_but_not_the_folder_around_it(tmp_path, fake_cli):  # noqa: F811
    import sys

    paths = installation_paths(str(fake_cli.folder / "codex"))
    assert str(fake_cli.folder) in paths and str(tmp_path) not in paths
    assert os.path.realpath(sys.base_prefix) in paths or sys.base_prefix.startswith("/usr")
