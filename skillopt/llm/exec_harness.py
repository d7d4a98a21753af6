"""The shared harness of the exec targets ``codex_exec`` and ``claude_code_exec``.

One ``run`` per benchmark item:

1. a fresh workspace ``skillopt-<run8>-<item>-<rand>/`` holding ``SKILL.md``, ``task.md`` (the public
   prompt only), copies of the item's attachments, ``ATTACHMENTS.md`` and ``out/`` when the item
   declares outputs;
2. a path guard: the workspace, the CLI's home and every path on its command line lie outside the
   context's protected folders (repository, run directory, dataset roots), else ``SecurityError``;
3. the instructions on stdin, never on the command line;
4. the CLI in its own process group, with an allowlisted environment;
5. a wall-clock limit that terminates, then kills, the whole group;
6. the answer only from the CLI's final-message channel;
7. a redacted trace and a short digest for the optimizer;
8. cleanup.

A backend module subclasses ``ExecHarness`` and supplies only what differs: the command line, the
help command, and how to read the CLI's output. Errors raised by ``run`` (``ExecError``,
``ExecTimeout``, ``EmptyAnswer``) carry the redacted partial trace as ``exc.trace`` and
``exc.trace_digest``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from string import Template
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skillopt.core.config import Bool
from skillopt.core.errors import ConfigError, DataError, SecurityError
from skillopt.core.redact import Redactor
from skillopt.core.resources import load_prompt
from skillopt.llm.base import BackendContext, SecretSource
from skillopt.llm.chat import Usage
from skillopt.llm.errors import BackendError, EmptyAnswer, ErrorContext, ExecError, ExecTimeout
from skillopt.llm.http_common import WarnOnce, require_key, resolve_key
from skillopt.llm.roles import ResolvedRole
from skillopt.sandbox.confine import SANDBOX_FIX, ProcessOutcome, limits_prefix, run_confined, sandbox_status
from skillopt.sandbox.process_group import (
    Exiting,
    exiting,
    keep_at_exit,
    run_in_group,
    scratch_folder,
    temp_folder,
)

log = logging.getLogger("skillopt.llm.exec")

#: The instructions every exec target receives on stdin (``prompts/exec/target.md``).
TARGET_PROMPT = "exec/target"
LAST_MESSAGE = ".last_message"
STDERR_LIMIT = 2000
#: Of the CLI's stdout (its event stream) and stderr, the first and last this many bytes are kept.
_KEEP_OUTPUT_BYTES = 16 * 1024 * 1024
_PROBE_TIMEOUT_S = 30.0
_DRAIN_JOIN_S = 2.0
# Text that says the CLI could not authenticate, on stderr or in its own error report.
_AUTH_TEXT = re.compile(
    r"unauthori[sz]ed|not logged in|please (?:run )?/?login|invalid[ _-]?api[ _-]?key|"
    r"authentication (?:failed|error|required)|api key (?:is )?missing|oauth token (?:has )?expired",
    re.IGNORECASE,
)


# --------------------------------------------------------------------------------------------
# What a run takes and gives


class ExecTask(BaseModel):
    """One benchmark item for an exec target. Only public fields belong here: never gold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    item_id: str
    #: The current skill, verbatim (a skill folder's files behind ``skill_files`` marker lines).
    skill: str
    #: The public prompt of the item, written to ``task.md``.
    task: str
    #: Files the CLI may read; each is copied (never linked) into ``attachments/``.
    attachments: list[Path] = Field(default_factory=list)
    #: The attachments also handed to the CLI as images, where the CLI supports it.
    images: list[Path] = Field(default_factory=list)
    #: The item asks for files: ``out/`` exists and the CLI may write inside the workspace.
    declares_outputs: bool = False
    #: Accounting tags; never written into the workspace.
    tags: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _images_are_attachments(self) -> ExecTask:
        missing = [str(p) for p in self.images if p not in self.attachments]
        if missing:
            raise ValueError(f"images must also be listed as attachments: {', '.join(missing)}")
        return self


def exec_task_from_messages(item_id: str, skill: str, messages: Sequence[Any], *,
                            tags: Mapping[str, Any] | None = None) -> ExecTask:
    """The exec form of a chat prompt: its text becomes ``task.md`` and its images attachments.

    Each image must come from a file (``ImagePart`` with a path source); it is attached once, handed
    to the CLI as an image, and named in ``task.md`` by its workspace path
    (``[image] attachments/01_page.png``) where the chat prompt says ``[image] page.png``. The skill
    goes to ``SKILL.md``, so ``messages`` should be built without it.
    """
    from skillopt.llm.chat import ImagePart

    files: list[Path] = []
    for message in messages:
        for image in message.images():
            if not isinstance(image.source, str) or image.source.startswith("data:"):
                raise ConfigError(f"item {item_id}: exec targets take images as files; {image.basename()} "
                                  "has no file path")
            files.append(Path(image.source))
    attached = list(dict.fromkeys(files))
    names = {
        path: f"attachments/{_attachment_name(index, path)}" for index, path in enumerate(attached, start=1)
    }

    def text_of(message: Any) -> str:
        if isinstance(message.content, str):
            return message.content
        return "\n".join(
            f"[image] {names[Path(str(part.source))]}" if isinstance(part, ImagePart) else part.text
            for part in message.content
        )

    task = "\n\n".join(text_of(m) for m in messages if text_of(m).strip())
    return ExecTask(item_id=item_id, skill=skill, task=task, attachments=attached, images=attached,
                    tags=dict(tags or {}))


class ExecResult(BaseModel):
    """The answer of one exec run, with its redacted trace and accounting."""

    answer: str
    #: The CLI's events, redacted; earlier attempts appear as ``skillopt.retry`` markers.
    trace: list[dict[str, Any]]
    #: Commands run, files read, first errors, final answer, tokens or cost; capped in length.
    trace_digest: str
    #: Tokens of every attempt that reported them.
    usage: Usage
    cost_usd: float | None
    #: Wall-clock seconds over all attempts.
    latency_s: float
    attempts: int
    model: str | None
    exit_code: int
    num_turns: int | None = None
    #: The workspace, when ``options.keep_workspaces`` kept it.
    workspace_kept: Path | None = None


class ExecOptions(BaseModel):
    """Options every exec target takes (``model.target.options``)."""

    model_config = ConfigDict(extra="forbid")

    #: The CLI: a name looked up on PATH or a path (env: ``CODEX_EXEC_PATH`` / ``CLAUDE_CODE_EXEC_PATH``).
    path: str | None = None
    #: Where workspaces are created (default: the system temp folder).
    workspace_root: str | None = None
    keep_workspaces: Bool = False
    #: ``login``: the CLI's own login (visible only with ``use_real_home``); ``api_key``: pass the one key.
    auth: Literal["login", "api_key"] = "login"
    #: Give the CLI your real HOME (and so its login and config) instead of a private temp home.
    use_real_home: Bool = False
    #: Extra attempts after an ``ExecTimeout``.
    retries: int = Field(default=0, ge=0)
    #: Extra attempts after an ``EmptyAnswer``.
    empty_retries: int = Field(default=1, ge=0)
    trace_digest_chars: int = Field(default=4000, ge=200)
    #: Seconds between SIGTERM and SIGKILL when the time is up.
    kill_grace_s: float = Field(default=5.0, ge=0)
    #: CLIs of this backend running at once: the clients' limiter key ``exec:<backend>``.
    max_parallel: int = Field(default=4, ge=1)
    #: ``bwrap``: the CLI runs under bubblewrap, seeing only the system, its own installation, the
    #: workspace and its home (the run stops at preflight when no sandbox can be made); ``none``: no OS
    #: sandbox (warned on every run).
    workspace_sandbox: Literal["bwrap", "none"] = "bwrap"
    #: More folders the CLI needs inside the sandbox, read-only (e.g. a Node installation under ~/.nvm).
    sandbox_paths: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------------------------
# What a backend reads from its CLI


@dataclass
class CliOutput:
    """What a backend found in the CLI's output; the harness decides what it means."""

    events: list[dict[str, Any]]
    #: The final message: the only text that may become the answer.
    answer: str = ""
    #: A fatal error the CLI reported (an error event, ``is_error``), even with exit status 0.
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    model: str | None = None
    num_turns: int | None = None
    commands: list[str] = field(default_factory=list)
    files_read: list[str] = field(default_factory=list)
    #: Non-fatal errors seen on the way (failed commands, tool errors), for the digest.
    errors: list[str] = field(default_factory=list)


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines stream; any other line is kept as ``{"type": "text"}``."""
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        events.append(value if isinstance(value, dict) else {"type": "text", "text": line})
    return events


def count(reported: Mapping[str, Any], key: str) -> int | None:
    """An integer token count from a CLI's usage block, or None when it is not reported."""
    value = reported.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def add_usage(total: Usage, more: Usage) -> Usage:
    """The sum of two usages; a count neither reported stays ``None``."""
    def plus(a: int | None, b: int | None) -> int | None:
        return None if a is None and b is None else (a or 0) + (b or 0)

    return Usage(**{name: plus(getattr(total, name), getattr(more, name)) for name in Usage.model_fields})


# --------------------------------------------------------------------------------------------
# Workspaces


@dataclass(frozen=True)
class Workspace:
    """The folder one CLI run works in, and the HOME it sees."""

    root: Path
    home: Path
    #: Workspace copies of the task's image attachments, in order.
    images: tuple[Path, ...] = ()
    private_home: bool = True

    @property
    def last_message(self) -> Path:
        return self.root / LAST_MESSAGE

    @property
    def tmp(self) -> Path:
        return self.home / "tmp"


def _slug(text: str, limit: int) -> str:
    return (re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x")[:limit]


def _attachment_name(index: int, source: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", source.name).lstrip(".") or "file"
    return f"{index:02d}_{name}"


def ensure_outside(paths: Iterable[Path], protected: Sequence[Path], *, what: str) -> None:
    """Raise ``SecurityError`` when a path (symlinks resolved) lies in or equals a protected folder."""
    guarded = [Path(p).resolve() for p in protected]
    for path in paths:
        real = Path(path).resolve()
        for folder in guarded:
            if real == folder or real.is_relative_to(folder):
                raise SecurityError(
                    f"{what}: {path} resolves to {real}, inside the protected folder {folder} "
                    "(repository, run directory or dataset root); set model.target.options.workspace_root "
                    "to a folder outside them"
                )


def _write_workspace(root: Path, task: ExecTask, run_id: str,
                     skills_dir: str = "") -> tuple[Path, ...]:
    """Fill a new workspace; returns the workspace copies of the image attachments.

    ``SKILL.md`` holds the skill as a chat target sees it (``skill_render.render_inline``). A skill of
    several files is also installed as a folder under ``skills_dir/<name>/`` (where the CLI discovers
    skills), so the agent can load it and its reference files natively."""
    from skillopt.skill.files import has_file_markers
    from skillopt.skill.folder import skill_folder_files, skill_from_text, write_skill_folder
    from skillopt.skill.render import render_inline

    description = f"The skill to follow for the task in task.md (skillopt run {run_id})."
    (root / "SKILL.md").write_text(
        f"---\nname: skill\ndescription: {description}\n---\n\n{render_inline(task.skill)}",
        encoding="utf-8",
    )
    if skills_dir and has_file_markers(task.skill):
        name = skill_from_text(task.skill, default_name="skill").name
        write_skill_folder(skill_folder_files(task.skill, name=name, description=description),
                           root / skills_dir / name)
    (root / "task.md").write_text(task.task, encoding="utf-8")
    lines = ["# Attachments", ""]
    images = []
    if task.attachments:
        folder = root / "attachments"
        folder.mkdir()
        for index, source in enumerate(task.attachments, start=1):
            if not source.is_file():
                raise DataError(f"item {task.item_id}: attachment {source} is not a file")
            copy = folder / _attachment_name(index, source)
            shutil.copyfile(source, copy)  # content only: a symlinked source becomes a plain file
            kind = "image" if source in task.images else "file"
            lines.append(f"- `attachments/{copy.name}` ({kind}, {copy.stat().st_size} bytes)")
            if source in task.images:
                images.append(copy)
    else:
        lines.append("This task has no attachments.")
    (root / "ATTACHMENTS.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if task.declares_outputs:
        (root / "out").mkdir()
    return tuple(images)


# --------------------------------------------------------------------------------------------
# Processes


# --------------------------------------------------------------------------------------------
# The harness


@dataclass
class _Attempt:
    output: CliOutput
    outcome: ProcessOutcome
    trace: list[dict[str, Any]]
    digest: str
    workspace_kept: Path | None
    error: BackendError | None


class ExecHarness(ABC):
    """One exec target for one role; ``run`` is safe to call from several threads at once."""

    #: The backend's name (``codex_exec``).
    backend: str
    #: How users call the CLI (``codex``); also the default executable.
    cli: str
    #: The variable that may name the executable.
    path_env: str
    install_hint: str
    #: The one credential variable the CLI reads with ``auth: api_key``.
    credential_env: str
    #: How to log the CLI in, for the auth hint.
    login_command: str
    #: Arguments that print the help listing the flags this backend passes.
    help_args: tuple[str, ...] = ("--help",)
    #: Where (relative to its working folder) the CLI discovers project skills; "" = it has no such place.
    skills_dir: str = ""
    options_model: type[ExecOptions] = ExecOptions

    def __init__(self, role: ResolvedRole, secrets: SecretSource, context: BackendContext) -> None:
        self.role = role
        self.context = context
        try:
            self.options = self.options_model.model_validate(role.options)
        except ValidationError as exc:
            problems = "; ".join(
                f"model.{role.role}.options.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in exc.errors(include_input=False, include_url=False)
            )
            raise ConfigError(problems) from None
        self.redactor = Redactor.from_environment()
        self._credential: str | None = None
        if self.options.auth == "api_key":
            self._credential = require_key(role, resolve_key(role, secrets))
            self.redactor.add(self._credential)
        self.warn = WarnOnce()
        self._preflight: dict[str, Any] | None = None
        self._preflight_lock = threading.Lock()
        self._executable: str | None = None
        self._jail_paths: list[str] = []
        self._instructions = Template(load_prompt(TARGET_PROMPT))

    # ---- what a backend supplies

    @abstractmethod
    def command_args(self, ws: Workspace, task: ExecTask) -> list[str]:
        """The arguments after the executable, for this task in this workspace."""

    @abstractmethod
    def read_output(self, stdout: str, ws: Workspace) -> CliOutput:
        """The events, final message, usage and digest material of one run."""

    def adapt_to_help(self, help_text: str) -> None:
        """Choose optional flags by what the installed CLI lists (called once, at preflight)."""
        return None

    def help_values(self) -> list[str]:
        """Values (not flags) that the help text must list, e.g. a permission mode."""
        return []

    # ---- preflight

    def preflight(self) -> dict[str, Any]:
        """Check the CLI once per backend object: found, ``--version``, every flag in its help.

        Returns ``{"cli", "version", "flags_checked", "network", "auth", "home"}``; raises
        ``ConfigError`` naming a missing CLI (with an install hint) or a flag the help does not list.
        """
        with self._preflight_lock:
            if self._preflight is None:
                self._preflight = self._check_cli()
            return dict(self._preflight)

    def _check_cli(self) -> dict[str, Any]:
        wanted = self.options.path or self.cli
        found = shutil.which(wanted)
        if found is None:
            raise ConfigError(
                f"[{self.role.role}] {self.backend}: the {self.cli} CLI was not found (looked for {wanted!r} "
                f"on PATH); install it ({self.install_hint}) or set model.{self.role.role}.options.path or "
                f"{self.path_env}"
            )
        self._executable = found
        self._jail_paths = self._check_sandbox(found)
        version = self._probe(["--version"]).strip().splitlines()
        version_text = version[0] if version else "unknown version"
        help_text = self._probe(list(self.help_args))
        self.adapt_to_help(help_text)
        flags = self._flags_to_check()
        missing = [f for f in flags if not lists_flag(help_text, f)]
        missing += [v for v in self.help_values() if v not in help_text]
        if missing:
            raise ConfigError(
                f"[{self.role.role}] {self.backend}: {self.cli} {version_text} does not list "
                f"{', '.join(missing)} in `{self.cli} {' '.join(self.help_args)}`, and skillopt passes it; "
                f"upgrade the CLI ({self.install_hint})"
            )
        return {
            "cli": found, "version": version_text, "flags_checked": flags, "network": self._network(),
            "auth": self.options.auth, "home": "real" if self.options.use_real_home else "private",
            "sandbox": self.options.workspace_sandbox,
        }

    def _check_sandbox(self, executable: str) -> list[str]:
        """Fail closed when the workspace sandbox is on and none can be made; warn when it is off.
        Returns the folders bound read-only for the CLI: its installation and its interpreter's."""
        where = f"model.{self.role.role}.options.workspace_sandbox"
        if self.options.workspace_sandbox == "none":
            log.warning("[%s] %s: %s is none: the CLI and the commands it runs see your files without an OS "
                        "sandbox", self.role.role, self.backend, where)
            return []
        status = sandbox_status()
        if not status.available:
            raise ConfigError(
                f"[{self.role.role}] {self.backend}: the CLI's workspace runs under an OS sandbox and none "
                f"can be made: {status.detail}. Fix: {SANDBOX_FIX.replace('benchmark.sandbox', where)}"
            )
        return installation_paths(executable) + [str(Path(p).resolve()) for p in self.options.sandbox_paths]

    def _network(self) -> bool:
        return False

    def _flags_to_check(self) -> list[str]:
        """Every flag this backend may pass, read off the command line of a task that uses them all."""
        probe = ExecTask(item_id="preflight", skill="", task="", attachments=[Path("probe.png")],
                         images=[Path("probe.png")], declares_outputs=True)
        ws = Workspace(
            root=Path("WORKSPACE"), home=Path("HOME"), images=(Path("WORKSPACE/attachments/01_probe.png"),)
        )
        flags = [a for a in self.command_args(ws, probe) if a.startswith("-") and a not in ("-", "--")]
        return list(dict.fromkeys(flags))

    def _probe(self, args: list[str]) -> str:
        assert self._executable is not None
        with scratch_folder("skillopt-home-") as home:
            argv = [self._executable, *args]
            try:  # in its own process group: a CLI that hangs leaves no child of its own behind
                proc = run_in_group(
                    argv, timeout_s=_PROBE_TIMEOUT_S, cwd=home, stdin=subprocess.DEVNULL, encoding="utf-8",
                    errors="replace", env=self._child_env(Workspace(root=Path(home), home=Path(home))),
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ConfigError(f"[{self.role.role}] {self.backend}: `{self.cli} {' '.join(args)}` failed: "
                                  f"{exc}") from None
        if proc.returncode != 0:
            stderr = self.redactor(proc.stderr)[-500:]
            raise ConfigError(
                f"[{self.role.role}] {self.backend}: `{self.cli} {' '.join(args)}` exited with status "
                f"{proc.returncode}: {stderr.strip()}"
            )
        return proc.stdout

    # ---- runs

    def run(self, task: ExecTask) -> ExecResult:
        """Run the CLI on one item and return its final message as the answer.

        Raises ``ExecTimeout`` (after ``options.retries`` extra attempts), ``EmptyAnswer`` (after
        ``options.empty_retries``), ``ExecError`` (non-zero exit, a CLI-reported error or auth text;
        never retried), ``SecurityError`` (the path guard, before launch), ``ConfigError``
        (preflight) or ``DataError`` (an attachment that is not a file).
        """
        self.preflight()
        started = time.monotonic()
        done: list[_Attempt] = []
        while True:
            attempt = self._attempt(task)
            done.append(attempt)
            error = attempt.error
            if error is None:
                return self._result(done, time.monotonic() - started)
            error.attempts = len(done)
            vars(error).update(trace=attempt.trace, trace_digest=attempt.digest)
            allowed = {ExecTimeout: self.options.retries, EmptyAnswer: self.options.empty_retries}.get(
                type(error), 0
            )
            if sum(type(a.error) is type(error) for a in done) > allowed:
                raise error
            log.warning("[%s] %s: item %s: %s; retrying (attempt %d)", self.role.role, self.backend,
                        task.item_id, type(error).__name__, len(done) + 1)

    def _result(self, done: list[_Attempt], latency_s: float) -> ExecResult:
        last = done[-1]
        # Only an answered attempt ends the run, and one killed at the wall clock is an ExecTimeout.
        assert last.outcome.exit_code is not None
        usage = Usage()
        costs = [a.output.cost_usd for a in done if a.output.cost_usd is not None]
        for attempt in done:
            usage = add_usage(usage, attempt.output.usage)
        retried = [{"type": "skillopt.retry", "attempt": i, "error": type(a.error).__name__}
                   for i, a in enumerate(done[:-1], start=1)]
        return ExecResult(
            answer=last.output.answer.strip(),
            trace=retried + last.trace,
            trace_digest=last.digest,
            usage=usage,
            cost_usd=sum(costs) if costs else None,
            latency_s=latency_s,
            attempts=len(done),
            model=last.output.model or self.role.model,
            exit_code=last.outcome.exit_code,
            num_turns=last.output.num_turns,
            workspace_kept=last.workspace_kept,
        )

    def _attempt(self, task: ExecTask) -> _Attempt:
        ws = self._make_workspace(task)
        try:
            assert self._executable is not None
            argv = [self._executable, *self.command_args(ws, task)]
            handed = [Path(a) for a in argv[1:] if os.path.isabs(a)]
            ensure_outside(
                [ws.root, ws.home, *handed], self.context.protected_paths, what=f"item {task.item_id}"
            )
            outputs = "Write the output files the task asks for into `out/`." if task.declares_outputs else ""
            jailed = self.options.workspace_sandbox == "bwrap"
            try:
                # Under bwrap the CLI keeps the network (it must reach its model API) but sees only the
                # system, its installation, the workspace and its home.
                outcome = run_confined(
                    [*limits_prefix(), *argv] if jailed else argv, workspace=ws.root, env=self._child_env(ws),
                    read_only=self._jail_paths, writable=[str(ws.home)], network=True,
                    stdin_text=self._instructions.substitute(outputs=outputs), timeout_s=self.role.timeout_s,
                    grace_s=self.options.kill_grace_s, keep_bytes=_KEEP_OUTPUT_BYTES,
                    mode=self.options.workspace_sandbox,
                )
            except OSError as exc:
                raise ExecError(
                    f"item {task.item_id}: could not start {self.cli}: {exc}",
                    role=self.role.role,
                    backend=self.backend,
                    model=self.role.model,
                    stage="rollout",
                ) from None
            output = self.read_output(outcome.stdout, ws)
            output.files_read += [
                f for f in _files_in(output.commands, ws.root) if f not in output.files_read
            ]
            trace = self._redact_events(output.events)
            if outcome.stderr.strip():
                trace.append({"type": "skillopt.stderr", "text": self._stderr_tail(outcome.stderr)})
            error = self._classify(task, outcome, output)
            kept = ws.root if self.options.keep_workspaces else None
            return _Attempt(output, outcome, trace, self._digest(output, answered=error is None), kept, error)
        finally:
            self._cleanup(ws)

    def _classify(self, task: ExecTask, outcome: ProcessOutcome, output: CliOutput) -> BackendError | None:
        """The error this attempt ends with, or None for an answer."""
        context: ErrorContext = {"role": self.role.role, "backend": self.backend, "model": self.role.model,
                                 "stage": "rollout"}
        if outcome.timed_out:
            return ExecTimeout(
                f"item {task.item_id}: {self.cli} gave no answer within {self.role.timeout_s:g} s; its "
                "process group was killed", hint=f"raise model.{self.role.role}.timeout_s", **context,
            )
        stderr = self._stderr_tail(outcome.stderr)
        reported = self.redactor(output.error)[:500] if output.error else None
        auth = bool(_AUTH_TEXT.search(outcome.stderr) or (output.error and _AUTH_TEXT.search(output.error)))
        if outcome.exit_code != 0 or reported or auth:
            cause = (
                f"exited with status {outcome.exit_code}"
                if outcome.exit_code != 0
                else "reported an authentication problem"
                if auth and not reported
                else "reported an error"
            )
            message = f"item {task.item_id}: {self.cli} {cause}"
            if reported:
                message += f": {reported}"
            if stderr.strip():
                message += f"; stderr: {stderr.strip()}"
            return ExecError(message, hint=self._auth_hint() if auth else None, **context)
        if not output.answer.strip():
            return EmptyAnswer(f"item {task.item_id}: {self.cli} finished without a final message", **context)
        return None

    def _auth_hint(self) -> str:
        if self.options.auth == "api_key":
            return f"the CLI rejected the key; check {self.role.api_key_env or self.credential_env}"
        return (
            "the CLI could not authenticate: with options.auth: login it sees your login "
            f"({self.login_command}) only with options.use_real_home: true; or set options.auth: api_key and "
            f"export {self.role.api_key_env or self.credential_env}"
        )

    # ---- pieces of an attempt

    def _make_workspace(self, task: ExecTask) -> Workspace:
        root = (
            Path(self.options.workspace_root) if self.options.workspace_root else Path(tempfile.gettempdir())
        )
        ensure_outside(
            [root], self.context.protected_paths, what=f"model.{self.role.role}.options.workspace_root"
        )
        root.mkdir(parents=True, exist_ok=True)
        prefix = f"skillopt-{_slug(self.context.run_id, 8)}-{_slug(task.item_id, 40)}-"
        # Removed when skillopt exits while the attempt still runs (Ctrl-C, an error): created through the
        # clean-up's list, so an exit while they are being made leaves none behind; ``_cleanup`` forgets
        # them. A workspace kept on purpose is left alone.
        keep = self.options.keep_workspaces
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root)) if keep else temp_folder(prefix, dir=root)
        ws = Workspace(root=folder, home=Path(os.environ.get("HOME") or Path.home()), private_home=False)
        try:
            if not self.options.use_real_home:
                ws = replace(ws, home=temp_folder("skillopt-home-"), private_home=True)
                ws.tmp.mkdir()
            return replace(ws, images=_write_workspace(folder, task, self.context.run_id, self.skills_dir))
        except BaseException as error:
            self._cleanup(ws, keep=False)
            if exiting() and not isinstance(error, Exiting):  # the clean-up at exit removed the folders
                raise Exiting(f"skillopt is exiting: item {task.item_id} is not started") from error
            raise

    def _child_env(self, ws: Workspace) -> dict[str, str]:
        """The allowlist: PATH, HOME, TMPDIR, LC_ALL, plus the one credential with ``auth: api_key``."""
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": str(ws.home),
            "TMPDIR": str(ws.tmp)
            if ws.private_home and ws.tmp.is_dir()
            else os.environ.get("TMPDIR", tempfile.gettempdir()),
            "LC_ALL": "C.UTF-8",
        }
        if os.name == "nt":  # pragma: no cover - what Windows programs cannot start without
            env.update({k: os.environ[k] for k in ("SYSTEMROOT", "PATHEXT", "COMSPEC") if k in os.environ})
            env["USERPROFILE"] = env["HOME"]
        if self._credential is not None:
            env[self.credential_env] = self._credential
        return env

    @staticmethod
    def _removable(ws: Workspace, *, keep: bool) -> list[Path]:
        """The folders of ``ws`` removed after the attempt: the workspace unless kept, a private home."""
        return ([] if keep else [ws.root]) + ([ws.home] if ws.private_home else [])

    def _cleanup(self, ws: Workspace, *, keep: bool | None = None) -> None:
        keep = self.options.keep_workspaces if keep is None else keep
        for path in self._removable(ws, keep=keep):
            try:
                shutil.rmtree(path)
            except FileNotFoundError:  # already removed by the clean-up at exit (``end_leftovers``)
                pass
            except OSError as exc:
                log.warning("could not remove the exec workspace %s: %s", path, exc)
            keep_at_exit(path)

    def _stderr_tail(self, stderr: str) -> str:
        return self.redactor(stderr)[-STDERR_LIMIT:]

    def _redact_events(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        redacted = json.loads(self.redactor(json.dumps(events, ensure_ascii=False, default=str)))
        return list(redacted)

    def _digest(self, output: CliOutput, *, answered: bool) -> str:
        """Commands run, files read, first errors, final answer, tokens or cost; at most the configured size.

        A failed attempt shows no final answer: what a failed child left behind is never an answer.
        """
        limit = self.options.trace_digest_chars
        usage = output.usage
        spend = [f"tokens: prompt {usage.prompt_tokens}, completion {usage.completion_tokens}"]
        if usage.cached_prompt_tokens is not None:
            spend.append(f"cached {usage.cached_prompt_tokens}")
        if output.cost_usd is not None:
            spend.append(f"cost ${output.cost_usd:.4f}")
        if output.num_turns is not None:
            spend.append(f"turns {output.num_turns}")
        answer = (output.answer.strip() if answered else "") or "(none)"
        tail = f"final answer:\n{answer[: limit // 2]}\n{', '.join(spend)}"
        errors = output.errors + ([output.error] if output.error else [])
        sections = [
            ("commands run", output.commands),
            ("files read", output.files_read),
            ("first errors", errors[:5]),
        ]
        head: list[str] = []
        budget = limit - len(tail) - 1
        for title, items in sections:
            for line in [f"{title}:"] + [f"- {' '.join(str(i).split())[:200]}" for i in items or ["(none)"]]:
                if len(line) + 1 > budget:
                    break
                head.append(line)
                budget -= len(line) + 1
        return self.redactor("\n".join([*head, tail]))[:limit]


def installation_paths(executable: str) -> list[str]:
    """The folders a CLI needs to run, outside ``/usr``: the folder of its real file (the whole package when
    that is a Node package's ``bin/``) and, for a script, its interpreter's installation (``#!/x/bin/python``
    or ``#!/usr/bin/env node``), both as named and resolved (a virtualenv and the Python behind it)."""
    real = Path(executable).resolve()
    package = real.parent.parent
    found = [package if real.parent.name == "bin" and (package / "package.json").is_file() else real.parent]
    try:
        with open(real, "rb") as file:
            first = file.readline(512)
    except OSError:
        first = b""
    if first.startswith(b"#!"):
        words = first[2:].decode("utf-8", errors="replace").split()
        interpreter = words[0] if words else ""
        if Path(interpreter).name == "env" and len(words) > 1:
            interpreter = shutil.which(words[1]) or ""
        if interpreter:
            found += [Path(interpreter).parent.parent, Path(interpreter).resolve().parent.parent]
    kept: list[str] = []
    for folder in sorted({str(p) for p in found}):
        if (
            folder in ("/", "/usr")
            or folder.startswith("/usr/")
            or any(folder.startswith(k + "/") for k in kept)
        ):
            continue
        kept.append(folder)
    return kept


def lists_flag(help_text: str, flag: str) -> bool:
    """Whether ``flag`` appears in a help text as a whole option (``-i`` is not ``--image``'s prefix)."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


def _files_in(commands: list[str], root: Path) -> list[str]:
    """Workspace files that shell commands name (``bash -lc 'cat SKILL.md'`` → ``SKILL.md``)."""
    found: list[str] = []
    real_root = root.resolve()
    for command in commands:
        for token in re.findall(r"[\w./-]+", command):
            try:
                relative = (root / token).resolve().relative_to(real_root)
            except (ValueError, OSError):
                continue
            if relative.parts and (real_root / relative).is_file():
                found.append(relative.as_posix())
    return list(dict.fromkeys(found))
