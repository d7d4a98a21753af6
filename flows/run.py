"""Running a flow from the command line: Prefect defaults for local use, and progress lines.

Prefect settings are only ever changed through ``temporary_settings(set_defaults=...)``, so a value
the user set (environment or profile) always wins: the ephemeral API start-up timeout is raised to
120 s (the 20 s default often fails on a new database on two cores), Prefect's own INFO logs are
quietened, and Prefect's telemetry (its only outbound connection) is off. ``PREFECT_API_URL`` and
the active profile are never touched.

Which API a run talks to: the user's own (``PREFECT_API_URL`` or the profile) if set; else the local
server of ``skillopt server start`` when it runs; else, with ``prefect_server="background"`` (the CLI's
default, ``run.prefect_server``), that local server, started now and left up for later runs (one line
says so and how to stop it); else Prefect's temporary server, started in a background thread while the
flow's modules import, and stopped with the run. When the flow returns, Prefect's log and event queues
are drained while the API is still up, so every task and flow run is recorded in a final state before the
process exits.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from skillopt.shell.interrupt import InterruptGuard

PROGRESS_LOGGER = "skillopt.progress"
#: How long the exit waits for Prefect's log and event queues to reach the API (instant with a responsive
# server;
#: a saturated one can take seconds, and what is still queued when the process ends is lost).
FLUSH_TIMEOUT_S = 30.0
#: How long Prefect may take to start its temporary API server. Its first start in a new ``PREFECT_HOME``
#: creates the database, which on a busy machine can outlast Prefect's own default limit. The test suite
#: gives its own temporary server the same limit.
TEMPORARY_SERVER_START_TIMEOUT_S = 120


class _Printer(Protocol):
    def print(self, text: str = "") -> None: ...


#: The API URL the last flow run of this process used (read after the run's settings are gone, for the error).
_api_in_use: str | None = None


def api_unreachable(error: BaseException) -> str | None:
    """The Prefect API's address when ``error`` (or what caused it) is a failure to reach it after Prefect's
    own retries, else None."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if type(cause).__module__.startswith(("httpx", "httpcore")) and type(cause).__name__ in (
                "ConnectError", "ConnectTimeout", "RemoteProtocolError", "ReadError"):
            from prefect.settings import PREFECT_API_URL

            return PREFECT_API_URL.value() or _api_in_use or "its address"
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


#: How long ``wait_for_api`` waits for an API that does not answer: about as long as Prefect's own retries of
#: a request on a connection it has used before (``PREFECT_CLIENT_MAX_RETRIES`` in ``command_line_defaults``).
API_WAIT_S = 120.0


def wait_for_api(what: str, *, limit_s: float = API_WAIT_S) -> None:
    """Wait until the Prefect API answers its health check, at most ``limit_s``.

    Prefect retries a request on a connection that has answered before, but a new client fails at once when
    the server is down, and a sub-flow (or its parent task run) is created through a new client. Called
    before each epoch's sub-flow, this lets a run ride out a server restart instead of failing there. Returns
    at once with no API URL (an in-process server) or when the API answers; after ``limit_s`` the caller
    goes on and the creation itself reports the failure.
    """
    import urllib.request  # not httpx: a new httpx client builds a TLS context, ~50 ms even for http

    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return
    deadline = time.monotonic() + limit_s
    delay, said = 0.5, False
    while True:
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=5.0) as response:
                if response.status == 200:
                    if said:
                        logging.getLogger(PROGRESS_LOGGER).info("the Prefect API answers again")
                    return
        except (OSError, ValueError):  # refused, reset, timed out, an HTTP error status
            pass
        if time.monotonic() + delay > deadline:
            return
        if not said:
            said = True
            logging.getLogger(PROGRESS_LOGGER).info(
                "the Prefect API at %s does not answer; waiting up to %.0f s for it before %s", url, limit_s,
                what)
        time.sleep(delay)
        delay = min(delay * 2, 8.0)


class _UserErrorsWithoutTraceback(logging.Filter):
    """Drop the traceback of a skillopt user error from Prefect's run logs, and the record of a run that
    failed because the Prefect API did not answer: the CLI prints each in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        from skillopt.core.errors import SkillOptError

        if record.exc_info and record.exc_info[1] is not None and api_unreachable(record.exc_info[1]):
            return False
        if record.exc_info and isinstance(record.exc_info[1], SkillOptError):
            record.msg = f"{record.getMessage()}: {record.exc_info[1]}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


class _BudgetStopSaidOnce(logging.Filter):
    """Drop Prefect's ERROR lines of the tasks and flows a hard budget stop ends (the exception, then each
    run's failed state): the stop is the run's planned end, and the progress log and the summary say it once,
    with how to resume."""

    def filter(self, record: logging.LogRecord) -> bool:
        from skillopt.llm.errors import BudgetExceeded

        if record.exc_info and isinstance(record.exc_info[1], BudgetExceeded):
            return False
        return BudgetExceeded.__name__ not in record.getMessage()


class _QuietAfterInterrupt(logging.Filter):
    """After Ctrl-C, or once the run is being stopped for a reason (a dead API server, a lost Dask cluster),
    drop Prefect's "Crash detected" lines of every run and task (and of its engine): the CLI says it once."""

    def __init__(self, guard: InterruptGuard) -> None:
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.guard.interrupted or self.guard.reason)


class _ApiOutageNote(logging.Filter):
    """While the Prefect API does not answer, Prefect's event client logs every event it could not send (a
    full dump each) and a warning per reconnect. The run goes on (its requests are retried, see
    ``PREFECT_CLIENT_MAX_RETRIES`` below): say so once, instead."""

    MARKS = ("Service 'EventsWorker' failed to process item", "Unable to connect to")

    def __init__(self, out: _Printer) -> None:
        super().__init__()
        self.out = out
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not any(mark in record.getMessage() for mark in self.MARKS):
            return True
        if not self.said:
            self.said = True
            self.out.print("note: the Prefect API does not answer; the run goes on and retries it (the UI "
                           "may miss some of this run's events)")
        return False


class _DrainCount(logging.Filter):
    """Prefect's queue services say how many items they still hold each time they are drained, at the exit of
    every command too ("Still processing items: 6 items remaining..."): bookkeeping, not news for the user.
    Installed for the process, since the last drain runs at interpreter exit."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Still processing items")


_drain_count = _DrainCount()
for _service in ("EventsWorker", "APILogWorker"):
    logging.getLogger(_service).addFilter(_drain_count)


class _ProgressHandler(logging.Handler):
    def __init__(self, out: _Printer) -> None:
        super().__init__(logging.INFO)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        self.out.print(f"  {record.getMessage()}")


def command_line_defaults() -> dict[Any, Any]:
    """The Prefect settings a run from the command line has unless the user set them. Prefect configures its
    logging from them when its flow module is first imported: that import happens under them too (here, and
    in the preloaded process of ``skillopt.shell.preload``)."""
    from prefect.settings import (
        PREFECT_CLIENT_MAX_RETRIES,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_LOGGING_LEVEL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        PREFECT_SERVER_LOGGING_LEVEL,
    )

    return {
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: TEMPORARY_SERVER_START_TIMEOUT_S,
        PREFECT_LOGGING_LEVEL: "WARNING",
        PREFECT_SERVER_ANALYTICS_ENABLED: False,
        # The ephemeral API server (a subprocess that inherits these settings) is stopped when the command
        # ends; its event recorder then logs a cancelled flush as an ERROR with a traceback, under a run
        # that finished correctly. Failures that matter reach the client and are reported there.
        PREFECT_SERVER_LOGGING_LEVEL: "CRITICAL",
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
        # An API server that restarts, or a network outage, is retried with exponential back-off (2, 4 …
        # 64 s, with jitter: about two minutes) before a request fails; Prefect's default of 5 tries gives up
        # after about a minute, and more tries leave a run whose server is gone hanging for many minutes (the
        # run's last requests each wait it out). Finished calls are stored either way, so a re-run resumes.
        PREFECT_CLIENT_MAX_RETRIES: 6,
    }


def run_flow(kind: str, out: _Printer, guard: InterruptGuard | None = None, *,
             prefect_server: str = "temporary", **parameters: Any) -> dict[str, Any]:
    """Run ``skill-train`` (``kind="train"``), ``skill-eval`` (``"eval"``), ``skill-compare``
    (``"compare"``) or ``skill-transfer`` (``"transfer"``) in this process.

    With no Prefect API configured and no local server running, ``prefect_server`` chooses: ``background``
    starts the local server and leaves it up; ``temporary`` starts Prefect's temporary API server here, in
    its own session, so the terminal's Ctrl-C reaches only this process; ``guard`` then stops it on exit and
    stops the run if the server dies.
    """
    from prefect.settings import temporary_settings

    defaults = command_line_defaults()
    progress = logging.getLogger(PROGRESS_LOGGER)
    handler = _ProgressHandler(out)
    progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False
    filters: list[logging.Filter] = [_UserErrorsWithoutTraceback(), _BudgetStopSaidOnce()]
    if guard is not None:
        filters.append(_QuietAfterInterrupt(guard))
    # A run's engine logs on prefect.engine until the run's own logger exists (an interrupt while a subflow
    # is being created is reported there).
    run_loggers = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs",
                                                        "prefect.engine")]
    for logger in run_loggers:
        for log_filter in filters:
            logger.addFilter(log_filter)
    outage = _ApiOutageNote(out)
    event_loggers = [logging.getLogger(name) for name in ("prefect._internal.concurrency",
                                                          "prefect.events.clients")]
    for logger in event_loggers:
        logger.addFilter(outage)
    # Prefect's API log worker writes "--- Error logging to API ---" and the error, with no line end, to
    # stderr for every batch of logs it cannot send while the API is down (when ``logging.raiseExceptions``
    # is set, the stdlib's default): in the middle of the run's own lines. The outage note and the CLI's
    # error line say what happened.
    raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        with temporary_settings(set_defaults=defaults, updates=_api_choice(out, prefect_server)):
            from prefect.settings import PREFECT_API_URL

            global _api_in_use
            _api_in_use = PREFECT_API_URL.value()
            starting = _TemporaryServerStart.if_needed()
            try:
                run: Callable[..., dict[str, Any]]
                if kind == "train":
                    from skillopt.flows.train import skill_train as run
                elif kind == "compare":
                    from skillopt.flows.compare import skill_compare as run
                elif kind == "transfer":
                    from skillopt.flows.transfer import skill_transfer as run
                else:
                    from skillopt.flows.evaluate import skill_eval as run
                server = starting.wait() if starting is not None else None
                with _server_watched(server, guard):
                    try:
                        return run(**parameters)
                    finally:
                        flush_prefect()
            finally:
                if starting is not None:
                    starting.release()
    finally:
        logging.raiseExceptions = raise_exceptions
        progress.removeHandler(handler)
        for logger in run_loggers:
            for log_filter in filters:
                logger.removeFilter(log_filter)
        for logger in event_loggers:
            logger.removeFilter(outage)
        # The ephemeral API server stops when this process exits and may log the cancellation of
        # its last event flush as an error; the run is complete by then, so keep that off the screen.
        logging.getLogger("prefect.server").setLevel(logging.CRITICAL)
        sys.stdout.flush()


@contextmanager
def _server_watched(server: Any, guard: InterruptGuard | None) -> Iterator[None]:
    """While the run lasts, a temporary ``server`` that dies stops it through ``guard`` (and Ctrl-C stops
    it)."""
    # no import of Prefect's server app (seconds) without a temporary server
    if server is None or guard is None:
        yield
        return
    from skillopt.flows.temporary_server import watch_server

    guard.add_cleanup(server.stop_without_waiting)
    watching = watch_server(server, guard.stop_because)
    try:
        yield
    finally:
        watching.set()
        server.end_without_waiting()  # the command ends now: do not wait for the server's shutdown


def _api_choice(out: _Printer, prefect_server: str) -> dict[Any, Any]:
    """``PREFECT_API_URL`` of the local server when the user has set no API: the running one, or (with
    ``prefect_server="background"``) one started now; else nothing (Prefect's temporary server)."""
    from prefect.settings import PREFECT_API_URL, get_current_settings

    from skillopt.core.errors import SkillOptError
    from skillopt.shell import local_server

    settings = get_current_settings()
    if settings.api.url:
        return {}
    home = Path(settings.home)
    server = local_server.running(home)
    if server is not None:
        out.print(f"Prefect: the local server at {server.ui_url} (skillopt server)")
        return {PREFECT_API_URL: server.api_url}
    if prefect_server == "background":
        try:
            server, _ = local_server.start(home, {**os.environ, "PREFECT_HOME": str(home)})
        except SkillOptError as error:
            out.print(f"note: the background Prefect server did not start ({error}); using a temporary one")
            return {}
        out.print(local_server.started_note(server))
        return {PREFECT_API_URL: server.api_url}
    out.print("note: starting a temporary Prefect server for this run (--ephemeral); without it, runs start "
              "a local server that stays up")
    return {}


class _TemporaryServerStart(threading.Thread):
    """Prefect's temporary API server, started while the flow's modules import (both take seconds).

    The client would start the same server (one per process) on its first request; starting it here
    overlaps the two waits. ``wait`` returns the server, or re-raises a failed start in the caller.
    The thread lives until ``release``: the server is told to die with the thread that started it
    (``PR_SET_PDEATHSIG`` follows the parent thread, not the process).
    """

    def __init__(self) -> None:
        super().__init__(name="prefect-temporary-server", daemon=True)
        self._settings = contextvars.copy_context()  # the temporary settings hold in this thread too
        self._ready = threading.Event()
        self._released = threading.Event()
        self.server: Any = None
        self.error: BaseException | None = None

    @classmethod
    def if_needed(cls) -> _TemporaryServerStart | None:
        from prefect.settings import get_current_settings

        settings = get_current_settings()
        if settings.api.url or not settings.server.ephemeral.enabled:
            return None
        starting = cls()
        starting.start()
        return starting

    def run(self) -> None:
        try:
            self._settings.run(self._start)
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller by wait()
            self.error = error
        finally:
            self._ready.set()
        self._released.wait()

    def _start(self) -> None:
        from skillopt.flows.temporary_server import start_temporary_server

        self.server = start_temporary_server()

    def wait(self) -> Any:
        self._ready.wait()
        if self.error is not None:
            raise self.error
        return self.server

    def release(self) -> None:
        self._released.set()


def flush_prefect(timeout_s: float = FLUSH_TIMEOUT_S) -> None:
    """Send what Prefect still queues (run logs, state events) to the API now, while it is up.

    Otherwise the queues drain at interpreter exit, after the temporary server may have stopped, and
    the database keeps task runs RUNNING or PENDING whose final state never arrived.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=timeout_s, at_exit=False)
