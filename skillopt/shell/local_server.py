"""The local Prefect server that stays up between runs: ``skillopt server start|stop|status``.

Without ``PREFECT_API_URL`` every ``skillopt train`` would start Prefect's temporary API server, seconds
before the first model call (``bench/README.md``). A server that stays up removes that wait (the CLI
starts it in the background itself unless ``run.prefect_server: temporary``): ``start`` runs
``python -m prefect server start`` on 127.0.0.1 in the background, in a process session of its own
(``setsid``), so a Ctrl-C in the terminal that started it never reaches it. Its database is Prefect's
default one under ``PREFECT_HOME``; its pid and port are
recorded in ``PREFECT_HOME/skillopt-server.json`` and its output goes to ``PREFECT_HOME/skillopt-server.log``.

Nothing here imports Prefect: the server is a child process, and finding it needs only the record
and one HTTP health check.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skillopt.core.atomic import atomic_write_bytes, exclusive_lock
from skillopt.core.errors import SkillOptError
from skillopt.shell import preload

HOST = "127.0.0.1"
DEFAULT_PORT = 4200
RECORD = "skillopt-server.json"
LOG = "skillopt-server.log"
#: A new database is the slowest to become healthy (its migrations run first); leave room for a busy machine.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class LocalServer:
    pid: int
    port: int
    home: Path

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.ui_url}/api"

    @property
    def log_path(self) -> Path:
        return self.home / LOG


def prefect_home(env: Mapping[str, str]) -> Path:
    """``PREFECT_HOME`` as Prefect reads it from the environment (default ``~/.prefect``)."""
    return Path(env.get("PREFECT_HOME") or "~/.prefect").expanduser()


def healthy(api_url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s) as response:
            return response.status == 200
    except OSError:
        return False


def warm_up(api_url: str, timeout_s: float = 30.0) -> None:
    """Make the server do its first-request work now, not during a run's start.

    The server's web framework builds the request handling of every API route on the first request that
    is routed through them (a large part of a second, more on a busy machine); a health check does not get
    that far. One request for a path no route matches walks every route. Best effort: a failure
    here only leaves that work to the first run.
    """
    try:
        with urllib.request.urlopen(f"{api_url}/skillopt-warm-up", timeout=timeout_s):
            pass
    except OSError:  # the expected 404 (HTTPError is an OSError), or a server too busy to answer
        pass


def recorded(home: Path) -> LocalServer | None:
    """The server of the record in ``home``, if the record exists and its process is alive."""
    try:
        data = json.loads((home / RECORD).read_text(encoding="utf-8"))
        server = LocalServer(pid=int(data["pid"]), port=int(data["port"]), home=home)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return server if _is_prefect_server(server.pid) else None


def started_note(server: LocalServer) -> str:
    """The line a command prints when it has started the local server itself."""
    return (f"Prefect: started a local server in the background at {server.ui_url}; later runs use it too "
            "(stop it with `skillopt server stop`)")


def running(home: Path) -> LocalServer | None:
    """The recorded server if it is alive and answers its health check."""
    server = recorded(home)
    return server if server is not None and healthy(server.api_url) else None


def start(home: Path, env: Mapping[str, str], *, port: int | None = None,
          timeout_s: float = START_TIMEOUT_S) -> tuple[LocalServer, bool]:
    """Start the server (or find the one already running); returns it and whether it was started now.

    ``env`` is the environment the server inherits; ``PREFECT_API_URL`` is left out of it (the server
    is not a client of another one) and ``PREFECT_UI_API_URL`` points the UI at this server's port unless
    the user set it.
    """
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home):
        found = recorded(home)
        if found is not None:
            if _wait_healthy(found, None, timeout_s):
                preload.start_process(home, env)
                return found, False
            raise SkillOptError(f"the Prefect server of {home / RECORD} (pid {found.pid}) is alive but does "
                                f"not answer at {found.api_url}; see {found.log_path}, or `skillopt server "
                                "stop`")
        port = port or (DEFAULT_PORT if _port_free(DEFAULT_PORT) else _free_port())
        if not _port_free(port):
            raise SkillOptError(f"port {port} on {HOST} is in use: choose another with --port")
        api_url = f"http://{HOST}:{port}/api"
        child_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
        child_env["PREFECT_HOME"] = str(home)
        child_env.setdefault("PREFECT_UI_API_URL", api_url)
        child_env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        with (home / LOG).open("ab") as log:
            process = subprocess.Popen(
                # `prefect server start` with SQLite transactions begun IMMEDIATE
                # (skillopt.shell.prefect_server)
                [sys.executable, "-m", "skillopt.shell.prefect_server", "server", "start", "--host", HOST,
                 "--port",
                 str(port)],
                env=child_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session: a terminal's Ctrl-C never reaches it
            )
        server = LocalServer(pid=process.pid, port=port, home=home)
        atomic_write_bytes(home / RECORD, json.dumps({"pid": server.pid, "port": port}).encode("utf-8"))
        if not _wait_healthy(server, process, timeout_s):
            exited = process.poll()
            stop_group(server.pid)
            (home / RECORD).unlink(missing_ok=True)
            what = (f"exited (code {exited}) before it answered at {api_url}" if exited is not None
                    else f"did not answer at {api_url} within {timeout_s:.0f} s")
            raise SkillOptError(f"the Prefect server {what}; its output: {server.log_path}\n"
                                f"{_tail(server.log_path)}")
        warm_up(api_url)
        # The server outlives this process on purpose; Popen must not warn that it is still running.
        process.returncode = 0
        preload.start_process(home, env)
        return server, True


def stop(home: Path, timeout_s: float = STOP_TIMEOUT_S) -> LocalServer | None:
    """Stop the recorded server (its whole process group); returns it, or None if none was running."""
    if not home.is_dir():
        return None
    with _locked(home):
        preload.stop_process(home)
        server = recorded(home)
        (home / RECORD).unlink(missing_ok=True)
        if server is not None:
            stop_group(server.pid, timeout_s)
        return server


def _wait_healthy(server: LocalServer, process: subprocess.Popen | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if healthy(server.api_url):
            return True
        if process is not None and process.poll() is not None:
            return False
        time.sleep(0.25)
    return False


def stop_group(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to the process group ``pid`` leads (the server and its uvicorn workers; the preloaded process
    and its runs), SIGKILL after ``timeout_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own child
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def _is_prefect_server(pid: int) -> bool:
    """The pid is alive and (where ``/proc`` tells) still runs ``prefect server start``: a recycled pid is not
    ours."""
    if not _alive(pid):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc (macOS): trust the record
    return (b"prefect" in argv or b"skillopt.shell.prefect_server" in argv) and b"server" in argv


def _port_free(port: int) -> bool:
    """Whether the server could listen on ``port``. The probe binds as uvicorn does, with SO_REUSEADDR: the
    connections of a server stopped a moment ago linger in TIME_WAIT on its port, and they do not keep a new
    server from listening there."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _locked(home: Path) -> contextlib.AbstractContextManager[None]:
    """One ``start``/``stop`` at a time per ``PREFECT_HOME``."""
    return exclusive_lock(home / "skillopt-server.lock")
