"""Every command of README.md and docs/quickstart.md runs as written, in order, on a copy of the repository.

The commands are read from the documents' ```bash blocks (one command per line; `#` starts a comment), and
the files they refer to from ```yaml blocks whose first line names the file (`# my.yaml`). They run against
the scripted backend and a Prefect server of their own (`skillopt server start` in the quickstart, with a
fresh `PREFECT_HOME`), in a copy of the tracked files, with the test's virtual environment first on PATH.

A block whose first line says "in a second terminal" runs in the background, as a person would leave it
running, until the end; the next command waits for its `start a run:` line. `export NAME=VALUE` lines set
the variable for the commands after them.

Commands that cannot run here are skipped by the reviewed allow-list ``SKIPPED`` below, each with the reason;
a command that is not in the documents any more fails the test (so the list cannot go stale).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/quickstart.md")

#: Commands (exact lines, comments removed) that this test does not run, and why.
SKIPPED: dict[str, str] = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]'":
        "installs from PyPI; the test runs in the virtual environment already installed (its bin first on "
        "PATH)",
    "python3 -m venv .venv": "as above: the test's virtual environment stands in for it",
    ". .venv/bin/activate": "as above",
    "pip install -e '.[dev]'": "as above",
    "python -m pytest": "the test suite itself",
    "export OPENAI_API_KEY=...": "needs a real key; none exists here",
    "skillopt backends check": "makes one real call per role: needs a key and the network",
    "skillopt train qa --data examples/qa/my_items.jsonl --backend openai --model gpt-4.1-mini":
        "needs an OpenAI key and the network",
    "skillopt train qa --data examples/qa/my_items.jsonl --backend openai --model gpt-4.1-mini "
    "--run-name first-real": "needs an OpenAI key and the network",
    "python scripts/materialize_searchqa.py --manifest searchqa_ids.json --out_dir data/searchqa_split":
        "downloads from Hugging Face",
    "python scripts/download_babyvision.py --out_dir data/babyvision": "downloads from Hugging Face",
    "cp .env.example .env": "part of the Docker Compose recipe below",
    "docker compose up -d": "needs a Docker engine (this machine has only the CLI)",
}
BACKGROUND_MARK = "in a second terminal"
READY_LINE = "start a run:"


def document_steps() -> list[tuple[str, str, str]]:
    """(document, kind, text) in order: kind "run" (one command), "background" (one command) or "file"
    (text is "name\\ncontent")."""
    steps = []
    for name in DOCUMENTS:
        text = (ROOT / name).read_text(encoding="utf-8")
        for language, body in re.findall(r"^```(\w+)\n(.*?)^```", text, re.S | re.M):
            lines = body.splitlines()
            if language == "yaml" and lines and re.fullmatch(r"# [\w.-]+\.ya?ml", lines[0].strip()):
                steps.append((name, "file", f"{lines[0].strip()[2:]}\n{body}"))
            if language != "bash":
                continue
            background = bool(lines) and BACKGROUND_MARK in lines[0]
            for line in lines:
                command = _without_comment(line).strip()
                if command:
                    steps.append((name, "background" if background else "run", command))
    return steps


def _without_comment(line: str) -> str:
    """The line up to a `#` that starts a comment (after whitespace, outside quotes)."""
    quote = None
    for index, char in enumerate(line):
        if char in "'\"" and quote in (None, char):
            quote = None if quote else char
        elif char == "#" and quote is None and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def _copy_of_the_repository(target: Path) -> None:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for relative in filter(None, tracked.decode().split("\0")):
        source = ROOT / relative
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            destination.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, destination)


def test_the_skip_list_names_only_commands_the_documents_have():
    commands = {text for _, kind, text in document_steps() if kind != "file"}
    assert set(SKIPPED) <= commands, sorted(set(SKIPPED) - commands)


@pytest.mark.slow
def test_every_command_of_the_readme_and_the_quickstart_runs_as_written(tmp_path: Path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy the tracked files")
    work = tmp_path / "repo"
    _copy_of_the_repository(work)
    env = {key: value for key, value in os.environ.items()
           if not key.endswith("_API_KEY") and not key.startswith("PREFECT_")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    background: list[tuple[str, subprocess.Popen, Path]] = []
    ran: list[str] = []
    try:
        for document, kind, text in document_steps():
            if kind == "file":
                name, content = text.split("\n", 1)
                (work / name).write_text(content, encoding="utf-8")
                continue
            if text in SKIPPED:
                continue
            if kind == "background":
                log = tmp_path / f"background-{len(background)}.log"
                with log.open("w") as sink:
                    process = subprocess.Popen(["bash", "-c", text], cwd=work, env=dict(env), stdout=sink,
                                               stderr=subprocess.STDOUT, start_new_session=True)
                background.append((text, process, log))
                continue
            _wait_until_ready(background)
            export = re.fullmatch(r"export ([A-Z_][A-Z0-9_]*)=(.*)", text)
            if export:
                value = subprocess.run(["bash", "-c", f"printf %s {export.group(2)}"], cwd=work, env=env,
                                       capture_output=True, text=True, timeout=120)
                assert value.returncode == 0 and value.stdout, f"{document}: {text}\n{value.stderr}"
                env[export.group(1)] = value.stdout
                ran.append(text)
                continue
            done = subprocess.run(["bash", "-c", text], cwd=work, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0, (f"{document}: `{text}` exited {done.returncode}\n"
                                          f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            ran.append(text)
    finally:
        for _, process, _ in background:  # Ctrl-C, as the person in the second terminal would
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
        subprocess.run(["bash", "-c", "skillopt server stop"], cwd=work, env=env, capture_output=True,
                       timeout=120)
    assert any(command.startswith("skillopt demo") for command in ran)
    assert any(command.startswith("prefect deployment run") for command in ran)


def _wait_until_ready(background: list[tuple[str, subprocess.Popen, Path]], timeout_s: float = 300) -> None:
    for text, process, log in background:
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in log.read_text(errors="replace"):
            assert process.poll() is None, f"`{text}` exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, \
                f"`{text}` never said {READY_LINE!r}:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
