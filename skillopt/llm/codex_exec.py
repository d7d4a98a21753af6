"""``codex_exec``: the OpenAI Codex CLI as the target.

The command line, pinned by a golden test::

    codex exec --skip-git-repo-check --cd <ws> --sandbox read-only
        -c approval_policy="never" -c sandbox_workspace_write.network_access=false -c web_search="disabled"
        --json --output-last-message <ws>/.last_message [-m <model>] [-c model_reasoning_effort="<effort>"]
        [-i <ws>/attachments/NN_<image> ...] -- -

- ``--sandbox workspace-write`` only for items that declare outputs; ``danger-full-access`` is refused.
- ``web_search="disabled"`` is the Codex config key that switches the hosted web-search tool off
  (it replaced ``features.web_search_request``); it is passed on every run.
- ``network_access`` is ``true`` only with ``options.network: true`` (it matters only for
  ``workspace-write``: the read-only sandbox has no network either way).
- ``-i`` takes several values, so ``--`` ends them before ``-``, which reads the prompt from stdin.
- Effort maps ``none``/``minimal`` → ``minimal``, ``low``/``medium``/``high`` as is, ``max`` → ``xhigh``.

The answer is the ``--output-last-message`` file; tokens are summed from the ``turn.completed``
usage events of the ``--json`` stream; ``turn.failed`` and ``error`` events are CLI-reported errors.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from skillopt.core.config import Bool
from skillopt.llm.base import BackendInfo
from skillopt.llm.chat import Usage
from skillopt.llm.exec_harness import (
    CliOutput,
    ExecHarness,
    ExecOptions,
    ExecTask,
    Workspace,
    add_usage,
    count,
    parse_jsonl,
)
from skillopt.llm.openai import OPENAI_EFFORT

# Codex takes the OpenAI API's effort names and one above them for "max".
_EFFORT = {**OPENAI_EFFORT, "max": "xhigh"}


class CodexExecOptions(ExecOptions):
    #: Let sandboxed commands reach the network (``workspace-write`` items only).
    network: Bool = False
    #: ``auto``: read-only, workspace-write for items that declare outputs; ``read-only``: always.
    sandbox: Literal["auto", "read-only"] = "auto"

    @field_validator("sandbox", mode="before")
    @classmethod
    def _no_open_sandbox(cls, value: Any) -> Any:
        if value in ("danger-full-access", "workspace-write"):
            raise ValueError(
                f"{value} is refused: codex runs read-only, and workspace-write only for items that declare "
                "outputs (use auto)"
            )
        return value


class CodexExec(ExecHarness):
    backend = "codex_exec"
    cli = "codex"
    skills_dir = ".agents/skills"
    path_env = "CODEX_EXEC_PATH"
    install_hint = "npm install -g @openai/codex"
    credential_env = "OPENAI_API_KEY"
    login_command = "codex login"
    help_args = ("exec", "--help")
    options_model = CodexExecOptions
    options: CodexExecOptions

    def command_args(self, ws: Workspace, task: ExecTask) -> list[str]:
        writes = task.declares_outputs and self.options.sandbox == "auto"
        network = "true" if self.options.network else "false"
        args = [
            "exec", "--skip-git-repo-check", "--cd", str(ws.root),
            "--sandbox", "workspace-write" if writes else "read-only",
            "-c", 'approval_policy="never"',
            "-c", f"sandbox_workspace_write.network_access={network}",
            "-c", 'web_search="disabled"',
            "--json", "--output-last-message", str(ws.last_message),
        ]
        if self.role.model:
            args += ["-m", self.role.model]
        if self.role.reasoning_effort:
            args += ["-c", f'model_reasoning_effort="{_EFFORT[self.role.reasoning_effort]}"']
        for image in ws.images:
            args += ["-i", str(image)]
        return [*args, "--", "-"]

    def _network(self) -> bool:
        return self.options.network

    def read_output(self, stdout: str, ws: Workspace) -> CliOutput:
        output = CliOutput(events=parse_jsonl(stdout))
        for event in output.events:
            kind = event.get("type")
            item = value if isinstance(value := event.get("item"), dict) else {}
            if kind == "item.completed" and item.get("type") == "command_execution":
                command = str(item.get("command", ""))
                output.commands.append(command)
                if item.get("exit_code") not in (0, None):
                    output.errors.append(f"exit {item.get('exit_code')}: {command}")
            elif kind == "item.completed" and item.get("type") == "error":
                output.errors.append(str(item.get("message", "")))
            elif kind == "turn.completed" and isinstance(event.get("usage"), dict):
                output.usage = add_usage(output.usage, _usage(event["usage"]))
            elif kind == "turn.failed":
                error = event.get("error")
                output.error = str(
                    error.get("message") if isinstance(error, dict) else error or "turn failed"
                )
            elif kind == "error":
                output.error = str(event.get("message") or "error event")
        if ws.last_message.is_file():
            output.answer = ws.last_message.read_text(encoding="utf-8", errors="replace")
        return output


def _usage(reported: dict[str, Any]) -> Usage:
    """One ``turn.completed`` usage block; ``input_tokens`` includes the cached ones."""
    return Usage(
        prompt_tokens=count(reported, "input_tokens"),
        completion_tokens=count(reported, "output_tokens"),
        reasoning_tokens=count(reported, "reasoning_output_tokens"),
        cached_prompt_tokens=count(reported, "cached_input_tokens"),
    )


INFO = BackendInfo(
    name="codex_exec",
    kind="exec",
    factory=CodexExec,
    options_model=CodexExecOptions,
    default_model=None,
    key_env="OPENAI_API_KEY",
    key_required=False,
    default_timeout_s=300.0,
    roles=("target",),
    env_fields={"options.path": "CODEX_EXEC_PATH"},
    summary="OpenAI Codex CLI (`codex exec`) as an agentic target, sandboxed, one workspace per item",
)
