"""Waiting on a Dask cluster with a bound (``run.task_runner: dask``).

Dask copes with a lost worker by itself: the scheduler runs the worker's unfinished tasks again on the
others, and since every model reply is stored the moment it arrives, only the calls in flight on that
worker are made again. What it does not bound is the wait when the cluster itself cannot finish: no
workers left, the scheduler gone or frozen, or results it keeps failing to gather (its log then repeats
"Couldn't gather N keys, rescheduling"). A plain ``future.result()`` then waits for ever.

So the rollouts' futures are waited on in short slices, all against one :class:`ClusterWatch` per run:
while tasks are outstanding and none of them has finished for ``run.dask_timeout_s`` seconds, the run
stops with one line saying what the cluster looks like and exit 2. Each rollout is its own cached task,
so a re-run of the same command resumes from every rollout that finished.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from skillopt.shell.interrupt import RESUME_HINT, active_guard

#: How often a waiting thread looks up from its future (and at the watch's clock).
SLICE_S = 1.0
#: Exit status of a run stopped because its cluster could not finish.
EXIT_CLUSTER_LOST = 2


class ClusterLost(BaseException):
    """The cluster finished nothing for ``run.dask_timeout_s``: the run stops.

    A ``BaseException``, like ``KeyboardInterrupt``: it is not an item's failure, so the code that turns
    a rollout's exception into an error row lets it through."""


def lose_cluster(what: str) -> NoReturn:
    """Stop the run because its cluster stopped answering: through the command's interrupt guard (one line,
    exit 2) and by raising :class:`ClusterLost` where the run waited."""
    message = f"{what}; {RESUME_HINT}"
    guard = active_guard()
    if guard is not None:
        guard.stop_because(message, exit_code=EXIT_CLUSTER_LOST)
    raise ClusterLost(message)


class ClusterWatch:
    """The time since the last task of this run finished on the cluster, while some are outstanding."""

    def __init__(self, client: Any, timeout_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._outstanding = 0
        self._progress_at = clock()
        self._lost: str | None = None

    def submitted(self) -> None:
        with self._lock:
            if self._outstanding == 0:  # the clock starts with the first outstanding task
                self._progress_at = self._clock()
            self._outstanding += 1

    def finished(self) -> None:
        with self._lock:
            self._outstanding = max(0, self._outstanding - 1)
            self._progress_at = self._clock()

    @property
    def lost(self) -> bool:
        with self._lock:
            return self._lost is not None

    def stalled_for(self) -> float:
        with self._lock:
            return self._clock() - self._progress_at if self._outstanding else 0.0

    def check(self) -> None:
        """Raise :class:`ClusterLost` (and stop the run through the command's interrupt guard, once) when
        nothing has finished for ``timeout_s``."""
        with self._lock:
            lost = self._lost
        if lost is None and self.stalled_for() < self.timeout_s:
            return
        if lost is None:
            message = (f"the Dask cluster finished no task for {self.timeout_s:g} s (run.dask_timeout_s): "
                       f"{self.describe()}; {RESUME_HINT}")
            with self._lock:
                first = self._lost is None
                if first:
                    self._lost = message
                lost = self._lost
            if first:
                guard = active_guard()
                if guard is not None:
                    guard.stop_because(message, exit_code=EXIT_CLUSTER_LOST)
        raise ClusterLost(lost)

    def describe(self, timeout_s: float = 5.0) -> str:
        """What the cluster looks like, for the stop message: its workers, or that the scheduler does not
        answer."""
        address = getattr(getattr(self.client, "scheduler", None), "address", None) or "its scheduler"
        try:
            info = self.client.sync(self.client.scheduler.identity, callback_timeout=timeout_s)
        except BaseException:  # noqa: BLE001 - any failure to answer is the answer
            return f"the scheduler at {address} does not answer"
        workers = len(info.get("workers", {})) if isinstance(info, dict) else 0
        if workers == 0:
            return f"the scheduler at {address} has no workers left"
        return f"the scheduler at {address} answers with {workers} worker(s), but their results never arrive"


class BoundedFuture:
    """A prefect-dask future whose ``result`` and ``wait`` never wait past the run's cluster watch.

    A task the scheduler drops (its future comes back cancelled: the scheduler lost its state, or the client
    its connection to the scheduler) is submitted again with ``resubmit``; the watch bounds how long that
    goes on."""

    def __init__(self, future: Any, watch: ClusterWatch, resubmit: Callable[[], Any] | None = None) -> None:
        self._future = future
        self._watch = watch
        self._resubmit = resubmit
        self._counted = True
        watch.submitted()

    @property
    def task_run_id(self) -> Any:
        return self._future.task_run_id

    @property
    def state(self) -> Any:
        return self._future.state

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any:
        self._wait_done(timeout)
        self._settle()
        return self._future.result(raise_on_failure=raise_on_failure)

    def wait(self, timeout: float | None = None) -> None:
        try:
            self._wait_done(timeout)
        except TimeoutError:
            return
        self._settle()

    def _wait_done(self, timeout: float | None) -> None:
        started = time.monotonic()
        while True:
            wrapped = self._future.wrapped_future
            while not wrapped.done():
                self._watch.check()
                left = None if timeout is None else timeout - (time.monotonic() - started)
                if left is not None and left <= 0:
                    raise TimeoutError(f"task run {self.task_run_id} did not complete within {timeout} s")
                try:
                    wrapped.result(timeout=SLICE_S if left is None else min(SLICE_S, left))
                except Exception:  # noqa: BLE001 - done (with an error, read below) or still running
                    continue
            if self._resubmit is None or not wrapped.cancelled():
                return
            self._submit_again()

    def _submit_again(self) -> None:
        """Submit the dropped task again, retrying until the scheduler takes it or the watch gives up."""
        while True:
            self._watch.check()
            try:
                self._future = self._resubmit() if self._resubmit is not None else self._future
                return
            except Exception:  # noqa: BLE001 - no scheduler to take it yet
                time.sleep(SLICE_S)

    def _settle(self) -> None:
        if self._counted:
            self._counted = False
            self._watch.finished()


__all__ = ["EXIT_CLUSTER_LOST", "SLICE_S", "BoundedFuture", "ClusterLost", "ClusterWatch", "lose_cluster"]
