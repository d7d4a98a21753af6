"""``claude_code_exec``: Claude Code in print mode as the target.

The command line, pinned by a golden test::

    claude -p --output-format stream-json --verbose --add-dir <ws> [--model M] [--max-turns N]
        [--effort E] --allowedTools <options.tools, comma-joined> --disallowedTools WebFetch,WebSearch
        --permission-mode dontAsk

- The prompt is read from stdin (``-p`` without a prompt argument).
- ``dontAsk`` denies every tool that is not on the allowlist instead of asking (there is nobody to
  ask in print mode); ``default`` is accepted too. ``bypassPermissions`` needs ``options.os_sandbox:
  true``, the user's statement that the CLI runs inside a container or namespace jail without network.
  Preflight checks that the installed CLI lists the chosen mode.
- ``--effort`` is passed only when the installed CLI lists it (else the effort is left out with a
  warning): ``none``/``minimal``/``low`` → ``low``, ``medium``, ``high``, ``max`` → ``max``.
- ``--max-turns`` is passed only when ``options.max_turns`` is set; some versions leave it out of
  ``--help``, in which case preflight refuses it by name.

The answer is the ``result`` field of the final ``{"type": "result"}`` event (``is_error: true`` or an
``error_*`` subtype is an ``ExecError``), which also gives usage, ``num_turns`` and ``total_cost_usd``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from skillopt.core.config import Bool
from skillopt.llm.base import BackendInfo
from skillopt.llm.chat import Usage
from skillopt.llm.exec_harness import (
    CliOutput,
    ExecHarness,
    ExecOptions,
    ExecTask,
    Workspace,
    count,
    lists_flag,
    parse_jsonl,
)

_EFFORT = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "max": "max"}
_NEVER_ALLOWED = ("WebFetch", "WebSearch")


class ClaudeCodeExecOptions(ExecOptions):
    #: The tools the CLI may use; ``Bash`` or ``Write`` only where a benchmark needs them.
    tools: list[str] = Field(default_factory=lambda: ["Read"], min_length=1)
    #: The CLI runs inside an OS sandbox (container or namespace jail without network).
    os_sandbox: Bool = False
    permission_mode: Literal["dontAsk", "default", "bypassPermissions"] = "dontAsk"
    max_turns: int | None = Field(default=None, ge=1)

    @field_validator("tools")
    @classmethod
    def _no_web_tools(cls, tools: list[str]) -> list[str]:
        refused = [t for t in tools if t in _NEVER_ALLOWED]
        if refused:
            raise ValueError(f"{', '.join(refused)} are always disallowed for exec targets")
        return tools

    @model_validator(mode="after")
    def _bypass_needs_sandbox(self) -> ClaudeCodeExecOptions:
        if self.permission_mode == "bypassPermissions" and not self.os_sandbox:
            raise ValueError("permission_mode bypassPermissions is allowed only with os_sandbox: true")
        return self


class ClaudeCodeExec(ExecHarness):
    backend = "claude_code_exec"
    cli = "claude"
    skills_dir = ".claude/skills"
    path_env = "CLAUDE_CODE_EXEC_PATH"
    install_hint = "npm install -g @anthropic-ai/claude-code"
    credential_env = "ANTHROPIC_API_KEY"
    login_command = "claude /login"
    help_args = ("--help",)
    options_model = ClaudeCodeExecOptions
    options: ClaudeCodeExecOptions
    #: Whether the installed CLI lists ``--effort`` (set at preflight).
    effort_flag = False

    def adapt_to_help(self, help_text: str) -> None:
        self.effort_flag = lists_flag(help_text, "--effort")
        if self.role.reasoning_effort and not self.effort_flag:
            self.warn(f"[{self.role.role}] {self.role.label()}: reasoning_effort is not sent (the installed "
                      "claude does not list --effort)")

    def help_values(self) -> list[str]:
        return [self.options.permission_mode]

    def command_args(self, ws: Workspace, task: ExecTask) -> list[str]:
        args = ["-p", "--output-format", "stream-json", "--verbose", "--add-dir", str(ws.root)]
        if self.role.model:
            args += ["--model", self.role.model]
        if self.options.max_turns:
            args += ["--max-turns", str(self.options.max_turns)]
        if self.role.reasoning_effort and self.effort_flag:
            args += ["--effort", _EFFORT[self.role.reasoning_effort]]
        return [
            *args,
            "--allowedTools", ",".join(self.options.tools),
            "--disallowedTools", ",".join(_NEVER_ALLOWED),
            "--permission-mode", self.options.permission_mode,
        ]

    def read_output(self, stdout: str, ws: Workspace) -> CliOutput:
        output = CliOutput(events=parse_jsonl(stdout))
        result: dict[str, Any] | None = None
        for event in output.events:
            kind = event.get("type")
            message = value if isinstance(value := event.get("message"), dict) else {}
            if kind == "system" and event.get("subtype") == "init":
                output.model = event.get("model") or output.model
            elif kind == "assistant":
                for block in _blocks(message):
                    if block.get("type") == "tool_use":
                        _note_tool_use(output, block, ws)
            elif kind == "user":
                for block in _blocks(message):
                    if block.get("type") == "tool_result" and block.get("is_error"):
                        output.errors.append(_text_of(block.get("content"))[:300])
            elif kind == "result":
                result = event
        if result is None:
            output.error = "the stream ended without a result event"
            return output
        output.usage = _usage(result.get("usage") or {})
        cost = result.get("total_cost_usd")
        output.cost_usd = float(cost) if isinstance(cost, int | float) else None
        turns = result.get("num_turns")
        output.num_turns = turns if isinstance(turns, int) else None
        output.errors += [f"permission denied: {d.get('tool_name', d)}" if isinstance(d, dict) else str(d)
                          for d in result.get("permission_denials") or []]
        subtype = str(result.get("subtype") or "")
        if result.get("is_error") or subtype.startswith("error"):
            output.error = str(result.get("result") or subtype or "is_error")
        else:
            output.answer = str(result.get("result") or "")
        return output


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(c.get("text", "")) if isinstance(c, dict) else str(c) for c in content)
    return str(content or "")


def _note_tool_use(output: CliOutput, block: dict[str, Any], ws: Workspace) -> None:
    name = str(block.get("name", "?"))
    arguments = value if isinstance(value := block.get("input"), dict) else {}
    if name == "Read" and arguments.get("file_path"):
        path = str(arguments["file_path"])
        prefix = f"{ws.root}/"
        output.files_read.append(path[len(prefix):] if path.startswith(prefix) else path)
    elif name == "Bash" and arguments.get("command"):
        output.commands.append(str(arguments["command"]))
    else:
        output.commands.append(f"{name} {json.dumps(arguments, ensure_ascii=False)[:200]}")


def _usage(reported: dict[str, Any]) -> Usage:
    """Anthropic counts: ``input_tokens`` excludes cache reads and writes; the prompt total includes them."""
    fresh = count(reported, "input_tokens")
    read, written = count(reported, "cache_read_input_tokens"), count(reported, "cache_creation_input_tokens")
    prompt = None if fresh is None else fresh + (read or 0) + (written or 0)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=count(reported, "output_tokens"),
        cached_prompt_tokens=read,
        cache_write_tokens=written,
    )


INFO = BackendInfo(
    name="claude_code_exec",
    kind="exec",
    factory=ClaudeCodeExec,
    options_model=ClaudeCodeExecOptions,
    default_model=None,
    key_env="ANTHROPIC_API_KEY",
    key_required=False,
    default_timeout_s=300.0,
    roles=("target",),
    env_fields={"options.path": "CLAUDE_CODE_EXEC_PATH"},
    summary="Claude Code (`claude -p`) as an agentic target, allowlisted tools, one workspace per item",
)
