"""Where a run's fanned-out tasks execute: a bounded thread pool in the flow's process, or a Dask cluster.

``run.task_runner: threads`` (the default) gives every evaluation a fresh ``ThreadPoolTaskRunner``
``benchmark.workers`` wide, as before. ``run.task_runner: dask`` starts prefect-dask's
``DaskTaskRunner`` once for the whole flow run, on the cluster at ``run.dask_address`` or on a local cluster
of ``run.dask_n_workers`` worker processes, and hands the same entered runner to every evaluation (and, with
``run.dask_scope: all``, to the analysts and merges): connecting a client or starting worker processes per
evaluation would cost seconds each time. The tasks themselves carry only the run's spec, so a worker
rebuilds the run once per process.

prefect-dask is imported only when a run asks for Dask; without the ``dask`` extra the run stops before
anything starts, naming the pip command.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, Literal

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from skillopt.core.config import RunSection
from skillopt.core.errors import ConfigError
from skillopt.run.assembly import Run
from skillopt.sandbox.process_group import end_with_leftovers
from skillopt.shell.interrupt import terminate_promptly
from skillopt.tasks.dask_wait import BoundedFuture, ClusterWatch

#: The stages whose tasks can leave the flow's process.
Stage = Literal["rollouts", "analysts"]


def check_dask_installed() -> None:
    """Raise a ``ConfigError`` naming the extra when prefect-dask or distributed is missing."""
    try:
        import distributed  # noqa: F401
        import prefect_dask  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            f"run.task_runner: dask needs prefect-dask and dask.distributed ({error.name} is not installed): "
            "pip install 'skillopt[dask]'"
        ) from error


def dask_task_runner(run: RunSection) -> Any:
    """A (not yet started) ``DaskTaskRunner`` for ``run.dask_address`` or a local cluster sized by ``run``
    (typed ``Any``: prefect-dask is an optional extra, absent where the types are checked)."""
    check_dask_installed()
    from prefect.settings import PREFECT_LOGGING_LEVEL
    from prefect_dask import DaskTaskRunner

    # distributed logs every client, worker and stream it opens or closes at INFO, and its records reach the
    # terminal through the root handler of Prefect's logging set-up (a local cluster's ``silence_logs`` quiets
    # only handlers of distributed's own): keep them off the run's output; problems still show as errors.
    logging.getLogger("distributed").setLevel(logging.ERROR)
    if run.dask_address:
        return DaskTaskRunner(address=run.dask_address)
    from skillopt.tasks.dask_workers import EndLeftovers

    # Each worker process stops its agent CLIs when the run stops, and logs its task runs at the level this
    # process does: a worker reads Prefect's settings from its environment when it starts, not the settings
    # this run has in place (the command line's WARNING unless the user set a level), and would print three
    # INFO lines for every task run.
    cluster: dict[str, Any] = {
        "processes": True, "silence_logs": logging.ERROR, "plugins": (EndLeftovers(),),
        "env": {"PREFECT_LOGGING_LEVEL": str(PREFECT_LOGGING_LEVEL.value())},
    }
    if run.dask_n_workers is not None:
        cluster["n_workers"] = run.dask_n_workers
    if run.dask_threads_per_worker is not None:
        cluster["threads_per_worker"] = run.dask_threads_per_worker
    return DaskTaskRunner(cluster_kwargs=cluster)


class TaskPools:
    """The task runners of one flow run, by stage. Enter it once around the flow's work."""

    def __init__(self, run: RunSection) -> None:
        self.settings = run
        self._dask: Any = None  # the started DaskTaskRunner
        self._cluster: Any = None  # the local cluster it started, if any
        self._watch: ClusterWatch | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> TaskPools:
        # first: a missing extra stops the run before anything starts
        runner = dask_task_runner(self.settings) if self.settings.task_runner == "dask" else None
        # A SIGTERM arms the run's exit deadline before Prefect's handler (which crashes the flow run) runs:
        # the orderly exit would otherwise wait for every rollout in flight.
        self._stack.enter_context(terminate_promptly())
        if runner is not None:
            self._stack.enter_context(_api_the_workers_reach())
            if not self.settings.dask_address:
                # The exit clean-up has the local cluster's workers stop their agent CLIs
                # (tasks/dask_workers.py); listed until the cluster is closed.
                from skillopt.tasks.dask_workers import worker_processes

                self._stack.callback(end_with_leftovers(lambda: worker_processes(self._cluster)))
            self._stack.enter_context(runner)
            runner.client  # noqa: B018 - start the cluster (or connect) now, not in whichever thread submits first
            self._dask = runner
            self._cluster = getattr(runner.client, "cluster", None)
            self._watch = ClusterWatch(runner.client, self.settings.dask_timeout_s)
        return self

    def __exit__(self, *exc: object) -> None:
        self._dask = None
        if self._watch is not None and self._watch.lost:
            # The cluster is gone or frozen: closing the client (or a local cluster) would wait on it. The
            # process is about to exit; its worker processes die with it.
            self._stack.pop_all()
            return
        self._stack.close()

    @property
    def on_dask(self) -> bool:
        return self._dask is not None

    def client(self) -> Any:
        """The started Dask client (for cluster-wide primitives); None on threads."""
        return self._dask.client if self._dask is not None else None

    def pool(self, stage: Stage, workers: int) -> AbstractContextManager[TaskRunner]:
        """The runner ``stage``'s tasks are submitted to: the cluster's, or a thread pool ``workers`` wide."""
        if self._dask is not None and (
            stage == "rollouts" or self.settings.dask_scope == "rollouts_and_analysts"
        ):
            assert self._watch is not None
            return _shared(_BoundedDask(self._dask, self._watch))
        return ThreadPoolTaskRunner(max_workers=max(1, workers))


_pools: weakref.WeakKeyDictionary[Run, TaskPools] = weakref.WeakKeyDictionary()
_pools_lock = threading.Lock()


def use_pools(run: Run, pools: TaskPools) -> None:
    """Make ``pool_for(run, ...)`` use ``pools`` (the flow's, started around its work)."""
    with _pools_lock:
        _pools[run] = pools


def pool_for(run: Run, stage: Stage, workers: int) -> AbstractContextManager[Any]:
    """Where ``stage``'s tasks of ``run`` go: the flow's pools, or (no pools: a process without a flow of this
    run, such as a test calling a stage) a thread pool ``workers`` wide."""
    with _pools_lock:
        pools = _pools.get(run)
    if pools is None:
        return ThreadPoolTaskRunner(max_workers=max(1, workers))
    return pools.pool(stage, workers)


class _BoundedDask:
    """The started ``DaskTaskRunner`` as a stage sees it: ``submit`` hands back futures that never wait past
    the run's :class:`~skillopt.tasks.dask_wait.ClusterWatch`."""

    def __init__(self, runner: Any, watch: ClusterWatch) -> None:
        self._runner = runner
        self._watch = watch

    def submit(self, task: Any, parameters: dict[str, Any], *args: Any, **kwargs: Any) -> BoundedFuture:
        self._watch.check()

        def submit() -> Any:
            return self._runner.submit(task, parameters, *args, **kwargs)

        return BoundedFuture(submit(), self._watch, resubmit=submit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


@contextlib.contextmanager
def _shared(runner: Any) -> Iterator[Any]:
    """An already started runner, lent for one stage (leaving the block does not stop it)."""
    yield runner


@contextlib.contextmanager
def _api_the_workers_reach() -> Iterator[None]:
    """Workers report their task runs to the flow's Prefect API, named in the settings that travel with each
    task. Without ``PREFECT_API_URL`` that API is Prefect's temporary server, a subprocess of this process on
    a loopback port: name its address for the workers, or each worker would start a temporary server of its
    own (this serves a local cluster; workers on other hosts need a real server, docs/scale-out.md)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if PREFECT_API_URL.value():
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()  # the flow's own client started it already; this only reads its address
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        yield
