"""The sandbox target-written code runs in: each test runs a small hostile
script through :func:`run_sandboxed` and checks that it is stopped or refused with a clear reason,
and that nothing outside the sandbox changed."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest

from skillopt.sandbox.confine import SandboxResult, run_sandboxed


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "workspace"
    folder.mkdir()
    (folder / "data.txt").write_text("original", encoding="utf-8")
    return folder


def run(code: str, workspace: Path, *, timeout_s: float = 20, mem_mb: int = 512, **kwargs) -> SandboxResult:
    return run_sandboxed(["-c", code], workspace, timeout_s, mem_mb, **kwargs)


def live_processes_with(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(pid)
    return found


def test_a_clean_script_runs_in_a_copy_and_returns_the_collected_files(workspace):
    code = "open('data.txt','w').write('changed'); open('out.txt','w').write('result'); print('done')"
    result = run(code, workspace, collect=["out.txt", "missing.txt"])
    assert result.ok and result.reason == "" and result.stdout.strip() == "done"
    assert result.outputs == {"out.txt": b"result"}
    # The script worked on a temporary copy: the workspace itself is unchanged.
    assert (workspace / "data.txt").read_text(encoding="utf-8") == "original"
    assert sorted(p.name for p in workspace.iterdir()) == ["data.txt"]


def test_an_endless_loop_is_killed_at_the_wall_clock_limit_with_no_orphan(workspace):
    marker = f"loop-{uuid.uuid4().hex}"
    result = run(f"# {marker}\nwhile True:\n    pass", workspace, timeout_s=1.5)
    assert result.timed_out and result.exit_code is None and not result.ok
    assert result.kill is not None and result.kill.kind == "time"
    assert result.reason.startswith("time limit: the 1.5 s wall-clock limit was reached")
    assert "process group was killed" in result.reason
    assert result.duration_s < 10
    assert live_processes_with(marker) == []


def test_a_sleep_past_the_limit_is_stopped_too(workspace):
    result = run("import time; time.sleep(60)", workspace, timeout_s=1)
    assert result.timed_out and result.duration_s < 10


def test_allocating_more_than_the_memory_limit_fails_with_a_memory_reason(workspace):
    result = run("block = bytearray(1024 * 1024 * 1024)", workspace, mem_mb=256)
    assert result.killed_for_memory and not result.ok
    assert result.reason.startswith("out of memory:") and "256 MiB" in result.reason


def test_growing_past_the_memory_limit_is_a_memory_error_with_its_traceback(workspace):
    grow = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))"
    result = run(grow, workspace, mem_mb=256)
    assert result.killed_for_memory and result.exit_code == 1
    assert result.reason == "out of memory: the 256 MiB memory limit was reached (MemoryError)"
    assert 'File "<string>", line 3' in result.stderr  # the target still sees where


@pytest.mark.parametrize(
    "code",
    [
        # C code that does not check malloc's NULL: before, a segmentation fault (exit 139) that said
        # nothing about memory.
        "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\n"
        "libc.malloc.argtypes = [ctypes.c_size_t]\nsize = 8 * 1024**3\n"
        "ctypes.memset(libc.malloc(size), 1, size)",
        "import numpy\nnumpy.ones(1024**3)",
        "block = bytearray(8 * 1024**3)",
    ],
)
def test_an_8_gb_allocation_is_a_memory_kill_however_it_is_made(workspace, code):
    result = run(code, workspace, mem_mb=512)
    assert result.killed_for_memory and not result.ok and not result.timed_out, result.reason
    assert result.reason.startswith("out of memory: the code asked for one block of memory larger than the "
                                    "whole 512 MiB limit")


def test_a_segmentation_fault_is_named_as_a_signal_with_the_line_it_hit(workspace):
    result = run("import ctypes\n\nctypes.string_at(0)", workspace)
    assert result.kill is not None and result.kill.kind == "signal" and result.kill.signal == 11
    assert result.reason == "killed by signal SIGSEGV (Segmentation fault) at <string> line 3"


def test_the_cpu_limit_signal_is_a_time_limit(workspace):
    # What the kernel sends at RLIMIT_CPU (a CPU-bound run on several cores reaches it before the wall clock).
    result = run("import signal\nsignal.raise_signal(signal.SIGXCPU)", workspace)
    assert result.cpu_limited and result.kill is not None and result.kill.kind == "time"
    assert result.reason.startswith("time limit: the 21 s CPU-time limit was reached")


def test_a_file_past_the_size_limit_is_an_output_limit(workspace):
    result = run("open('big', 'wb').truncate(300 * 1024 * 1024)", workspace)
    assert result.kill is not None and result.kill.kind == "output", result.reason
    assert result.reason == "output limit: a file grew past the 256 MiB file-size limit"


def test_a_flood_of_output_is_killed_at_the_output_limit_not_the_time_limit(workspace):
    marker = f"flood-{uuid.uuid4().hex}"
    result = run(f"# {marker}\nimport sys\nwhile True:\n    sys.stdout.write('x' * 65536)", workspace,
                 timeout_s=60, max_output_bytes=4 * 1024 * 1024)
    assert result.kill is not None and result.kill.kind == "output" and not result.timed_out
    assert result.reason == "output limit: stdout and stderr passed 4 MiB; the process group was killed"
    assert result.duration_s < 30 and live_processes_with(marker) == []


@pytest.mark.parametrize(
    "code",
    [
        "import socket; socket.socket().connect(('127.0.0.1', 9))",
        "import socket; socket.create_connection(('example.com', 80), timeout=2)",
        "import urllib.request; urllib.request.urlopen('http://example.com', timeout=2)",
        "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))",
    ],
)
def test_opening_a_network_connection_is_refused(workspace, code):
    result = run(code, workspace)
    assert not result.ok and not result.timed_out
    assert result.reason.startswith("sandbox refused socket.")
    assert result.reason.endswith(": network access is not allowed")  # urllib once left its ">" after it


def test_writing_outside_the_sandbox_is_refused_and_nothing_outside_changes(workspace, tmp_path):
    outside = tmp_path / "outside.txt"
    keep = tmp_path / "keep.txt"
    keep.write_text("keep", encoding="utf-8")
    attempts = [
        f"open({str(outside)!r}, 'w').write('x')",
        f"import os; os.open({str(outside)!r}, os.O_CREAT | os.O_WRONLY)",
        f"import os; os.remove({str(keep)!r})",
        f"import os; os.rename({str(keep)!r}, 'stolen.txt')",
        f"import shutil; shutil.rmtree({str(tmp_path)!r})",
        f"import pathlib; pathlib.Path({str(tmp_path / 'newdir')!r}).mkdir()",
    ]
    for code in attempts:
        result = run(code, workspace)
        # Refused by the audit hook, or (under /tmp, a private tmpfs inside) simply not there.
        assert not result.ok, code
        assert result.reason.startswith("sandbox refused") or "No such file or directory" in result.reason, (
            code
        )
    assert not outside.exists() and keep.read_text(encoding="utf-8") == "keep"
    assert not (tmp_path / "newdir").exists() and not (tmp_path / "stolen.txt").exists()
    # Its own temp folder (TMPDIR) is writable.
    assert run("import tempfile; tempfile.NamedTemporaryFile().write(b'x')", workspace).ok


def test_reading_a_denied_root_is_refused(workspace, tmp_path):
    gold = tmp_path / "data_root"
    gold.mkdir()
    (gold / "golden.xlsx").write_text("secret", encoding="utf-8")
    for code in (f"open({str(gold / 'golden.xlsx')!r}).read()", f"import os; os.listdir({str(gold)!r})"):
        result = run(code, workspace, deny_read=[gold])
        assert (
            not result.ok
            and "sandbox refused" in result.reason
            and "outside the item's workspace" in result.reason
        )
        assert "secret" not in result.stdout + result.stderr


def test_starting_processes_is_refused(workspace):
    for code in ("import subprocess; subprocess.run(['sleep', '30'])", "import os; os.system('true')",
                 "import os; os.fork()"):
        result = run(code, workspace)
        assert not result.ok and "starting processes is not allowed" in result.reason, code


def test_the_environment_holds_only_path_home_lang_tmpdir_and_pwd(workspace, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-should-not-leak")
    result = run("import os, json; print(json.dumps(dict(os.environ)))", workspace)
    assert result.ok
    import json

    env = json.loads(result.stdout)
    assert sorted(env) == ["HOME", "LANG", "PATH", "PWD", "TMPDIR"]  # bwrap sets PWD to the working directory
    assert "should-not-leak" not in result.stdout


def test_output_is_truncated_keeping_the_tail(workspace):
    result = run("print('a' * 100000); import sys; sys.stderr.write('x' * 50000 + 'LAST-LINE')", workspace,
                 max_output_chars=1000)
    assert result.ok and len(result.stdout) < 1200 and "characters cut" in result.stdout
    assert result.stderr.endswith("LAST-LINE")


def test_a_failing_script_reports_its_exit_code_and_last_error_line(workspace):
    result = run("raise ValueError('bad cell')", workspace)
    assert result.exit_code == 1 and result.reason == "exit code 1: ValueError: bad cell"


def test_the_temporary_folder_is_removed(workspace):
    before = {p.name for p in Path(tempfile.gettempdir()).glob("skillopt-sandbox-*")}
    marker = uuid.uuid4().hex
    result = run(f"import os; print(os.getcwd()) # {marker}", workspace)
    assert not Path(result.stdout.strip()).exists()
    after = {p.name for p in Path(tempfile.gettempdir()).glob("skillopt-sandbox-*")}
    assert Path(result.stdout.strip()).parent.name not in after - before


def test_a_script_file_in_the_workspace_runs_with_its_arguments(workspace):
    (workspace / "job.py").write_text("import sys; print(sys.argv[1:])", encoding="utf-8")
    result = run_sandboxed(["job.py", "x", "y"], workspace, 20)
    assert result.ok and result.stdout.strip() == "['x', 'y']"
