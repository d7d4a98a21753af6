"""The exec targets ``codex_exec`` and ``claude_code_exec`` against fake CLIs.

The fakes (``tests/fakes/bin``) are copied into a temp folder put first on PATH; their shebang points
at this interpreter, because the harness hands the CLI only an allowlisted environment (no virtualenv
or pyenv variables). Each test picks a scenario by writing ``scenario.txt`` there and reads what the
fake recorded from ``calls.jsonl``: argv, cwd, stdin, environment names and the workspace files.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from skillopt.core.config import load_config
from skillopt.core.errors import ConfigError, SecurityError
from skillopt.llm import claude_code_exec, codex_exec
from skillopt.llm.base import BackendContext, BackendInfo, BackendRegistry, EnvSecrets
from skillopt.llm.errors import EmptyAnswer, ExecError, ExecTimeout
from skillopt.llm.exec_harness import ExecHarness, ExecTask
from skillopt.llm.roles import ResolvedRole, resolve_roles
from skillopt.sandbox import process_group
from tests.processes import alive, exit_while_making

REPO = Path(__file__).resolve().parents[2]
FAKE_BIN = REPO / "tests" / "fakes" / "bin"
CLIS = {"codex": codex_exec.INFO, "claude": claude_code_exec.INFO}

SKILL = "# Capitals\n\n- Answer with the city name only.\n- Keep the <answer> tags.\n"
GOLD_FIELDS = ("gold", "answers")
ITEM = {
    "id": "q-1",
    "question": "What is the capital of France?\nReply inside <answer></answer>.",
    "gold": "GOLD-Paris-9d2f61",
    "answers": ["GOLD-Paris-9d2f61", "GOLD-alias-4e1a07"],
}


class FakeCli:
    """The temp copy of the fake CLIs: choose a scenario, read what they recorded."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def scenario(self, name: str) -> None:
        (self.folder / "scenario.txt").write_text(name, encoding="utf-8")

    def calls(self, *, runs_only: bool = True) -> list[dict[str, Any]]:
        log = self.folder / "calls.jsonl"
        calls = (
            [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
            if log.exists()
            else []
        )
        return [c for c in calls if c["stdin"] is not None] if runs_only else calls

    def run(self) -> dict[str, Any]:
        (call,) = self.calls()
        return call


@pytest.fixture
def fake_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCli:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("codex", "claude", "fake_cli.py"):
        text = (
            (FAKE_BIN / name)
            .read_text(encoding="utf-8")
            .replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1)
        )
        (folder / name).write_text(text, encoding="utf-8")
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    return FakeCli(folder)


def make_backend(info: BackendInfo, tmp_path: Path, *, model: str | None = None, effort: str | None = None,
                 timeout_s: float = 20.0, **options: Any) -> ExecHarness:
    """The backend as the resolver would build it, with the repo, a run dir and a data root protected.

    These tests check the harness's own contract (argv, stdin, environment, timeouts, answers), which
    holds with or without the OS sandbox; they run without it so the fake CLIs can record each call next
    to themselves. tests/security/test_exec_sandbox.py runs the same fakes under bubblewrap.
    """
    options.setdefault("workspace_root", str(tmp_path / "workspaces"))
    options.setdefault("workspace_sandbox", "none")
    role = ResolvedRole(
        role="target",
        backend=info.name,
        model=model,
        price_model=model,
        reasoning_effort=effort,
        max_tokens=None,
        temperature=None,
        seed=None,
        timeout_s=timeout_s,
        base_url=None,
        api_key_env=info.key_env,
        api_key_secret=None,
        key_required=False,
        rate_limit_key=f"exec:{info.name}",
        extra_body={},
        options=info.options_model.model_validate(options).model_dump(),
        capabilities={},
        strict_params=False,
        provenance={},
    )
    context = BackendContext(
        run_id="run12345-abcdef", protected_paths=(REPO, tmp_path / "run", tmp_path / "data")
    )
    return info.factory(role, EnvSecrets(dict(os.environ)), context)


def task_from_item(item: dict[str, Any], **extra: Any) -> ExecTask:
    """What a benchmark hands an exec target: public fields only."""
    public = {k: v for k, v in item.items() if k not in GOLD_FIELDS}
    return ExecTask(
        item_id=public["id"], skill=SKILL, task=public["question"], tags={"item_id": public["id"]}, **extra
    )


def data_file(tmp_path: Path, name: str, content: bytes = b"data") -> Path:
    path = tmp_path / "data" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def workspaces_left(tmp_path: Path) -> list[Path]:
    root = tmp_path / "workspaces"
    return sorted(root.glob("skillopt-*")) if root.exists() else []


# ---- command lines


def test_codex_command_line_is_exact(tmp_path, fake_cli):
    chart, notes = data_file(tmp_path, "chart.png", b"\x89PNG"), data_file(tmp_path, "notes,v1.txt")
    backend = make_backend(codex_exec.INFO, tmp_path, model="gpt-5-codex", effort="high")
    backend.run(task_from_item(ITEM, attachments=[chart, notes], images=[chart]))

    call = fake_cli.run()
    ws = Path(call["argv"][3])
    assert ws.resolve() == Path(call["cwd"])
    assert ws.parent == tmp_path / "workspaces" and ws.name.startswith("skillopt-run12345-q-1-")
    assert call["argv"] == [
        "exec", "--skip-git-repo-check", "--cd", str(ws), "--sandbox", "read-only",
        "-c", 'approval_policy="never"', "-c", "sandbox_workspace_write.network_access=false",
        "-c", 'web_search="disabled"', "--json", "--output-last-message", str(ws / ".last_message"),
        "-m", "gpt-5-codex", "-c", 'model_reasoning_effort="high"',
        "-i", str(ws / "attachments" / "01_chart.png"), "--", "-",
    ]
    assert {
        "SKILL.md",
        "task.md",
        "ATTACHMENTS.md",
        "attachments/01_chart.png",
        "attachments/02_notes_v1.txt",
    } <= set(call["files"])
    assert "out/" not in call["files"]


def test_codex_writes_only_for_items_that_declare_outputs(tmp_path, fake_cli):
    backend = make_backend(codex_exec.INFO, tmp_path, network=True)
    backend.run(task_from_item(ITEM, declares_outputs=True))

    call = fake_cli.run()
    ws = call["argv"][3]
    assert call["argv"] == [
        "exec", "--skip-git-repo-check", "--cd", ws, "--sandbox", "workspace-write",
        "-c", 'approval_policy="never"', "-c", "sandbox_workspace_write.network_access=true",
        "-c", 'web_search="disabled"', "--json", "--output-last-message", f"{ws}/.last_message", "--", "-",
    ]
    assert "out/" in call["files"]
    assert backend.preflight()["network"] is True


def test_claude_command_line_is_exact(tmp_path, fake_cli):
    backend = make_backend(
        claude_code_exec.INFO, tmp_path, model="claude-sonnet-4-5", effort="max", max_turns=6
    )
    backend.run(task_from_item(ITEM))

    call = fake_cli.run()
    ws = call["argv"][5]
    assert Path(ws).resolve() == Path(call["cwd"])
    assert call["argv"] == [
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--add-dir",
        ws,
        "--model",
        "claude-sonnet-4-5",
        "--max-turns",
        "6",
        "--effort",
        "max",
        "--allowedTools",
        "Read",
        "--disallowedTools",
        "WebFetch,WebSearch",
        "--permission-mode",
        "dontAsk",
    ]


def test_instructions_arrive_on_stdin_never_in_argv(tmp_path, fake_cli):
    make_backend(codex_exec.INFO, tmp_path).run(task_from_item(ITEM))

    call = fake_cli.run()
    assert "Read `SKILL.md`" in call["stdin"] and "task.md" in call["stdin"]
    assert not any("\n" in arg for arg in call["argv"])
    assert "capital of France" not in " ".join(call["argv"])
    assert call["files"]["task.md"] == ITEM["question"]


# ---- answers


def test_codex_answer_proves_it_read_the_skill_and_the_task(tmp_path, fake_cli):
    result = make_backend(codex_exec.INFO, tmp_path).run(task_from_item(ITEM))

    skill_md = fake_cli.run()["files"]["SKILL.md"]
    assert skill_md.startswith("---\n") and skill_md.endswith(SKILL)
    assert (
        result.answer
        == f"ANSWER skill-lines={len(skill_md.splitlines())} task=What is the capital of France?"
    )
    assert (result.usage.prompt_tokens, result.usage.cached_prompt_tokens) == (1200, 200)
    assert (result.usage.completion_tokens, result.usage.reasoning_tokens) == (40, 8)
    assert (result.attempts, result.exit_code, result.cost_usd) == (1, 0, None)
    assert any(e.get("type") == "turn.completed" for e in result.trace)
    assert len(result.trace_digest) <= 4000
    for expected in ("commands run:", "cat SKILL.md", "files read:", "- SKILL.md", "- task.md", result.answer,
                     "prompt 1200"):
        assert expected in result.trace_digest


def test_claude_answer_comes_from_the_result_event(tmp_path, fake_cli):
    result = make_backend(claude_code_exec.INFO, tmp_path).run(task_from_item(ITEM))

    assert result.answer.startswith("ANSWER skill-lines=") and result.answer.endswith(
        "task=What is the capital of France?"
    )
    assert (
        result.usage.prompt_tokens,
        result.usage.cached_prompt_tokens,
        result.usage.cache_write_tokens,
    ) == (1230, 1000, 200)
    assert result.usage.completion_tokens == 50
    assert (result.cost_usd, result.num_turns, result.model) == (0.0123, 3, "claude-fake-1")
    assert "- SKILL.md" in result.trace_digest and "cost $0.0123" in result.trace_digest


# ---- what reaches the workspace


def test_gold_never_reaches_the_workspace_or_the_cli(tmp_path, fake_cli):
    attachment = data_file(tmp_path, "map.txt", b"a map of Europe")
    backend = make_backend(codex_exec.INFO, tmp_path, keep_workspaces=True)
    result = backend.run(task_from_item(ITEM, attachments=[attachment]))

    gold_values = [ITEM["gold"], *ITEM["answers"]]
    recorded = json.dumps(fake_cli.calls(runs_only=False))
    assert result.workspace_kept is not None and result.workspace_kept.is_dir()
    kept = "".join(p.read_text(encoding="utf-8", errors="replace") for p in result.workspace_kept.rglob("*")
                   if p.is_file())
    for gold in gold_values:
        assert gold not in recorded
        assert gold not in kept


def test_repository_and_links_never_enter_the_workspace(tmp_path, fake_cli):
    fake_cli.scenario("read_outside")
    target = data_file(tmp_path, "doc.txt", b"document")
    link = tmp_path / "data" / "doc-link.txt"
    link.symlink_to(target)
    result = make_backend(codex_exec.INFO, tmp_path).run(task_from_item(ITEM, attachments=[link]))

    report = json.loads(result.answer)
    assert report == {"escapes": [], "parent": str((tmp_path / "workspaces").resolve()), "repo_markers": []}
    assert fake_cli.run()["files"]["attachments/01_doc-link.txt"] == "document"


@pytest.mark.parametrize("where", ["repository", "run_dir", "link_into_run_dir"])
def test_a_workspace_inside_a_protected_folder_is_refused_before_launch(tmp_path, fake_cli, where):
    (tmp_path / "run").mkdir()
    (tmp_path / "sneaky").symlink_to(tmp_path / "run", target_is_directory=True)
    root = {"repository": REPO / "tmp-workspaces", "run_dir": tmp_path / "run" / "ws",
            "link_into_run_dir": tmp_path / "sneaky" / "ws"}[where]
    backend = make_backend(codex_exec.INFO, tmp_path, workspace_root=str(root))

    with pytest.raises(SecurityError, match="protected folder"):
        backend.run(task_from_item(ITEM))
    assert fake_cli.calls() == []
    assert not root.exists()


# ---- environment


@pytest.mark.parametrize("cli", ["codex", "claude"])
@pytest.mark.parametrize("auth", ["login", "api_key"])
def test_the_child_environment_is_an_allowlist(tmp_path, fake_cli, monkeypatch, cli, auth):
    sentinels = {
        "OPENAI_API_KEY": "sk-SENTINEL-7f3a2b9c4d1e6f08",
        "ANTHROPIC_API_KEY": "sk-ant-SENTINEL-5e6f7a8b9c",
        "AZURE_OPENAI_API_KEY": "SENTINEL-azure-1a2b3c4d",
        "PREFECT_API_URL": "http://sentinel.invalid/api",
        "MY_SECRET_TOKEN": "SENTINEL-token-9f8e7d6c",
    }
    for name, value in sentinels.items():
        monkeypatch.setenv(name, value)
    make_backend(CLIS[cli], tmp_path, auth=auth).run(task_from_item(ITEM))

    credential = CLIS[cli].key_env
    expected = {"PATH", "HOME", "TMPDIR", "LC_ALL"} | ({credential} if auth == "api_key" else set())
    for call in fake_cli.calls(runs_only=False):
        assert set(call["env_names"]) - {"LC_CTYPE"} == expected  # Python may add LC_CTYPE itself
    for value in sentinels.values():
        assert value not in json.dumps(fake_cli.calls(runs_only=False))


# ---- failures


def test_a_timeout_kills_the_process_group_and_leaves_no_orphan(tmp_path, fake_cli):
    fake_cli.scenario("sleep")
    backend = make_backend(codex_exec.INFO, tmp_path, timeout_s=1.0, kill_grace_s=0.5)
    backend.preflight()

    started = time.monotonic()
    with pytest.raises(ExecTimeout) as caught:
        backend.run(task_from_item(ITEM))
    assert time.monotonic() - started < 1.0 + 0.5 + 1.0
    assert caught.value.attempts == 1
    assert any(e.get("type") == "thread.started" for e in caught.value.trace)  # the partial trace is kept
    grandchild = int((fake_cli.folder / "grandchild.pid").read_text())
    assert _gone(grandchild)
    assert workspaces_left(tmp_path) == []


def test_exiting_mid_attempt_stops_the_cli_and_removes_the_workspace(tmp_path, fake_cli, monkeypatch):
    """Ctrl-C leaves the attempt's worker thread behind: the clean-up at exit stops its CLI's whole group
    and removes the workspace and private home its ``finally`` would have removed."""
    monkeypatch.setattr(process_group, "_exiting", False)  # restored after the test
    temp = tmp_path / "tmp"  # where private homes go: not the shared temp folder other processes use
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    fake_cli.scenario("sleep")
    backend = make_backend(codex_exec.INFO, tmp_path, timeout_s=60.0)
    backend.preflight()
    failed: list[BaseException] = []

    def attempt() -> None:
        try:
            backend.run(task_from_item(ITEM))
        except BaseException as exc:  # noqa: BLE001 - the killed CLI's error, checked below
            failed.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    pid_file = fake_cli.folder / "grandchild.pid"
    while not pid_file.exists() and worker.is_alive():
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    (leader,) = process_group._live
    assert workspaces_left(tmp_path) and list(temp.glob("skillopt-home-*"))
    assert alive(leader) and alive(grandchild)

    process_group.end_leftovers(grace_s=0.2)

    assert workspaces_left(tmp_path) == []
    assert list(temp.glob("skillopt-home-*")) == []
    with pytest.raises(ProcessLookupError):
        os.kill(leader, 0)
    assert _gone(grandchild)
    worker.join(timeout=30)
    # The abandoned attempt ends, but not as a failure of the item (which would be recorded as an error).
    assert len(failed) == 1 and isinstance(failed[0], process_group.Exiting)


def test_an_exit_while_a_workspace_is_being_made_leaves_no_folder(tmp_path, fake_cli, monkeypatch):
    """The clean-up at exit runs while a worker thread is making an attempt's folders. A forced exit ends
    the process the moment that clean-up returns (``os._exit``), so whatever exists then stays for good:
    the workspace and the private home must be listed for removal as they are made, not after."""
    monkeypatch.setattr(process_group, "_exiting", False)  # restored after the test
    temp = tmp_path / "tmp"  # where private homes go
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    backend = make_backend(codex_exec.INFO, tmp_path)
    backend.preflight()

    def folders() -> list[Path]:
        return [*workspaces_left(tmp_path), *temp.glob("skillopt-*")]

    left, raised = exit_while_making(monkeypatch, "skillopt-home-", lambda: backend.run(task_from_item(ITEM)),
                                     folders)
    assert left == [] and folders() == []
    # The abandoned attempt ends, but not as a failure of the item.
    assert len(raised) == 1 and isinstance(raised[0], process_group.Exiting), raised


def test_an_exit_while_the_preflight_asks_the_cli_leaves_no_folder(tmp_path, fake_cli, monkeypatch):
    """The preflight asks the CLI for its version and flags from a private home of its own; skillopt exits
    while that home is being made: the clean-up at exit removes it, and the preflight stops."""
    monkeypatch.setattr(process_group, "_exiting", False)  # restored after the test
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    backend = make_backend(codex_exec.INFO, tmp_path)

    def folders() -> list[Path]:
        return sorted(temp.glob("skillopt-*"))

    left, raised = exit_while_making(monkeypatch, "skillopt-home-", backend.preflight, folders)
    assert left == [] and folders() == []
    assert len(raised) == 1, raised


def _gone(pid: int, within_s: float = 2.0) -> bool:
    """True once ``pid`` no longer runs (a zombie waiting for init to reap it counts as gone)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("cli", ["codex", "claude"])
def test_an_auth_failure_is_an_exec_error_with_redacted_stderr(tmp_path, fake_cli, monkeypatch, cli):
    fake_cli.scenario("auth_fail")
    # no key shape: only the harness knowing the value can redact it
    plain_key = "SENTINEL-plain-7f3a2b9c4d1e"
    monkeypatch.setenv(CLIS[cli].key_env, plain_key)

    with pytest.raises(ExecError) as caught:
        make_backend(CLIS[cli], tmp_path, auth="api_key").run(task_from_item(ITEM))
    message = str(caught.value)
    assert plain_key not in message and "[REDACTED]" in message
    assert "exited with status 1" in message and CLIS[cli].key_env in message  # the hint names the variable
    assert "ANSWER from a failed child" not in message + caught.value.trace_digest
    assert len(fake_cli.calls()) == 1  # never retried
    assert plain_key not in json.dumps(caught.value.trace)


def test_an_auth_failure_with_login_explains_how_to_log_in(tmp_path, fake_cli):
    fake_cli.scenario("auth_fail")
    with pytest.raises(ExecError, match="use_real_home: true"):
        make_backend(codex_exec.INFO, tmp_path).run(task_from_item(ITEM))


def test_backends_check_warns_that_a_login_in_a_private_home_cannot_authenticate(fake_cli, monkeypatch):
    """The default (auth: login, a private home) sees no login: the check said "ok" and every item of the
    run then failed to authenticate."""
    import io

    from skillopt.shell.cli import main

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    fake_cli.scenario("ok")

    def check(*overrides: str) -> str:
        out, err = io.StringIO(), io.StringIO()
        argv = ["backends", "check", "--role", "target", "--target-backend", "claude_code_exec"]
        assert main([*argv, *(x for o in overrides for x in ("-o", o))], stdout=out, stderr=err) == 0, \
            err.getvalue()
        return out.getvalue()

    shown = check()
    assert "private home, auth login; no call made" in shown
    assert ("warning: the CLI will see no login: options.auth: login uses your login only with "
            "model.target.options.use_real_home: true; or set options.auth: api_key and export "
            "ANTHROPIC_API_KEY") in shown, shown
    assert "warning" not in check("model.target.options.use_real_home=true")


@pytest.mark.parametrize("cli", ["codex", "claude"])
def test_an_empty_answer_is_retried_then_raises(tmp_path, fake_cli, cli):
    fake_cli.scenario("empty")
    with pytest.raises(EmptyAnswer) as caught:
        make_backend(CLIS[cli], tmp_path, empty_retries=1).run(task_from_item(ITEM))
    assert caught.value.attempts == 2
    assert len(fake_cli.calls()) == 2
    assert workspaces_left(tmp_path) == []


@pytest.mark.parametrize(
    ("cli", "reported"), [("codex", "stream disconnected"), ("claude", "API Error: 500")]
)
def test_an_error_the_cli_reports_is_an_exec_error_even_with_exit_status_zero(
    tmp_path, fake_cli, cli, reported
):
    fake_cli.scenario("is_error")
    with pytest.raises(ExecError, match=reported):
        make_backend(CLIS[cli], tmp_path).run(task_from_item(ITEM))


# ---- preflight and options


def test_preflight_checks_the_cli_once(tmp_path, fake_cli):
    backend = make_backend(codex_exec.INFO, tmp_path)
    report = backend.preflight()
    backend.run(task_from_item(ITEM))

    assert report["version"] == "codex-cli 0.46.0" and report["home"] == "private"
    assert {"--output-last-message", "--sandbox", "-c", "-i", "--cd", "--json"} <= set(
        report["flags_checked"]
    )
    probes = [c["argv"] for c in fake_cli.calls(runs_only=False) if c["stdin"] is None]
    assert probes == [["--version"], ["exec", "--help"]]


@pytest.mark.parametrize(("cli", "flag", "version"), [("codex", "--output-last-message", "codex-cli 0.46.0"),
                                                      ("claude", "--disallowedTools", "2.0.14")])
def test_preflight_refuses_a_flag_the_help_does_not_list(tmp_path, fake_cli, cli, flag, version):
    fake_cli.scenario("old_help")
    backend = make_backend(CLIS[cli], tmp_path)
    with pytest.raises(ConfigError, match=flag) as caught:
        backend.preflight()
    assert version in str(caught.value)
    with pytest.raises(ConfigError):
        backend.run(task_from_item(ITEM))
    assert fake_cli.calls() == []


def test_a_missing_cli_is_a_config_error_with_an_install_hint(tmp_path, fake_cli):
    backend = make_backend(codex_exec.INFO, tmp_path, path="no-such-codex-cli")
    with pytest.raises(ConfigError, match="npm install -g @openai/codex"):
        backend.run(task_from_item(ITEM))


def test_the_workspace_is_removed_after_the_run(tmp_path, fake_cli):
    result = make_backend(claude_code_exec.INFO, tmp_path).run(task_from_item(ITEM))
    assert result.workspace_kept is None
    assert workspaces_left(tmp_path) == []


def _resolve_target(*overrides: str, env: dict[str, str] | None = None) -> ResolvedRole:
    registry = BackendRegistry([codex_exec.INFO, claude_code_exec.INFO,
                                BackendInfo(name="openai", factory=lambda *args: None)])
    loaded = load_config(overrides=list(overrides), env={})
    return resolve_roles(loaded, env=env or {}, registry=registry).target


def test_options_are_resolved_and_unsafe_ones_refused():
    target = _resolve_target(
        "model.target.backend=codex_exec", env={"CODEX_EXEC_PATH": "/opt/codex/bin/codex"}
    )
    assert target.options["path"] == "/opt/codex/bin/codex"
    assert target.timeout_s == 300.0

    with pytest.raises(ConfigError, match="danger-full-access is refused"):
        _resolve_target("model.target.backend=codex_exec", "model.target.options.sandbox=danger-full-access")
    with pytest.raises(ConfigError, match="only with os_sandbox: true"):
        _resolve_target(
            "model.target.backend=claude_code_exec", "model.target.options.permission_mode=bypassPermissions"
        )
    with pytest.raises(ConfigError, match="always disallowed"):
        _resolve_target(
            "model.target.backend=claude_code_exec", "model.target.options.tools=[Read, WebFetch]"
        )
    with pytest.raises(ConfigError, match="can serve only target"):
        _resolve_target("model.optimizer.backend=codex_exec")
