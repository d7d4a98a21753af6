"""Running a flow from the command line: Prefect defaults for local use, and progress lines.

Prefect settings are only ever changed through ``temporary_settings(set_defaults=...)``, so a value
the user set (environment or profile) always wins: the ephemeral API start-up timeout is raised to
120 s (the 20 s default often fails on a new database on two cores), Prefect's own INFO logs are
quietened, and Prefect's telemetry (its only outbound connection) is off. ``PREFECT_API_URL`` and
the active profile are never touched.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from skillopt.interrupt import InterruptGuard

PROGRESS_LOGGER = "skillopt.progress"


class _Printer(Protocol):
    def print(self, text: str = "") -> None: ...


class _UserErrorsWithoutTraceback(logging.Filter):
    """Drop the traceback of a skillopt user error from Prefect's run logs: the CLI prints the message."""

    def filter(self, record: logging.LogRecord) -> bool:
        from skillopt.errors import SkillOptError

        if record.exc_info and isinstance(record.exc_info[1], SkillOptError):
            record.msg = f"{record.getMessage()}: {record.exc_info[1]}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


class _QuietAfterInterrupt(logging.Filter):
    """After Ctrl-C, drop Prefect's "Crash detected" lines of every run and task: the CLI says it once."""

    def __init__(self, guard: InterruptGuard) -> None:
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.guard.interrupted


class _ProgressHandler(logging.Handler):
    def __init__(self, out: _Printer) -> None:
        super().__init__(logging.INFO)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        self.out.print(f"  {record.getMessage()}")


def run_flow(kind: str, out: _Printer, guard: InterruptGuard | None = None, **parameters: Any) -> dict[str, Any]:
    """Run ``skill-train`` (``kind="train"``) or ``skill-eval`` (``"eval"``) in this process.

    With no ``PREFECT_API_URL`` the temporary API server is started here, in its own session, so the
    terminal's Ctrl-C reaches only this process; ``guard`` then stops it on exit and stops the run
    if the server dies.
    """
    from prefect.settings import (
        PREFECT_LOGGING_LEVEL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        PREFECT_SERVER_LOGGING_LEVEL,
        temporary_settings,
    )

    defaults = {
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 120,
        PREFECT_LOGGING_LEVEL: "WARNING",
        PREFECT_SERVER_ANALYTICS_ENABLED: False,
        # The ephemeral API server (a subprocess that inherits these settings) is stopped when the command
        # ends; its event recorder then logs a cancelled flush as an ERROR with a traceback, under a run
        # that finished correctly. Failures that matter reach the client and are reported there.
        PREFECT_SERVER_LOGGING_LEVEL: "CRITICAL",
    }
    progress = logging.getLogger(PROGRESS_LOGGER)
    handler = _ProgressHandler(out)
    progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False
    filters: list[logging.Filter] = [_UserErrorsWithoutTraceback()]
    if guard is not None:
        filters.append(_QuietAfterInterrupt(guard))
    run_loggers = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs")]
    for logger in run_loggers:
        for log_filter in filters:
            logger.addFilter(log_filter)
    try:
        with temporary_settings(set_defaults=defaults), _server_watched(guard):
            if kind == "train":
                from flows.train import skill_train

                return skill_train(**parameters)
            from flows.evaluate import skill_eval

            return skill_eval(**parameters)
    finally:
        progress.removeHandler(handler)
        for logger in run_loggers:
            for log_filter in filters:
                logger.removeFilter(log_filter)
        # The ephemeral API server stops when this process exits and may log the cancellation of
        # its last event flush as an error; the run is complete by then, so keep that off the screen.
        logging.getLogger("prefect.server").setLevel(logging.CRITICAL)
        sys.stdout.flush()


@contextmanager
def _server_watched(guard: InterruptGuard | None) -> Iterator[None]:
    from flows.temporary_server import start_temporary_server, watch_server

    server = start_temporary_server()
    if server is None or guard is None:
        yield
        return
    guard.add_cleanup(server.stop_without_waiting)
    watching = watch_server(server, guard.stop_because)
    try:
        yield
    finally:
        watching.set()
