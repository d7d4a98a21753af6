"""Fake ``codex`` and ``claude`` CLIs for offline tests; stdlib only.

The ``codex`` and ``claude`` scripts next to this file call ``main(<cli>)``. They answer
``--version`` and their help command, and otherwise run one scenario:

- ``answer``: read ``SKILL.md`` and ``task.md`` from the working directory and answer
  ``ANSWER skill-lines=<n> task=<first line of task.md>``, with JSON events and usage;
- ``auth_fail``: auth error text on stderr (echoing the credential variable, if set), a would-be
  answer on stdout and in the last-message file, exit 1;
- ``sleep``: one event, then a grandchild that sleeps (its pid goes to ``grandchild.pid``), SIGTERM
  ignored, sleep far past any test timeout;
- ``empty``: exit 0 with an empty final message;
- ``read_outside``: look for ways out of the workspace and answer with a JSON report of them;
- ``is_error``: the CLI reports an error with exit status 0 (claude: ``is_error: true``);
- ``old_help``: like ``answer``, but the help text lacks a flag the harness passes.
- ``images``: answer ``<answer>IMAGES <names></answer>``, the images the CLI was given: codex's
  ``-i`` files, claude's image attachments (read off ``ATTACHMENTS.md``, the way a model would).
- ``jail_report``: like a hostile tool call, try the paths ``task.md`` names on ``READ=`` and ``WRITE=``
  lines, look at ``/`` and at pid 1's environment, start a ``setsid`` daemon, and answer with a JSON
  report (what was read, written, seen, and the pid namespace).

Like the real codex, the fake refuses an ``-i`` file that does not exist or is no PNG/JPEG/GIF/WebP
(exit 1, an error on stderr) before doing anything else.

The scenario comes from ``FAKE_CLI_SCENARIO`` or, since the exec harness gives the CLI only an
allowlisted environment, from ``scenario.txt`` next to this file (tests write it into a temp copy
of this folder). Every call is appended to ``calls.jsonl`` next to this file: argv, cwd, stdin, the
*names* of the environment variables (never values) and the workspace files with their text. Inside
an OS sandbox this folder is read-only, so nothing is recorded there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CODEX_VERSION = "codex-cli 0.46.0"
CODEX_EXEC_HELP = """Run Codex non-interactively

Usage: codex exec [OPTIONS] [PROMPT] [COMMAND]

Commands:
  resume  Resume a previous session by id or pick the most recent with --last
  help    Print this message or the help of the given subcommand(s)

Arguments:
  [PROMPT]
          Initial instructions for the agent. If not provided as an argument (or if `-` is used),
          instructions are read from stdin

Options:
  -c, --config <key=value>
          Override a configuration value that would otherwise be loaded from `~/.codex/config.toml`
  -i, --image <FILE>...
          Optional image(s) to attach to the initial prompt
  -m, --model <MODEL>
          Model the agent should use
      --oss
          Convenience flag to select the local open source model provider
  -s, --sandbox <SANDBOX_MODE>
          Select the sandbox policy to use when executing model-generated shell commands
          [possible values: read-only, workspace-write, danger-full-access]
  -p, --profile <CONFIG_PROFILE>
          Configuration profile from config.toml to specify default options
      --full-auto
          Convenience alias for low-friction sandboxed automatic execution
  -C, --cd <DIR>
          Tell the agent to use the specified directory as its working root
      --skip-git-repo-check
          Allow running Codex outside a Git repository
      --output-schema <FILE>
          Path to a JSON Schema file describing the model's final response shape
      --color <COLOR>
          Specifies color settings for use in the output [default: auto]
      --json
          Print events to stdout as JSONL
  -o, --output-last-message <FILE>
          Specifies file where the last message from the agent should be written
  -h, --help
          Print help (see a summary with '-h')
  -V, --version
          Print version
"""

CLAUDE_VERSION = "2.0.14 (Claude Code)"
CLAUDE_HELP = """Usage: claude [options] [command] [prompt]

Claude Code - starts an interactive session by default, use -p/--print for non-interactive output

Options:
  -d, --debug [filter]                 Enable debug mode
  --verbose                            Override verbose mode setting from config
  -p, --print                          Print response and exit (useful for pipes)
  --output-format <format>             Output format (only works with --print): "text" (default), "json", or
                                       "stream-json" (choices: "text", "json", "stream-json")
  --max-turns <turns>                  Maximum number of agentic turns in non-interactive mode
  --allowedTools, --allowed-tools <tools...>
                                       Comma or space-separated list of tool names to allow (e.g. "Bash(git:*)
                                       Edit")
  --disallowedTools, --disallowed-tools <tools...>
                                       Comma or space-separated list of tool names to deny (e.g. "Bash(git:*)
                                       Edit")
  --permission-mode <mode>             Permission mode to use for the session (choices: "acceptEdits",
                                       "bypassPermissions", "default", "dontAsk", "plan")
  --model <model>                      Model for the current session
  --effort <level>                     Effort level for the current session (choices: "low", "medium", "high",
                                       "max")
  --add-dir <directories...>           Additional directories to allow tool access to
  -v, --version                        Output the version number
  -h, --help                           Display help for command
"""

# What the ``old_help`` scenario leaves out of each CLI's help.
OLD_HELP_DROPS = {"codex": ("--output-last-message",), "claude": ("--disallowedTools", "dontAsk")}


def scenario() -> str:
    named = os.environ.get("FAKE_CLI_SCENARIO")
    if named:
        return named
    path = HERE / "scenario.txt"
    return path.read_text(encoding="utf-8").strip() if path.is_file() else "answer"


def workspace_files(root: Path) -> dict[str, str]:
    files = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            files[name] = f"<symlink to {os.readlink(path)}>"
        elif path.is_dir():
            files[name + "/"] = ""
        else:
            data = path.read_bytes()
            try:
                files[name] = data.decode("utf-8")
            except UnicodeDecodeError:
                files[name] = f"<binary {len(data)} bytes>"
    return files


def record(cli: str, argv: list[str], stdin: str | None, name: str) -> None:
    entry = {
        "cli": cli, "argv": argv, "cwd": os.getcwd(), "stdin": stdin, "scenario": name,
        "env_names": sorted(os.environ), "files": workspace_files(Path.cwd()) if stdin is not None else {},
    }
    try:
        with (HERE / "calls.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError:  # under the OS sandbox this folder is read-only
        pass


def emit(event: dict) -> None:
    print(json.dumps(event), flush=True)


def proof_of_reading() -> str:
    skill = Path("SKILL.md").read_text(encoding="utf-8")
    task = Path("task.md").read_text(encoding="utf-8")
    first = task.splitlines()[0] if task else ""
    return f"ANSWER skill-lines={len(skill.splitlines())} task={first}"


def outside_report() -> str:
    root = Path.cwd().resolve()
    escapes = []
    for path in root.rglob("*"):
        if path.is_symlink() or not path.resolve().is_relative_to(root):
            escapes.append(path.relative_to(root).as_posix())
    markers = [m for m in ("pyproject.toml", ".git", "skillopt") if (root / m).exists()]
    return json.dumps({"escapes": escapes, "parent": str(root.parent), "repo_markers": markers})


def jail_report() -> str:
    task = Path("task.md").read_text(encoding="utf-8")
    report: dict[str, object] = {"root": sorted(os.listdir("/")), "home": os.environ.get("HOME")}
    for line in task.splitlines():
        kind, _, path = line.partition("=")
        if kind == "READ":
            try:
                report.setdefault("read", {})[path] = Path(path).read_text(encoding="utf-8")  # type: ignore[index]
            except OSError as exc:
                report.setdefault("read", {})[path] = type(exc).__name__  # type: ignore[index]
        elif kind == "WRITE":
            try:
                Path(path).write_text("escaped", encoding="utf-8")
                report.setdefault("wrote", []).append(path)  # type: ignore[union-attr]
            except OSError as exc:
                report.setdefault("write_errors", []).append(type(exc).__name__)  # type: ignore[union-attr]
    try:
        report["pid1_environ"] = Path("/proc/1/environ").read_bytes().decode(errors="replace")
    except OSError as exc:
        report["pid1_environ"] = type(exc).__name__
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report["daemon_pid"] = daemon.pid
    report["pid_namespace"] = os.readlink("/proc/self/ns/pid")
    return json.dumps(report)


def sleep_forever() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (HERE / "grandchild.pid").write_text(str(child.pid), encoding="utf-8")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # make the harness escalate to SIGKILL
    time.sleep(120)


def value_after(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


IMAGE_SIGNATURES = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF")


def image_flags(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("-i", "--image")]


def bad_image(path: str) -> str | None:
    """Why codex would refuse an ``-i`` file, or None."""
    file = Path(path)
    if not file.is_file():
        return f"image not found: {path}"
    if not file.read_bytes().startswith(IMAGE_SIGNATURES):
        return f"not a supported image: {path}"
    return None


def attached_images() -> list[str]:
    """The image attachments ATTACHMENTS.md lists (claude reads the images it is told about)."""
    listing = Path("ATTACHMENTS.md").read_text(encoding="utf-8") if Path("ATTACHMENTS.md").is_file() else ""
    return [
        line.split("`")[1] for line in listing.splitlines() if line.startswith("- `") and "(image," in line
    ]


def codex_run(argv: list[str], name: str) -> int:
    for path in image_flags(argv):
        problem = bad_image(path)
        if problem:
            print(f"Error: {problem}", file=sys.stderr)
            return 1
    last_message = Path(value_after(argv, "--output-last-message") or ".last_message")
    usage = {
        "input_tokens": 1200,
        "cached_input_tokens": 200,
        "output_tokens": 40,
        "reasoning_output_tokens": 8,
    }
    emit({"type": "thread.started", "thread_id": "fake-thread"})
    if name == "sleep":
        sleep_forever()
    if name == "auth_fail":
        key = os.environ.get("OPENAI_API_KEY", "none")
        print("ANSWER from a failed child", flush=True)
        last_message.write_text("ANSWER from a failed child", encoding="utf-8")
        print(
            f"ERROR: unexpected status 401 Unauthorized: Incorrect API key provided: {key}", file=sys.stderr
        )
        return 1
    if name == "is_error":
        emit({"type": "turn.failed", "error": {"message": "stream disconnected before completion"}})
        return 0
    answer = {"empty": "", "read_outside": None}.get(name, proof_of_reading())
    answer = outside_report() if answer is None else answer
    if name == "jail_report":
        answer = jail_report()
    if name == "images":
        answer = "<answer>IMAGES " + ",".join(Path(p).name for p in image_flags(argv)) + "</answer>"
    emit({"type": "turn.started"})
    for command in ("bash -lc 'cat SKILL.md'", "bash -lc 'cat task.md'"):
        emit(
            {
                "type": "item.completed",
                "item": {
                    "id": "i1",
                    "type": "command_execution",
                    "command": command,
                    "aggregated_output": "...",
                    "exit_code": 0,
                    "status": "completed",
                },
            }
        )
    emit({"type": "item.completed", "item": {"id": "i2", "type": "agent_message", "text": answer}})
    emit({"type": "turn.completed", "usage": usage})
    last_message.write_text(answer, encoding="utf-8")
    return 0


def claude_run(argv: list[str], name: str) -> int:
    emit(
        {"type": "system", "subtype": "init", "cwd": os.getcwd(), "model": "claude-fake-1", "tools": ["Read"]}
    )
    if name == "sleep":
        sleep_forever()
    if name == "auth_fail":
        key = os.environ.get("ANTHROPIC_API_KEY", "none")
        print("ANSWER from a failed child", flush=True)
        print(f"Invalid API key · Please run /login ({key})", file=sys.stderr)
        return 1
    skill_path = str(Path.cwd() / "SKILL.md")
    emit({"type": "assistant", "message": {"model": "claude-fake-1", "content": [
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": skill_path}}]}})
    emit(
        {
            "type": "user",
            "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "content": "..."}]},
        }
    )
    usage = {"input_tokens": 30, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200,
             "output_tokens": 50}
    result = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "num_turns": 3,
        "total_cost_usd": 0.0123,
        "usage": usage,
        "session_id": "fake",
    }
    if name == "is_error":
        result.update(is_error=True, result="API Error: 500 Internal server error")
    elif name == "empty":
        result["result"] = ""
    elif name == "read_outside":
        result["result"] = outside_report()
    elif name == "images":
        result["result"] = "<answer>IMAGES " + ",".join(Path(p).name for p in attached_images()) + "</answer>"
    else:
        result["result"] = proof_of_reading()
    emit(result)
    return 0


def main(cli: str) -> int:
    argv = sys.argv[1:]
    name = scenario()
    if argv == ["--version"]:
        record(cli, argv, None, name)
        print(CODEX_VERSION if cli == "codex" else CLAUDE_VERSION)
        return 0
    if "--help" in argv:
        record(cli, argv, None, name)
        text = CODEX_EXEC_HELP if cli == "codex" else CLAUDE_HELP
        if name == "old_help":
            text = "\n".join(line for line in text.splitlines()
                             if not any(d in line for d in OLD_HELP_DROPS[cli]))
        print(text)
        return 0
    stdin = sys.stdin.read()
    record(cli, argv, stdin, name)
    return codex_run(argv, name) if cli == "codex" else claude_run(argv, name)
