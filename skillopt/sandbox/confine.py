"""Run code a target wrote, contained by the operating system (bubblewrap).

:func:`run_sandboxed` runs ``[python, *argv]`` in a fresh temporary copy of a workspace folder and
returns a :class:`SandboxResult`. :func:`run_confined` runs any command (an exec target's CLI) in a
workspace the same way. The boundary is the kernel, through ``bwrap`` (bubblewrap):

- **Namespaces.** New user, pid, network, ipc, uts and cgroup namespaces (``--unshare-all
  --unshare-user``), ``--disable-userns`` (no nested namespaces), ``--new-session`` (no terminal
  injection), ``--die-with-parent``, every capability dropped. The network namespace is empty: no
  route to the host's loopback or anywhere else (exec targets may opt into the host's network, since
  their CLI must reach its model API).
- **Files.** The root is empty; only what the interpreter needs is bound read-only (``/usr`` and its
  ``/bin``/``/lib`` links, the dynamic-linker cache, the Python installation and the site-packages
  of the running environment), plus a fresh ``/proc`` and ``/dev``, a private tmpfs ``/tmp``, and the
  workspace copy, the only writable host folder. The user's home, the repository, data roots and
  every other file simply do not exist inside.
- **Environment.** Cleared: only ``PATH``, ``HOME`` and ``TMPDIR`` (both ``/tmp``) and ``LANG``.
- **Processes.** Generated Python gets a seccomp filter that refuses every new process (``fork``,
  ``vfork``, ``clone`` without ``CLONE_THREAD``, ``clone3``): no fork bomb, no daemon. Exec targets
  may start processes, capped by ``RLIMIT_NPROC`` inside their own user namespace. When the run ends
  (normally or at the wall-clock limit) the whole process group is killed; bwrap's init is pid 1 of
  the namespace, and when it dies the kernel kills every process left in it.
- **Limits.** ``RLIMIT_CPU`` (the time limit), ``RLIMIT_AS`` (``mem_mb``), ``RLIMIT_FSIZE``,
  ``RLIMIT_NOFILE``, ``RLIMIT_NPROC``, no core files.
- **Output.** stdout and stderr are read through pipes keeping only their head and tail, so a
  flood of output costs neither memory nor disk; what comes back is cut to ``max_output_chars``.

Inside, a Python audit hook still refuses writes outside the workspace, reads of ``deny_read``
roots, process starts and sockets with a clear ``PermissionError("sandbox refused …")``: defence in
depth and readable reasons, never the boundary itself.

When no sandbox can be made (no ``bwrap``, or user namespaces disabled) the run fails closed with
:class:`SandboxUnavailable`, unless the caller passes ``mode="none"`` (``benchmark.sandbox: none``),
which runs the code with only the audit hook and rlimits and logs a warning every time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import platform
import select
import shutil
import signal
import site
import struct
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from skillopt.core.errors import SecurityError
from skillopt.sandbox.kills import Kill, classify, crash_site
from skillopt.sandbox.process_group import (
    Exiting,
    end_group,
    keep_at_exit,
    start_in_group,
    stopped_at_exit,
    temp_folder,
)

log = logging.getLogger("skillopt.sandbox.confine")

DEFAULT_MEM_MB = 2048
DEFAULT_MAX_OUTPUT_CHARS = 20_000
#: No file the child writes may exceed this.
MAX_FILE_BYTES = 256 * 1024 * 1024
#: A run that writes more than this to stdout and stderr together is killed, as a file is at MAX_FILE_BYTES.
DEFAULT_MAX_OUTPUT_BYTES = MAX_FILE_BYTES
#: Open files per process.
MAX_OPEN_FILES = 256
#: Processes (threads included) of one exec-target run, counted inside its own user namespace.
MAX_PROCESSES = 256
REFUSED = "sandbox refused"
#: How each refusal of the audit hook below ends.
REFUSAL_ENDINGS = (": outside the item's workspace", ": outside the sandbox directory",
                   ": starting processes is not allowed", ": network access is not allowed")
#: How much of each output stream is kept while reading (head and tail each).
_KEEP_BYTES = 1024 * 1024

SandboxMode = Literal["bwrap", "none"]
SANDBOX_FIX = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
               "bubblewrap) and allow unprivileged user namespaces, or set benchmark.sandbox: none to run "
               "generated code without an OS sandbox (at your own risk)")
NO_SANDBOX_WARNING = ("benchmark.sandbox is none: model-written code runs WITHOUT an OS sandbox; it can read "
                      "your files and reach the network. Install bubblewrap and remove the setting.")


class SandboxUnavailable(SecurityError):
    """No OS sandbox can be made here; running generated code anyway needs ``benchmark.sandbox: none``."""


# --------------------------------------------------------------------------------------------
# Whether a sandbox can be made


@dataclass(frozen=True)
class SandboxStatus:
    """Whether bubblewrap works on this host; ``detail`` says why not (or which bwrap)."""

    available: bool
    bwrap: str | None
    detail: str

    def describe(self) -> str:
        return f"bubblewrap ({self.detail})" if self.available else f"unavailable: {self.detail}"


def sandbox_status() -> SandboxStatus:
    """Probe (once per ``PATH``) whether ``bwrap`` can create the namespaces a sandbox needs."""
    return _probe(os.environ.get("PATH", os.defpath))


@functools.lru_cache(maxsize=8)
def _probe(search_path: str) -> SandboxStatus:
    bwrap = shutil.which("bwrap", path=search_path)
    if bwrap is None:
        return SandboxStatus(False, None, "bubblewrap (bwrap) is not installed (not found on PATH)")
    command = [bwrap, *_namespace_flags(network=False), *_system_binds(), "--", "/bin/true"]
    try:
        probe = subprocess.run(command, capture_output=True, timeout=20, env={"PATH": "/usr/bin:/bin"},
                               stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return SandboxStatus(False, bwrap, f"{bwrap} could not be started: {exc}")
    if probe.returncode != 0:
        why = probe.stderr.decode("utf-8", errors="replace").strip().splitlines()
        cause = why[-1] if why else f"exit status {probe.returncode}"
        return SandboxStatus(False, bwrap, f"{bwrap} cannot create namespaces here (user namespaces "
                                           f"disabled?): {cause}")
    return SandboxStatus(True, bwrap, bwrap)


def require_sandbox(mode: SandboxMode, *, what: str) -> SandboxStatus:
    """Fail closed before any generated code runs: raise :class:`SandboxUnavailable` naming ``what`` and
    the fix when ``mode`` is ``bwrap`` and no sandbox can be made; with ``none``, warn (every run)."""
    status = sandbox_status()
    if mode == "none":
        log.warning("%s: %s", what, NO_SANDBOX_WARNING)
        return status
    if not status.available:
        raise SandboxUnavailable(f"{what} runs model-written code and no OS sandbox can be made: "
                                 f"{status.detail}. Fix: {SANDBOX_FIX}")
    return status


# --------------------------------------------------------------------------------------------
# The bwrap command line


def _namespace_flags(*, network: bool) -> list[str]:
    flags = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
             "--cap-drop", "ALL", "--clearenv"]
    return [*flags, "--share-net"] if network else flags


def _system_binds() -> list[str]:
    """``/usr`` read-only, the merged-/usr links (or binds) and the dynamic-linker cache, ``/proc``,
    ``/dev`` and a private ``/tmp``."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return [*args, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]


def python_paths() -> tuple[str, list[str], list[str]]:
    """The real interpreter, the folders to bind for it (its installation and the site-packages of the
    running environment, e.g. a virtualenv's, so openpyxl and pandas import inside) and those
    site-packages folders, which the child adds to its path."""
    executable = os.path.realpath(sys.executable)
    paths = sysconfig.get_paths()
    sites = [paths["purelib"], paths["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE and site.getusersitepackages() in sys.path:
        sites.append(site.getusersitepackages())
    site_dirs = list(dict.fromkeys(os.path.realpath(p) for p in sites if os.path.isdir(p)))
    return executable, _outermost({os.path.realpath(sys.base_prefix), *site_dirs}), site_dirs


def _outermost(folders: set[str]) -> list[str]:
    """``folders`` without those inside another one (and without what ``/usr`` already covers)."""
    kept: list[str] = []
    for folder in sorted(folders):
        if folder == "/usr" or folder.startswith("/usr/"):
            continue
        if not any(folder.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(folder)
    return kept


_NETWORK_ETC = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf",
                "/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/crypto-policies", "/etc/localtime",
                "/etc/passwd", "/etc/group")


def bwrap_argv(bwrap: str, command: Sequence[str], *, workspace: Path, read_only: Sequence[str] = (),
               writable: Sequence[str] = (), env: Mapping[str, str], network: bool = False,
               seccomp_fd: int | None = None, info_fd: int | None = None) -> list[str]:
    """The full ``bwrap … -- command`` line: namespaces, system binds, ``read_only`` folders at their own
    paths, ``writable`` ones and ``workspace`` (the working directory) writable at their own paths, and
    only ``env``.
    ``info_fd`` receives bwrap's JSON (``child-pid``: the namespace's init, as the host sees it)."""
    args = [bwrap, *_namespace_flags(network=network), *_system_binds()]
    if network:  # what name resolution and TLS need, and the user database some CLIs look themselves up in
        args += [arg for path in _NETWORK_ETC if os.path.exists(path) for arg in ("--ro-bind", path, path)]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    for path in read_only:
        args += ["--ro-bind", path, path]
    for path in writable:
        args += ["--bind", path, path]
    args += ["--bind", str(workspace), str(workspace), "--chdir", str(workspace), "--unsetenv", "PWD"]
    for name, value in env.items():
        args += ["--setenv", name, value]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return [*args, "--", *command]


def limits_prefix(*, processes: int = MAX_PROCESSES, open_files: int = MAX_OPEN_FILES,
                  file_bytes: int = MAX_FILE_BYTES) -> list[str]:
    """``prlimit --nproc … --`` for a command that is not Python (so cannot set its own limits): the limits
    are set inside the sandbox, so the process count is that of the sandbox's own user namespace.
    Empty where util-linux's ``prlimit`` is not installed."""
    prlimit = shutil.which("prlimit", path="/usr/bin:/bin")
    if prlimit is None:
        return []
    return [prlimit, f"--nproc={processes}", f"--nofile={open_files}", f"--fsize={file_bytes}", "--core=0",
            "--"]


# --------------------------------------------------------------------------------------------
# A seccomp filter: no new processes (threads stay allowed), no single block larger than the memory limit

_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_KILL_PROCESS = 0x80000000
_CLONE_THREAD = 0x00010000
_EPERM, _ENOSYS = 1, 38
# (audit arch, fork, vfork, clone, clone3, mmap, mremap); -1 where the syscall does not exist.
_ARCHES = {
    "x86_64": (0xC000003E, 57, 58, 56, 435, 9, 25),
    "aarch64": (0xC00000B7, -1, -1, 220, 435, 222, 216),
}
#: The signal a process gets when the filter kills it: only for asking for one block of memory larger
#: than the whole limit, so a run that ends by it ran out of memory.
MEMORY_KILL_SIGNAL = signal.SIGSYS


def no_process_filter(mem_bytes: int | None = None) -> bytes | None:
    """The classic-BPF program (``struct sock_filter[]``) bwrap loads with ``--seccomp``.

    ``fork`` and ``vfork`` fail with EPERM, ``clone`` without ``CLONE_THREAD`` with EPERM, ``clone3``
    with ENOSYS (so libc falls back to ``clone`` for threads); every syscall of another ABI (x32,
    i386) fails with ENOSYS. With ``mem_bytes``, an ``mmap`` or ``mremap`` asking for more than
    ``mem_bytes`` in one block kills the process with SIGSYS: the address-space limit would refuse it
    anyway, and C code that does not check for NULL would then die of a segmentation fault that says
    nothing about memory. None on an architecture the table does not know.
    """
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return None
    audit_arch, fork, vfork, clone, clone3, mmap, mremap = arch
    ld_w_abs, jeq_k, jgt_k, jge_k, jset_k, ret_k = 0x20, 0x15, 0x25, 0x35, 0x45, 0x06
    # Instructions with symbolic jump targets (labels), resolved once the program is laid out.
    program: list[tuple[int, str | int, str | int, int]] = []
    labels: dict[str, int] = {}

    def emit(code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        program.append((code, jt, jf, k))

    def label(name: str) -> None:
        labels[name] = len(program)

    def size_check(name: str, offset: int) -> None:
        """Kill when the 64-bit argument at ``offset`` of ``seccomp_data`` exceeds ``mem_bytes``."""
        assert mem_bytes is not None
        high, low = mem_bytes >> 32, mem_bytes & 0xFFFFFFFF
        label(name)
        emit(ld_w_abs, offset + 4)  # the high half (little-endian)
        emit(jgt_k, high, "kill", 0)
        emit(jeq_k, high, 0, "allow")
        emit(ld_w_abs, offset)
        emit(jgt_k, low, "kill", "allow")

    emit(ld_w_abs, 4)  # seccomp_data.arch
    emit(jeq_k, audit_arch, 0, "enosys")
    emit(ld_w_abs, 0)  # seccomp_data.nr
    if platform.machine() == "x86_64":
        emit(jge_k, 0x40000000, "enosys", 0)  # the x32 ABI
    for number in (fork, vfork):
        if number >= 0:
            emit(jeq_k, number, "eperm", 0)
    emit(jeq_k, clone3, "enosys", 0)
    emit(jeq_k, clone, "clone", 0)
    if mem_bytes is not None:
        emit(jeq_k, mmap, "mmap", 0)
        emit(jeq_k, mremap, "mremap", 0)
    emit(jeq_k, 0, "allow", "allow")  # every other syscall: both branches allow
    label("clone")
    emit(ld_w_abs, 16)  # the low half of args[0], clone's flags
    emit(jset_k, _CLONE_THREAD, "allow", "eperm")
    if mem_bytes is not None:
        size_check("mmap", 24)  # args[1], the length
        size_check("mremap", 32)  # args[2], the new length
    for name, action in (("allow", _SECCOMP_RET_ALLOW), ("eperm", _SECCOMP_RET_ERRNO | _EPERM),
                         ("enosys", _SECCOMP_RET_ERRNO | _ENOSYS), ("kill", _SECCOMP_RET_KILL_PROCESS)):
        label(name)
        emit(ret_k, action)

    def offset(at: int, target: str | int) -> int:
        if isinstance(target, int):
            return target
        jump = labels[target] - at - 1
        assert 0 <= jump < 256, "a seccomp jump out of range"
        return jump

    return b"".join(struct.pack("<HBBI", code, offset(at, jt), offset(at, jf), k)
                    for at, (code, jt, jf, k) in enumerate(program))


# --------------------------------------------------------------------------------------------
# Running


@dataclass
class ProcessOutcome:
    """How a confined command ended; ``exit_code`` is None when it was killed at the wall clock or
    for writing more than its output limit (``output_limited``)."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    elapsed_s: float
    output_limited: bool = False


class _OutputBudget:
    """The bytes a run may write to stdout and stderr together; ``spent`` is set once it is over."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._lock = threading.Lock()
        self.spent = threading.Event()

    def spend(self, count: int) -> None:
        with self._lock:
            self._used += count
            if self._used > self._limit:
                self.spent.set()


class _Drain(threading.Thread):
    """Reads a pipe to its end keeping only the first and last ``keep`` bytes."""

    def __init__(self, stream: IO[bytes], keep: int, *, budget: _OutputBudget | None = None) -> None:
        super().__init__(daemon=True)
        self._stream = stream
        self._keep = keep
        self._budget = budget
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0

    def run(self) -> None:
        try:
            while chunk := self._stream.read1(65536):  # type: ignore[attr-defined]
                if self._budget is not None:
                    self._budget.spend(len(chunk))
                room = self._keep - len(self._head)
                if room > 0:
                    self._head += chunk[:room]
                    chunk = chunk[room:]
                self._tail += chunk
                if len(self._tail) > self._keep:
                    self.dropped += len(self._tail) - self._keep
                    del self._tail[: len(self._tail) - self._keep]
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        self.join(timeout=2.0)
        middle = f"\n... [{self.dropped} bytes not kept] ...\n".encode() if self.dropped else b""
        return (bytes(self._head) + middle + bytes(self._tail)).decode("utf-8", errors="replace")


def run_confined(command: Sequence[str], *, workspace: Path, timeout_s: float, env: Mapping[str, str],
                 read_only: Sequence[str] = (), writable: Sequence[str] = (), network: bool = False,
                 stdin_text: str | None = None, grace_s: float = 0.0, seccomp: bytes | None = None,
                 keep_bytes: int = _KEEP_BYTES, max_output_bytes: int | None = None,
                 mode: SandboxMode = "bwrap") -> ProcessOutcome:
    """Run ``command`` under bubblewrap with ``workspace`` (and ``writable``) as its only writable host
    folders. Each output stream keeps its first and last ``keep_bytes`` bytes.

    At ``timeout_s`` the process group gets SIGTERM, then SIGKILL after ``grace_s``; once stdout and
    stderr together pass ``max_output_bytes`` (when given) it is killed at once (``output_limited``).
    In every case it is killed before returning, which ends the namespace and everything in it.
    ``mode="none"`` runs the command without bwrap (cleared environment and own process group only). Raises
    :class:`SandboxUnavailable` when ``mode`` is ``bwrap`` and bubblewrap does not work here.
    """
    pass_fds: tuple[int, ...] = ()
    seccomp_fd: int | None = None
    info: _Info | None = None
    if mode == "bwrap":
        status = sandbox_status()
        if not status.available or status.bwrap is None:
            raise SandboxUnavailable(f"no OS sandbox can be made: {status.detail}. Fix: {SANDBOX_FIX}")
        if seccomp is not None:  # a few hundred bytes: the pipe holds them until bwrap reads
            seccomp_fd, filled = os.pipe()
            os.write(filled, seccomp)
            os.close(filled)
        info = _Info()
        pass_fds = tuple(fd for fd in (seccomp_fd, info.write_fd) if fd is not None)
        argv = bwrap_argv(status.bwrap, command, workspace=workspace, read_only=read_only, writable=writable,
                          env=env, network=network, seccomp_fd=seccomp_fd, info_fd=info.write_fd)
        # bwrap itself (pid 1 of the namespace, whose /proc/1/environ the code can read) gets no secrets.
        launch_env = {"PATH": "/usr/bin:/bin"}
    else:
        argv, launch_env = list(command), dict(env)
    started = time.monotonic()
    try:
        proc = start_in_group(argv, cwd=workspace, env=launch_env, pass_fds=pass_fds,
                              stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except BaseException:
        if info is not None:
            info.close()
        raise
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
        if info is not None:
            info.started()
    assert proc.stdout is not None and proc.stderr is not None
    budget = _OutputBudget(max_output_bytes) if max_output_bytes is not None else None
    out, err = _Drain(proc.stdout, keep_bytes, budget=budget), _Drain(proc.stderr, keep_bytes, budget=budget)
    out.start()
    err.start()
    if stdin_text is not None and proc.stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin_text.encode("utf-8")), daemon=True).start()
    timed_out = output_limited = False
    deadline = started + max(timeout_s, 0.01)
    try:
        while True:
            try:
                proc.wait(timeout=max(min(deadline - time.monotonic(), 0.05), 0.001))
                break
            except subprocess.TimeoutExpired:
                if budget is not None and budget.spent.is_set():
                    output_limited = True
                    break
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
    finally:
        end_group(proc, grace_s=grace_s if timed_out else 0)
        if info is not None:
            info.end_namespace()
    if stopped_at_exit(proc):  # skillopt is exiting: not a failure of the command
        raise Exiting(f"skillopt is exiting: stopped {command[0]}")
    killed = timed_out or output_limited
    return ProcessOutcome(None if killed else proc.returncode, out.text(), err.text(), timed_out,
                          time.monotonic() - started, output_limited)


class _Info(threading.Thread):
    """Reads bwrap's ``--info-fd`` report and, at the end, makes sure the namespace is gone.

    bwrap's init (pid 1 of the namespace) can outlive the bwrap process we started by a moment, and
    it is not our child. Killing it makes the kernel kill everything left in the namespace; waiting
    on its pidfd until it is gone means no process of the run is alive when the run returns.
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self._read_fd, self.write_fd = os.pipe()
        self._pidfd: int | None = None

    def started(self) -> None:
        os.close(self.write_fd)
        self.start()

    def run(self) -> None:
        with os.fdopen(self._read_fd, "rb") as stream:
            data = stream.read(65536)
        try:
            pid = int(json.loads(data.decode("utf-8", errors="replace") or "{}").get("child-pid", 0))
        except (ValueError, AttributeError):
            return
        if pid > 0:
            with contextlib.suppress(OSError):
                self._pidfd = os.pidfd_open(pid)

    def close(self) -> None:
        for fd in (self._read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def end_namespace(self, wait_s: float = 10.0) -> None:
        self.join(timeout=wait_s)
        if self._pidfd is None:
            return
        try:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            if not select.select([self._pidfd], [], [], wait_s)[0]:
                log.warning("sandbox: the namespace's init did not exit within %.0f s", wait_s)
        finally:
            os.close(self._pidfd)


def _feed(stream: IO[bytes], data: bytes) -> None:
    try:
        stream.write(data)
        stream.close()
    except (BrokenPipeError, OSError):
        pass


# --------------------------------------------------------------------------------------------
# Generated Python

# The guard the child runs before the target's code: limits first, then the audit hook. It is a
# template: the limits and roots are filled in per run, so the child needs no extra environment.
_GUARD = r'''
import os, resource, sys

for _limit, _value in (("RLIMIT_AS", {mem_bytes}), ("RLIMIT_CPU", {cpu_s}), ("RLIMIT_FSIZE", {fsize}),
                       ("RLIMIT_CORE", 0), ("RLIMIT_NOFILE", {nofile}), ("RLIMIT_NPROC", {nproc})):
    resource.setrlimit(getattr(resource, _limit), (_value, _value))
sys.dont_write_bytecode = True
import faulthandler
faulthandler.enable()  # a fatal signal (SIGSEGV, SIGBUS, SIGABRT...) prints where the code was
import site
for _folder in {site_dirs!r}:
    site.addsitedir(_folder)

_WRITE_ROOTS = {write_roots!r}
_DENY_READ = {deny_read!r}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {{"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
                "os.replace": (0, 1), "os.symlink": (1,), "os.link": (1,), "os.chmod": (0,), "os.chown": (0,),
                "os.truncate": (0,),
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

    ``exit_code`` is None when the run was killed at the wall clock (``timed_out``) or for flooding its
    output; a run killed by a signal has ``128 + N`` under bubblewrap (``-N`` without it). ``kill``
    says which resource bound stopped the run, if one did (:mod:`skillopt.sandbox.kills`): out of
    memory, a time limit, an output limit, or another signal. ``outputs`` holds the ``collect`` files
    the run left (a missing one is simply absent). ``isolation`` is ``bwrap`` or ``none``
    (``benchmark.sandbox: none``).
    """

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    isolation: str
    outputs: dict[str, bytes] = field(default_factory=dict)
    kill: Kill | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def killed_for_memory(self) -> bool:
        return self.kill is not None and self.kill.kind == "memory"

    @property
    def cpu_limited(self) -> bool:
        return self.kill is not None and self.kill.kind == "time" and not self.timed_out

    @property
    def reason(self) -> str:
        """One line saying why the run failed, or "" when it succeeded: a resource kill leads with its
        kind (``out of memory: …``, ``time limit: …``, ``output limit: …``, ``killed by signal …``)."""
        if self.kill is not None:
            where = crash_site(self.stderr) if self.kill.kind == "signal" else ""
            return self.kill.reason + (f" at {where}" if where else "")
        refused = next((line.strip() for line in reversed(self.stderr.splitlines()) if REFUSED in line), "")
        if refused:
            # From the refusal to the end of its own message: code that wraps it (urllib's "<urlopen error
            # …>", a quoted repr) leaves its characters after it.
            refused = refused[refused.find(REFUSED):]
            ending = next((end for end in REFUSAL_ENDINGS if end in refused), None)
            return refused[:refused.find(ending) + len(ending)] if ending else refused
        if self.exit_code == 0:
            return ""
        last = _last_line(self.stderr)
        return f"exit code {self.exit_code}" + (f": {last}" if last else "")


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def run_sandboxed(
    argv: Sequence[str],
    cwd: Path | str,
    timeout_s: float,
    mem_mb: int = DEFAULT_MEM_MB,
    *,
    collect: Sequence[str] = (),
    deny_read: Sequence[Path | str] = (),
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    mode: SandboxMode = "bwrap",
) -> SandboxResult:
    """Run ``python *argv`` in a fresh temporary copy of ``cwd`` inside the OS sandbox.

    ``argv`` is what follows the interpreter: a script path relative to the workspace (with its
    arguments) or ``["-c", code]``. ``collect`` names workspace-relative files to return.
    ``deny_read`` are folders the audit hook refuses to read (they are not mounted inside anyway).
    A run that writes more than ``max_output_bytes`` to stdout and stderr together is killed; a run
    stopped by any limit says which in ``kill``. Never raises for anything the code does; raises
    ``OSError`` when the workspace cannot be set up
    and :class:`SandboxUnavailable` when ``mode`` is ``bwrap`` and no sandbox can be made.
    """
    if not argv:
        raise ValueError("run_sandboxed: argv is empty")
    source = Path(cwd)
    if not source.is_dir():
        raise FileNotFoundError(f"run_sandboxed: workspace {source} is not a folder")
    made = temp_folder("skillopt-sandbox-")  # removed should skillopt exit while the code runs
    root = made.resolve()
    try:
        work = root / "work"
        shutil.copytree(source, work, symlinks=True)
        executable, folders, site_dirs = python_paths()
        # Without bwrap there is no private /tmp: give the code a folder of its own.
        tmp = "/tmp" if mode == "bwrap" else str(root / "tmp")
        if mode == "none":
            Path(tmp).mkdir()
        guard = root / "guard.py"
        mem_bytes, cpu_s = int(mem_mb) * 1024 * 1024, max(1, int(timeout_s) + 1)
        guard.write_text(_GUARD.format(
            mem_bytes=mem_bytes, cpu_s=cpu_s, fsize=MAX_FILE_BYTES,
            nofile=MAX_OPEN_FILES, nproc=MAX_PROCESSES, write_roots=(str(work), tmp), refused=REFUSED,
            deny_read=tuple(str(Path(p).resolve()) for p in deny_read),
            site_dirs=site_dirs,
        ), encoding="utf-8")
        guard.chmod(0o444)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "TMPDIR": tmp}
        command = [executable, "-I", str(guard), *argv]
        seccomp = no_process_filter(mem_bytes) if mode == "bwrap" else None
        outcome = run_confined(command, workspace=work, timeout_s=timeout_s, env=env,
                               read_only=[*folders, str(guard)], seccomp=seccomp,
                               max_output_bytes=max_output_bytes, mode=mode)
        outputs = {name: (work / name).read_bytes() for name in collect
                   if (work / name).is_file() and _inside(work / name, work)}
        kill = classify(exit_code=outcome.exit_code, stderr=outcome.stderr, timed_out=outcome.timed_out,
                        output_limited=outcome.output_limited, elapsed_s=outcome.elapsed_s,
                        timeout_s=timeout_s, cpu_s=cpu_s, mem_mb=int(mem_mb),
                        max_output_bytes=max_output_bytes, file_bytes=MAX_FILE_BYTES,
                        memory_filter=seccomp is not None)
        return SandboxResult(
            exit_code=outcome.exit_code, stdout=_cut(outcome.stdout, max_output_chars),
            stderr=_cut(outcome.stderr, max_output_chars), timed_out=outcome.timed_out,
            duration_s=outcome.elapsed_s, isolation=mode, outputs=outputs, kill=kill,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        keep_at_exit(made)


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root)


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, keeping the head and the tail (a traceback ends there)."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"


__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES", "DEFAULT_MEM_MB", "MEMORY_KILL_SIGNAL", "REFUSED", "ProcessOutcome",
    "SandboxMode", "SandboxResult", "SandboxStatus", "SandboxUnavailable", "limits_prefix",
    "no_process_filter", "require_sandbox", "run_confined", "run_sandboxed", "sandbox_status",
]
