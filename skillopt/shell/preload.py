"""A preloaded skillopt process: ``skillopt train|demo|eval`` without their start-up imports.

A run command spends seconds of CPU before the flow's first task: importing Prefect, the OpenAI SDK,
pydantic's model building and skillopt's flows (what that saves per run: ``bench/README.md``). None of it
depends on the run. So ``skillopt
server start`` also starts one more process (``python -m skillopt.shell.preload``) that imports all of that
once
and then waits on a Unix socket, ``PREFECT_HOME/skillopt-runner.sock``. A run command connects, hands over
its arguments, working directory, environment, umask and its standard input, output and error (file
descriptors over the socket), and the preloaded process forks a child that runs the command exactly as the
``skillopt`` process would have, with everything already imported. The command's process stays: it forwards
Ctrl-C (SIGINT, SIGTERM, SIGHUP) to the child and exits with the child's exit code. If it is killed, the
child notices its socket close and kills itself at once, as the run would have died with it.

The preloaded process serves only what it was started for, and says no otherwise (the command then runs in
its own process as before, a few milliseconds later): a different Python, ``sys.path`` or ``PREFECT_*``
environment (Prefect reads its settings when imported), a changed skillopt source file or upgraded
package (it would run old code), or another user (the socket is the user's alone, and the peer's uid is
checked). ``SKILLOPT_NO_PRELOAD=1`` turns it off for one command; ``skillopt server stop`` stops it with the
server.

The client half (``run_preloaded``) imports nothing beyond the standard library: it runs before the command
imports anything heavy.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SOCKET = "skillopt-runner.sock"
RECORD = "skillopt-runner.json"
LOG = "skillopt-runner.log"
DISABLE_ENV = "SKILLOPT_NO_PRELOAD"
#: The commands worth handing over: the ones that import Prefect and run a flow.
RUN_COMMANDS = frozenset({"train", "demo", "eval"})
#: Packages whose upgrade makes the preloaded process stale (besides skillopt's own sources).
PACKAGES = ("prefect", "openai", "httpx", "httpx2", "httpcore2", "pydantic", "pydantic_core", "anthropic")
#: How long a command waits for the preloaded process to take it (its own work is milliseconds).
HANDSHAKE_TIMEOUT_S = 30.0
#: Longest Unix socket path (``sun_path`` is 108 bytes on Linux, 104 on macOS).
MAX_SOCKET_PATH = 100
_HEADER = struct.Struct("!I")
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


#: What a command run without the preloaded process costs, as its note to the user says.
SLOWER = "its imports add 1-3 s to the run"


def socket_path(home: Path) -> Path:
    return home / SOCKET


def pinned_env(env: Mapping[str, str]) -> dict[str, str]:
    """What of the environment the preloaded process has already read and must match: Prefect's settings
    (read when Prefect is imported) and the Prefect home they resolve to. ``PREFECT_API_URL`` is not among
    them: a run uses the preloaded process only when it is unset."""
    pinned = {k: v for k, v in env.items() if k.startswith("PREFECT_") and k not in ("PREFECT_API_URL",
                                                                                       "PREFECT_HOME")}
    pinned["(prefect home)"] = str(Path(env.get("PREFECT_HOME") or "~/.prefect").expanduser())
    return pinned


# --------------------------------------------------------------------------------------------
# Client: the `skillopt` command


def command_of(argv: Sequence[str]) -> str | None:
    """The sub-command of ``skillopt ARGV`` (its first argument that is not an option)."""
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg
    return None


def run_preloaded(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int | None:
    """Run ``skillopt ARGV`` in the preloaded process when one serves this command; its exit code, or None
    when the command should run in this process (no preloaded process, or it said no)."""
    env = os.environ if env is None else env
    if command_of(argv) not in RUN_COMMANDS or env.get(DISABLE_ENV) or env.get("PREFECT_API_URL"):
        return None
    home = Path(env.get("PREFECT_HOME") or "~/.prefect").expanduser()
    path = socket_path(home)
    if not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # A preloaded process that does not answer in time (stopped, swapped out) is not waited for: closing the
    # connection ends a child it may have started meanwhile (``_watch_client``), and the command runs here.
    conn.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        conn.connect(str(path))
        umask = os.umask(0)
        os.umask(umask)
        request = {
            "argv": list(argv), "cwd": os.getcwd(), "env": dict(env), "umask": umask,
            "python": _python(), "path": list(sys.path), "package": _package_dir(),
            "encodings": [_encoding(sys.stdout), _encoding(sys.stderr)],
        }
        payload = json.dumps(request).encode("utf-8")
        socket.send_fds(conn, [_HEADER.pack(len(payload))], [0, 1, 2])
        conn.sendall(payload)
        reply = _read_message(conn)
    except OSError:
        conn.close()
        return None  # not running (a stale socket) or gone: run here
    if reply is None or "pid" not in reply:
        conn.close()
        if reply and reply.get("note"):
            sys.stderr.write(f"note: {reply['note']}\n")
        return None
    conn.settimeout(None)  # the run takes as long as it takes
    return _follow(conn, int(reply["pid"]))


def _follow(conn: socket.socket, pid: int) -> int:
    """Wait for the child's exit, forwarding the signals a terminal or a supervisor sends."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    with conn:
        try:
            ended = _read_message(conn)
        except OSError:
            ended = None
    if ended is None:
        sys.stderr.write("error: the run's preloaded process was stopped before the run ended "
                         "(`skillopt server stop`?)\n")
        return 1
    if "signal" in ended:
        return 128 + int(ended["signal"])
    return int(ended["exit"])


def _python() -> list[str]:
    """This interpreter (``python`` and ``python3`` of one environment are the same one)."""
    return [os.path.realpath(sys.executable), sys.prefix, sys.version]


def _package_dir() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _encoding(stream: Any) -> list[str | None]:
    return [getattr(stream, "encoding", None), getattr(stream, "errors", None)]


def _read_message(conn: socket.socket) -> dict[str, Any] | None:
    """One length-prefixed JSON message; None at end of stream."""
    header = _read_exactly(conn, _HEADER.size)
    if header is None:
        return None
    body = _read_exactly(conn, _HEADER.unpack(header)[0])
    return None if body is None else json.loads(body)


def _read_exactly(conn: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = conn.recv(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _send_message(conn: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode("utf-8")
    conn.sendall(_HEADER.pack(len(body)) + body)


# --------------------------------------------------------------------------------------------
# The process, for `skillopt server start|stop|status`

#: How long ``skillopt server start`` waits for the preloaded process's imports (seconds; more on a busy
#: machine).
START_TIMEOUT_S = 60.0


def recorded_process(home: Path) -> int | None:
    """The pid of the preloaded process of ``home`` if it is alive and listening."""
    try:
        pid = int(json.loads((home / RECORD).read_text(encoding="utf-8"))["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if _is_preload(pid) and socket_path(home).exists() else None


def start_process(home: Path, env: Mapping[str, str], *, timeout_s: float = START_TIMEOUT_S) -> int | None:
    """Start the preloaded process for ``home`` (or find it running); its pid, or None if it could not start
    (the reason is in ``home/skillopt-runner.log``; runs then start in their own process, as before)."""
    import subprocess
    import time

    from skillopt.shell.local_server import stop_group

    found = recorded_process(home)
    if found is not None:
        return found
    if len(str(socket_path(home))) > MAX_SOCKET_PATH:
        return None
    child_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    child_env["PREFECT_HOME"] = str(home)
    socket_path(home).unlink(missing_ok=True)  # left by one that died: its presence below means "listening"
    with (home / LOG).open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "skillopt.shell.preload", str(home)], cwd=home, env=child_env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C never reaches it
        )
    (home / RECORD).write_text(json.dumps({"pid": process.pid}), encoding="utf-8")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if socket_path(home).exists():
            process.returncode = 0  # it outlives this process on purpose (no "still running" warning)
            return process.pid
        time.sleep(0.05)
    if process.poll() is None:
        stop_group(process.pid)
    (home / RECORD).unlink(missing_ok=True)
    return None


def stop_process(home: Path) -> int | None:
    """Stop the preloaded process of ``home`` and the runs it is running (their API server is stopping
    with it); its pid, or None if none was running."""
    from skillopt.shell.local_server import stop_group

    pid = recorded_process(home)
    (home / RECORD).unlink(missing_ok=True)
    if pid is not None:
        stop_group(pid)
    return pid


def _is_preload(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except ProcessLookupError:
        return False
    except OSError:
        return True  # no /proc (macOS): trust the record
    return b"skillopt.shell.preload" in argv


# --------------------------------------------------------------------------------------------
# Server: `python -m skillopt.shell.preload HOME`, started by `skillopt server start`

#: What the preloaded process imports once (each command's child then finds it in ``sys.modules``).
PRELOAD = (
    "skillopt.shell.cli", "skillopt.run.run_checks", "skillopt.run.prefetch", "skillopt.flows.run",
    "skillopt.flows.train", "skillopt.flows.evaluate", "skillopt.llm.openai_compatible",
    "skillopt.run.report", "skillopt.run.runs", "skillopt.run.estimate", "skillopt.shell.live_display",
    "skillopt.shell.local_server", "openai", "httpx", "fastapi.encoders", "prefect.events.worker",
    "prefect.logging.handlers",
)
#: Imported too where installed: what every run imported on first use, about 130 modules: Prefect's flow and
#: task engines, the HTTP clients' transports, the SDK's lazily loaded
#: resources, rich's emoji table (read by every console log line). Each built-in backend and benchmark module
#: is imported as well (``_warm``).
PRELOAD_IF_PRESENT = (
    "prefect.flow_engine", "prefect.task_engine", "prefect.utilities.visualization",
    "anyio._backends._asyncio", "openai.resources.chat.chat", "openai.resources.chat.completions.completions",
    "jiter", "httpcore2", "rich._emoji_codes", "encodings.idna", "skillopt.llm.preflight",
    "skillopt.sandbox.process_group", "skillopt.sandbox.confine",
)
#: Modules whose pydantic models are built on first use (their packages defer it): built here once, not in
#: every run (Prefect's client and event schemas, the Chat Completions reply types).
DEFERRED_MODELS = ("prefect.", "openai.types.chat", "openai.types.completion")


def code_fingerprint() -> list[list[Any]]:
    """Size and modification time of every skillopt source file, and of the folders of the packages a
    preloaded process holds in memory (an upgrade replaces their files)."""
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    stamps: list[list[Any]] = []
    for folder, dirs, files in os.walk(root, followlinks=True):  # flows/, tasks/ may be linked folders
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                file = os.path.join(folder, name)
                stat = os.stat(file)
                stamps.append([os.path.relpath(file, root), stat.st_mtime_ns, stat.st_size])
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin:
            stamps.append([package, os.stat(os.path.dirname(spec.origin)).st_mtime_ns])
    return stamps


class _Server:
    """The preloaded process: accept a command, fork a child that runs it, report the child's exit."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = socket_path(home)
        self.env = pinned_env(os.environ)
        self.fingerprint = code_fingerprint()
        self.children: dict[int, socket.socket] = {}
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.stopping = False
        self.inode = 0

    def serve(self) -> None:
        import selectors

        self.path.unlink(missing_ok=True)
        old_umask = os.umask(0o177)  # the socket is the user's alone: connecting to it runs code as them
        try:
            self.listener.bind(str(self.path))
        finally:
            os.umask(old_umask)
        self.inode = os.stat(self.path).st_ino  # removed at exit only if no newer server replaced it
        self.listener.listen(16)
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        os.set_blocking(wake_read, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the wakeup fd
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ, "accept")
        selector.register(wake_read, selectors.EVENT_READ, "signal")
        _log(f"ready: serving {', '.join(sorted(RUN_COMMANDS))} at {self.path} (pid {os.getpid()})")
        try:
            # Stopped (SIGTERM, or stale code): take no new command, report the running ones' exits.
            while not self.stopping or self.children:
                if self.stopping and self.listener.fileno() != -1:
                    selector.unregister(self.listener)
                    self._close_listener()
                for key, _ in selector.select(timeout=5.0):
                    if key.data == "signal":
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_read, 512)
                    elif not self.stopping:
                        self._accept(selector, wake_read, wake_write)
                self._reap()
        finally:
            self._close_listener()
        _log("stopped")

    def _close_listener(self) -> None:
        if self.listener.fileno() != -1:
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == self.inode:
                    self.path.unlink()
            self.listener.close()

    def _stop(self, *_: object) -> None:
        self.stopping = True

    def _accept(self, selector: Any, *wake: int) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            conn, _ = self.listener.accept()
            fds: list[int] = []
            try:
                conn.settimeout(10.0)
                request, fds = self._receive(conn)
                refusal = self._refusal(conn, request)
                if refusal:
                    _send_message(conn, {"refused": refusal[0], "note": refusal[1]})
                    _log(f"refused a command: {refusal[0]}")
                    conn.close()
                    return
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    _child(conn, request, fds, close=[self.listener, *self.children.values()], wake=wake)
                _send_message(conn, {"pid": pid})
                self.children[pid] = conn
                _log(f"started pid {pid}: skillopt {command_of(request['argv'])}")
            except Exception as error:  # noqa: BLE001 - a bad request must not end the server
                _log(f"dropped a connection: {error!r}")
                conn.close()
            finally:
                for fd in fds:
                    os.close(fd)

    @staticmethod
    def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
        header, fds, _flags, _addr = socket.recv_fds(conn, _HEADER.size, 3)
        if header and len(header) < _HEADER.size:
            header += _read_exactly(conn, _HEADER.size - len(header)) or b""
        body = _read_exactly(conn, _HEADER.unpack(header)[0]) if len(header) == _HEADER.size else None
        if body is None or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            raise ValueError("incomplete request")
        return json.loads(body), list(fds)

    def _refusal(self, conn: socket.socket, request: dict[str, Any]) -> tuple[str, str | None] | None:
        """Why this process must not run the request (and what to tell the user), or None."""
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():
            return f"uid {uid} is not this process's user", None
        # sys.path[0] is the script's folder or the working directory: which skillopt and which Python
        # modules the command would import is what must match.
        if (request["python"] != _python() or request["path"][1:] != sys.path[1:]
                or request["package"] != _package_dir()):
            return "another Python, sys.path or skillopt installation", (
                "`skillopt server start` ran with another Python, sys.path or skillopt installation than "
                f"this command; it runs without the preloaded process ({SLOWER}; to use it, restart the "
                "server from this environment: `skillopt server stop && skillopt server start`)")
        if pinned_env(request["env"]) != self.env:
            return "another PREFECT_* environment", (
                "this command's PREFECT_* variables differ from those `skillopt server start` had; it runs "
                f"without the preloaded process ({SLOWER})")
        if code_fingerprint() != self.fingerprint:
            self.stopping = True  # stale for every later command too
            return ("skillopt or a package changed since the preloaded process started",
                    "skillopt changed since `skillopt server start`; running without the preloaded process "
                    "(restart it: `skillopt server stop && skillopt server start`)")
        return None

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            # logged first: the command exits the moment it has the status
            _log(f"pid {pid} ended: " + (f"signal {signum}" if signum else f"exit {os.WEXITSTATUS(status)}"))
            with contextlib.suppress(OSError):
                _send_message(conn, {"signal": signum} if signum else {"exit": os.WEXITSTATUS(status)})
            conn.close()


def _child(conn: socket.socket, request: dict[str, Any], fds: list[int], *, close: list[socket.socket],
           wake: tuple[int, ...]) -> None:
    """The forked child: become the command's process, run it, and exit (never returns)."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sock in close:
            sock.close()
        for fd in wake:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        fds.clear()
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None  # chosen again from this command's TMPDIR
        for stream, (encoding, errors) in zip((sys.stdout, sys.stderr), request["encodings"], strict=True):
            if not isinstance(stream, io.TextIOWrapper):
                continue
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(encoding=encoding, errors=errors,
                                   line_buffering=os.isatty(stream.fileno()))
        sys.argv = ["skillopt", *request["argv"]]
        sys.path[:] = request["path"]
        _watch_client(conn)
        from skillopt.shell.cli import entry

        entry(hand_over=False)  # exits the process
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _watch_client(conn: socket.socket) -> None:
    """Kill this process the moment its command's process is gone (killed, or ended): the run dies with
    the command that started it, as it would in that process."""
    import threading

    def watch() -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(None)
            while conn.recv(4096):
                pass
        # The agent CLIs the run started lead process groups of their own, which SIGKILL would leave
        # running: stop them (and remove the run's workspaces) first.
        with contextlib.suppress(Exception):
            from skillopt.sandbox.process_group import end_leftovers

            end_leftovers(grace_s=0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="skillopt-preload-watch", daemon=True).start()


def _log(message: str) -> None:
    import time

    sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
    sys.stderr.flush()


def _warm() -> None:
    """Import what a run would import on first use (``PRELOAD_IF_PRESENT``, every built-in backend and
    benchmark), build the shared TLS context of the SDKs' HTTP library (``http_common.shared_tls_context``;
    it loads the whole certificate store) and the pydantic models of ``DEFERRED_MODELS``:
    each child then finds them built."""
    import importlib
    from importlib.metadata import entry_points

    from skillopt.llm.base import builtin_backend_modules
    from skillopt.llm.http_common import http_library, shared_tls_context

    builtin_benchmarks = [entry.module for entry in entry_points(group="skillopt.benchmarks")
                          if entry.module.startswith("skillopt.benchmarks.")]
    for module in [*PRELOAD_IF_PRESENT, *builtin_backend_modules(), *builtin_benchmarks]:
        try:
            importlib.import_module(module)
        except ImportError:  # an optional package this installation does not have
            continue
    library = http_library(sys.modules["openai"])
    if library is not None:
        shared_tls_context(library)
    for model in _deferred_models(DEFERRED_MODELS):
        with contextlib.suppress(Exception):  # built on first use then, as without this
            model.model_rebuild(raise_errors=False)


def _deferred_models(prefixes: tuple[str, ...]) -> list[Any]:
    """The pydantic models of modules starting with ``prefixes`` that are not built yet."""
    from pydantic import BaseModel

    found, stack = [], [BaseModel]
    while stack:
        for model in stack.pop().__subclasses__():
            stack.append(model)
            built = model.__dict__.get("__pydantic_complete__", True)
            if model.__module__.startswith(prefixes) and not built:
                found.append(model)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    import gc
    import importlib
    import threading

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m skillopt.shell.preload PREFECT_HOME\n")
        return 2
    home = Path(args[0])
    path = socket_path(home)
    if len(str(path)) > MAX_SOCKET_PATH:
        _log(f"not started: the socket path {path} is longer than {MAX_SOCKET_PATH} characters")
        return 1
    from prefect.settings import temporary_settings  # imports no flow machinery, configures no logging

    from skillopt.flows.run import command_line_defaults

    # Imported under the settings a command's run has (as `run_flow` imports the flow): Prefect configures its
    # logging from them on this first import, once for every child.
    with temporary_settings(set_defaults=command_line_defaults()):
        for module in PRELOAD:
            importlib.import_module(module)
        _warm()
    if threading.active_count() != 1:  # a fork copies no thread but every lock one holds
        _log(f"not started: importing started threads {[t.name for t in threading.enumerate()]}")
        return 1
    # What is loaded now lives as long as the process: keep it out of every later garbage collection. A
    # child's full collections would otherwise walk (and so copy, page by page) all of it, in pauses of up
    # to a second in the middle of a run.
    gc.collect()
    gc.freeze()
    _Server(home).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
