"""Run code a target wrote, contained (BENCHMARKS.md §1.10).

:func:`run_sandboxed` runs ``[python, *argv]`` — a child of the current interpreter — in a fresh
temporary copy of a workspace folder and returns a :class:`SandboxResult`. The containment:

- **Time.** The child leads its own process group; the whole group is killed at the wall-clock
  limit (and after a normal exit, so nothing it started outlives it). ``RLIMIT_CPU`` backs this up.
- **Memory and files.** ``RLIMIT_AS`` is ``mem_mb`` MiB; ``RLIMIT_FSIZE`` caps any file it writes.
- **Network.** A fresh network namespace (``unshare -rn``) when the host allows one; always, a
  guard module that runs before the code (this module's ``sitecustomize`` equivalent) refuses
  every socket connect, send and name lookup through an audit hook, which code cannot remove.
- **Files and processes.** The same guard refuses writes, renames, deletes and directory changes
  outside the sandbox's own folder, any read under ``deny_read`` roots (split folders, golden
  workbooks), and starting new processes.
- **Environment.** Only ``PATH``, ``HOME``, ``LANG`` and ``TMPDIR`` (the last two inside the
  sandbox): no API keys, no ``PYTHON*`` variables.
- **Output.** stdout and stderr go to files outside the workspace and come back cut to
  ``max_output_chars`` (head and tail kept).

A refusal raises ``PermissionError("sandbox refused …")`` inside the child, so the child fails
with that line in its traceback and :attr:`SandboxResult.reason` reports it. The temporary folder is
removed before returning; the files named in ``collect`` are returned as bytes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MEM_MB = 2048
DEFAULT_MAX_OUTPUT_CHARS = 20_000
#: No file the child writes may exceed this (stdout and stderr files included).
MAX_FILE_BYTES = 256 * 1024 * 1024
REFUSED = "sandbox refused"
_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "Unable to allocate")

# The guard the child runs before the target's code. It is a template: the limits and roots are
# filled in per run, so the child needs no extra environment variables.
_GUARD = r'''
import os, resource, sys

resource.setrlimit(resource.RLIMIT_AS, ({mem_bytes}, {mem_bytes}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu_s}, {cpu_s}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
sys.dont_write_bytecode = True

_WRITE_ROOTS = {write_roots!r}
_DENY_READ = {deny_read!r}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {{"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.replace": (0, 1),
                "os.symlink": (1,), "os.link": (1,), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,),
                "os.utime": (0,), "shutil.rmtree": (0,), "shutil.copyfile": (1,), "shutil.move": (1,),
                "os.chdir": (0,)}}
_LIST_EVENTS = ("os.listdir", "os.scandir", "glob.glob")
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.kill", "os.killpg")
_NETWORK_EVENTS = ("socket.connect", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                   "socket.gethostbyname", "socket.gethostbyaddr", "socket.bind")


def _real(path):
    if isinstance(path, int):
        return None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return os.path.realpath(os.fspath(path))


def _under(path, roots):
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _check_read(path):
    real = _real(path)
    if real is not None and _under(real, _DENY_READ):
        raise PermissionError("{refused} reading " + real + ": outside the item's workspace")


def _check_write(path, what):
    real = _real(path)
    if real is not None and not _under(real, _WRITE_ROOTS):
        raise PermissionError("{refused} " + what + " " + real + ": outside the sandbox directory")


def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if path is None:
            return
        _check_read(path)
        if writing:
            _check_write(path, "writing")
    elif event in _PATH_EVENTS:
        for index in _PATH_EVENTS[event]:
            if index < len(args) and args[index] is not None:
                if event != "os.chdir":
                    _check_write(args[index], event)
                _check_read(args[index])
    elif event in _LIST_EVENTS:
        if args and args[0] is not None:
            _check_read(args[0])
    elif event in _PROCESS_EVENTS:
        raise PermissionError("{refused} " + event + ": starting processes is not allowed")
    elif event in _NETWORK_EVENTS:
        raise PermissionError("{refused} " + event + ": network access is not allowed")


sys.addaudithook(_hook)
del _hook

_argv = sys.argv[1:]
if not _argv:
    raise SystemExit("sandbox: nothing to run")
if _argv[0] == "-c":
    sys.argv = ["-c", *_argv[2:]]
    _code = compile(_argv[1], "<string>", "exec")
    _globals = {{"__name__": "__main__", "__builtins__": __builtins__}}
    del _argv
    exec(_code, _globals)
else:
    import runpy
    sys.argv = _argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(_argv[0])))
    runpy.run_path(_argv[0], run_name="__main__")
'''


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did.

    ``exit_code`` is None when the run was killed at the wall clock (``timed_out``); a negative
    value is the signal that ended it. ``outputs`` holds the ``collect`` files the run left (a
    missing one is simply absent). ``network_isolation`` is ``namespace`` or ``guard``.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    killed_for_memory: bool
    cpu_limited: bool
    duration_s: float
    network_isolation: str
    outputs: dict[str, bytes] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def reason(self) -> str:
        """One line saying why the run failed, or "" when it succeeded."""
        if self.timed_out:
            return f"timed out after {self.duration_s:.0f}s (wall-clock limit); the process group was killed"
        if self.cpu_limited:
            return "CPU time limit exceeded; the process was killed"
        if self.killed_for_memory:
            return "memory limit exceeded"
        refused = next((line.strip() for line in reversed(self.stderr.splitlines()) if REFUSED in line), "")
        if refused:
            return refused[refused.find(REFUSED):]
        if self.exit_code == 0:
            return ""
        last = next((line.strip() for line in reversed(self.stderr.splitlines()) if line.strip()), "")
        return f"exit code {self.exit_code}" + (f": {last}" if last else "")


def run_sandboxed(
    argv: Sequence[str],
    cwd: Path | str,
    timeout_s: float,
    mem_mb: int = DEFAULT_MEM_MB,
    *,
    collect: Sequence[str] = (),
    deny_read: Sequence[Path | str] = (),
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> SandboxResult:
    """Run ``python *argv`` in a fresh temporary copy of ``cwd`` under the limits above.

    ``argv`` is what follows the interpreter: a script path relative to the workspace (with its
    arguments) or ``["-c", code]``. ``collect`` names workspace-relative files to return.
    ``deny_read`` are folders the code may not read or list (data roots, split folders). Never
    raises for anything the code does; raises ``OSError`` only when the sandbox itself cannot be
    set up (e.g. ``cwd`` is missing).
    """
    if not argv:
        raise ValueError("run_sandboxed: argv is empty")
    source = Path(cwd)
    if not source.is_dir():
        raise FileNotFoundError(f"run_sandboxed: workspace {source} is not a folder")
    root = Path(tempfile.mkdtemp(prefix="skillopt-sandbox-")).resolve()
    try:
        work, home, tmp = root / "work", root / "home", root / "tmp"
        shutil.copytree(source, work, symlinks=True)
        home.mkdir()
        tmp.mkdir()
        guard = root / "guard.py"
        guard.write_text(_GUARD.format(
            mem_bytes=int(mem_mb) * 1024 * 1024, cpu_s=max(1, int(timeout_s) + 1), fsize=MAX_FILE_BYTES,
            write_roots=(str(work), str(tmp), str(home)), refused=REFUSED,
            deny_read=tuple(str(Path(p).resolve()) for p in deny_read),
        ), encoding="utf-8")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "LANG": "C.UTF-8", "TMPDIR": str(tmp)}
        prefix = _namespace_prefix()
        command = [*prefix, sys.executable, "-I", str(guard), *argv]
        started = time.monotonic()
        with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
            process = subprocess.Popen(command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=err, start_new_session=True)
            timed_out = False
            try:
                process.wait(timeout=max(timeout_s, 0.01))
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(process.pid)
                process.wait()
        duration = time.monotonic() - started
        stdout = _cut(_read_text(root / "stdout"), max_output_chars)
        stderr = _cut(_read_text(root / "stderr"), max_output_chars)
        code = None if timed_out else process.returncode
        outputs = {name: (work / name).read_bytes() for name in collect
                   if (work / name).is_file() and _inside(work / name, work)}
        return SandboxResult(
            exit_code=code, stdout=stdout, stderr=stderr, timed_out=timed_out,
            killed_for_memory=not timed_out and code != 0 and any(m in stderr for m in _MEMORY_MARKERS),
            cpu_limited=not timed_out and code == -signal.SIGXCPU,
            duration_s=duration, network_isolation="namespace" if prefix else "guard", outputs=outputs,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def network_namespace_available() -> bool:
    """Whether ``unshare -rn`` can give a child its own, empty network namespace on this host."""
    return bool(_namespace_prefix())


def _namespace_prefix() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    try:
        probe = subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=10, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError):
        return []
    return [unshare, "-rn"] if probe.returncode == 0 else []


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root)


def _read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping the head and the tail (a traceback ends there)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"


__all__ = ["DEFAULT_MEM_MB", "REFUSED", "SandboxResult", "network_namespace_available", "run_sandboxed"]
