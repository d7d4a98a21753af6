"""Prefect's temporary API server, started by us in its own session.

With no ``PREFECT_API_URL``, Prefect starts a temporary API server (a uvicorn subprocess) the first
time a client needs one. Started by Prefect, it shares the terminal's process group, so the
terminal's Ctrl-C killed it too and the run then hung on connection retries. Here the same server
(Prefect's ``SubprocessASGIServer``, which every Prefect client looks up as one shared instance) is
started first, with ``start_new_session=True``: Ctrl-C reaches only the run. The child asks Linux to
send it SIGTERM when the thread that started it ends (``PR_SET_PDEATHSIG``), so a killed run never
leaves a server behind; a watchdog thread reports a server that dies mid-run. Its output goes to
``$PREFECT_HOME/temporary-server.log``, never to the terminal.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import get_current_settings

from skillopt.sandbox.process_group import own_group
from skillopt.shell.local_server import warm_up

#: The temporary server's output, under ``PREFECT_HOME``.
SERVER_LOG = "temporary-server.log"
#: Seconds between two looks at the server process.
WATCH_INTERVAL_S = 0.5

# Run in the server's process before uvicorn: die with the parent (Linux; elsewhere the atexit stop
# that Prefect registers is the only clean-up), take skillopt's server changes
# (skillopt.shell.prefect_server), then
# hand over to uvicorn's command line.
_CHILD = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
sys.argv = ["uvicorn", *sys.argv[2:]]
from skillopt.shell.prefect_server import skillopt_server
from uvicorn.main import main
with skillopt_server():
    main()
"""


class OwnSessionServer(SubprocessASGIServer):
    """``SubprocessASGIServer`` whose uvicorn process runs in its own session (same command, same
    environment)."""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        server_env = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                      "PREFECT__SERVER_FINAL": "1"}
        uvicorn_args = ["--app-dir", str(prefect.__module_path__.parent), "--factory",
                        "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                        "--port", str(self.port),
                        "--log-level", "error", "--lifespan", "on"]
        settings = get_current_settings()
        # Its output goes to a log file, not the terminal: a server stopped with the run (Ctrl-C, exit)
        # prints the cancellation of its background tasks as tracebacks after the command has returned.
        log_path = settings.home / SERVER_LOG
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(os.getpid()), *uvicorn_args],
                env={**os.environ, **server_env, **settings.to_environment_variables(exclude_unset=True)},
                stdout=log, stderr=subprocess.STDOUT, **own_group(),
            )

    def end_without_waiting(self) -> None:
        """The run is over and Prefect's queues are drained: SIGTERM the server and forget it. Its shutdown
        finishes on its own; Prefect's stop at exit would wait for it (up to 5 s after the last model call,
        ``bench/README.md``)."""
        atexit.unregister(self.stop)
        self.stop_without_waiting()
        self.server_process = None
        SubprocessASGIServer._instances.pop(getattr(self, "_instance_key", self.port), None)
        self.running = False

    def stop_without_waiting(self) -> None:
        """SIGTERM the server and return: it finishes its shutdown on its own (for an exit that cannot
        wait)."""
        process = self.server_process
        if process is not None and process.poll() is None:
            process.terminate()


def start_temporary_server() -> OwnSessionServer | None:
    """Start the temporary API server in its own session, unless a Prefect API URL is configured.

    Returns the running server (Prefect's clients find it as the shared instance), or None when
    runs go to a configured server.
    """
    if get_current_settings().api.url:
        return None
    existing = SubprocessASGIServer._instances.get(None)
    if existing is not None and existing.running:  # an earlier run of this process started it
        return existing if isinstance(existing, OwnSessionServer) else None
    SubprocessASGIServer._instances.pop(None, None)
    server = OwnSessionServer()
    server.start()
    warm_up(server.api_url)  # in the start-up thread, overlapped with the flow's imports like the start
    return server


def watch_server(server: OwnSessionServer, on_death: Callable[[str], None]) -> threading.Event:
    """Call ``on_death(message)`` from a daemon thread if ``server``'s process ends; set the returned
    event to stop watching (before the server is stopped on purpose)."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(WATCH_INTERVAL_S):
            process = server.server_process
            if process is None or stop.is_set():
                continue
            code = process.poll()
            if code is not None:
                on_death(f"the temporary Prefect API server (pid {process.pid}) exited with code {code} "
                         "in the middle of the run; re-run the same command to resume")
                return

    threading.Thread(target=watch, name="skillopt-server-watch", daemon=True).start()
    return stop
