"""Stopping a run from the terminal: the first Ctrl-C stops it cleanly, a second one at once.

A run spends most of its time waiting on model calls in worker threads, which Python cannot cancel:
after a ``KeyboardInterrupt`` the thread pool would wait for every call in flight (tens of seconds
with a real model). So the first SIGINT raises ``KeyboardInterrupt`` in the main thread (the flow
marks its run as ended, ``finally`` blocks run) and arms a short deadline; if the process has not
exited by then it says so, runs the cleanup (stops the temporary API server) and exits with 130.
A second SIGINT does that at once. Nothing is lost by exiting early: every finished model call is
already in the cache and the run directory's files are written atomically, so re-running the same
command resumes.

The same path stops a run whose temporary Prefect API server died, or whose Dask cluster stopped
finishing work (``stop_because``): the main thread gets a real SIGINT (so a blocking socket call
returns) and the reason is reported instead of "interrupted".

SIGTERM (``timeout``, a container stop) ends a run the same way, with exit 143. While a flow runs,
Prefect puts its own SIGTERM handler in place (it marks the flow run crashed);
:func:`terminate_promptly` puts one in front of it that arms the same deadline first, so a flow
whose orderly exit waits on work that will never finish still ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import TextIO

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
RESUME_HINT = "re-run the same command to resume"
INTERRUPTED_MESSAGE = f"interrupted — {RESUME_HINT}"
#: How long the first Ctrl-C waits for an orderly exit before the process exits anyway.
DEFAULT_GRACE_S = 1.5
#: Two SIGINTs closer than this are one stop: ``timeout -s INT`` (without ``--foreground``) and some
#: supervisors signal the process and then its process group. A person pressing Ctrl-C twice is slower.
SAME_SIGNAL_S = 0.25


class InterruptGuard:
    """SIGINT handling for one run, as a context manager (installed only in the main thread).

    ``cleanup`` runs once before a forced exit (e.g. stop the server this process started); ``err``
    receives the one message of a forced exit.
    """

    def __init__(self, err: TextIO, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.err = err
        self.grace_s = grace_s
        self.reason: str | None = None
        self.signals = 0
        self._cleanups: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._reported = False
        self._previous: object = None
        self._previous_term: object = None
        self._installed = False
        self._exit_code: int | None = None
        self._last_signal = -SAME_SIGNAL_S

    # ---- context manager -----------------------------------------------------------------

    def __enter__(self) -> InterruptGuard:
        global _active
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._previous_term = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        _active = self
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # Once interrupted, the process is on its way out (possibly waiting for worker threads): the
        # handler stays, so another Ctrl-C still exits at once.
        global _active
        if _active is self:
            _active = None
        if self._installed and not self.interrupted:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            signal.signal(signal.SIGTERM, self._previous_term)  # type: ignore[arg-type]
            self._installed = False

    # ---- API -----------------------------------------------------------------------------

    @property
    def interrupted(self) -> bool:
        return self.signals > 0

    def add_cleanup(self, cleanup: Callable[[], None], *, first: bool = False) -> None:
        """Run ``cleanup`` before a forced exit (never twice, errors ignored); with ``first``, before the
        cleanups added so far (one that reports to the API server before the server is stopped)."""
        if first:
            self._cleanups.insert(0, cleanup)
        else:
            self._cleanups.append(cleanup)

    def stop_because(self, reason: str, *, exit_code: int = 1) -> None:
        """Stop the run from another thread with ``reason`` (e.g. the API server died) and
        ``exit_code``."""
        if self.reason is None:
            self.reason = reason
            self._exit_code = exit_code
        os.kill(os.getpid(), signal.SIGINT)

    def message(self) -> str:
        return self.reason or INTERRUPTED_MESSAGE

    def exit_code(self) -> int:
        if self._exit_code is not None:
            return self._exit_code
        return EXIT_INTERRUPTED if self.reason is None else 1

    def terminating(self) -> None:
        """A SIGTERM arrived: the run ends with exit 143, at the latest ``grace_s`` from now."""
        if self._exit_code is None:
            self._exit_code = EXIT_TERMINATED
        self._count_signal()

    # ---- internals -----------------------------------------------------------------------

    def _count_signal(self) -> None:
        """A second signal exits at once; the first leaves ``grace_s`` for the run to end cleanly."""
        self.signals += 1
        if self.signals >= 2:
            self.force_exit()
        deadline = threading.Timer(self.grace_s, self.force_exit)
        deadline.daemon = True
        deadline.start()

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signals and now - self._last_signal < SAME_SIGNAL_S:
            return  # the same stop, delivered twice (to the process and to its group)
        self._last_signal = now
        self._count_signal()
        raise KeyboardInterrupt

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.terminating()
        raise KeyboardInterrupt

    def force_exit(self) -> None:
        """Print the message (unless already printed), run the cleanups and end the process now.

        Worker threads still waiting on a model call are dropped; their finished calls are cached. From
        here on only errors are logged: the interrupt's line stays the last thing the user reads, although a
        call may still answer (and warn, say about its price) while the clean-ups run."""
        logging.disable(logging.WARNING)
        if self.report_once():
            try:
                self.err.write(f"error: {self.message()}\n" if self.reason else f"{self.message()}\n")
                self.err.flush()
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
        for cleanup in self._cleanups:
            with contextlib.suppress(Exception):  # exiting anyway: a failed cleanup must not block the exit
                cleanup()
        os._exit(self.exit_code())

    def report_once(self) -> bool:
        """True the first time the interruption is reported: by the orderly path or by a forced exit."""
        with self._lock:
            if self._reported:
                return False
            self._reported = True
            return True


_active: InterruptGuard | None = None


def active_guard() -> InterruptGuard | None:
    """The guard of the run this process is running, if a command installed one."""
    return _active


@contextlib.contextmanager
def terminate_promptly() -> Iterator[None]:
    """While the block runs (in the main thread, inside a flow), a SIGTERM first arms the active guard's
    deadline (exit 143), then goes on to the handler that was in place (Prefect's)."""
    guard = _active
    if guard is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        guard.terminating()
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, previous)
