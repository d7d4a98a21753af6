"""A local Dask cluster's workers stop the agent CLIs they started when the run stops.

An exec target's rollouts start agent CLIs in the worker processes, each the leader of a process group of
its own (``skillopt.sandbox.process_group``). In the run's own process the exit clean-up (``end_leftovers``)
stops such groups and removes their workspaces. A worker process of a local cluster, though, ends with the
run's process by ``os._exit`` (Dask watches its parent), which runs no clean-up: its CLIs, their children
and their workspaces outlived the run. So, for a local cluster:

- every worker process gets :class:`EndLeftovers` (a worker plugin, passed with the cluster's worker
  arguments): on SIGTERM it ends its leftovers and then exits, and closing the worker (the cluster's orderly
  stop) ends them too. SIGINT is ignored: the terminal's Ctrl-C reaches the workers too (they are in its
  process group), and stopping them is up to the run's process;
- the run's process lists the workers for its own exit clean-up (``end_with_leftovers``), which sends each
  SIGTERM and waits for it.

The workers of a cluster the run only connects to (``run.dask_address``) are not the run's: nothing changes
for them.

Used only with ``run.task_runner: dask`` (the ``dask`` extra); without the extra it imports and does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed.diagnostics.plugin import WorkerPlugin
else:
    try:
        from distributed.diagnostics.plugin import WorkerPlugin
    except ImportError:  # no dask extra: runs are on threads and nothing here is used, but the module imports
        WorkerPlugin = object

from skillopt.sandbox.process_group import HELPER_GRACE_S, end_leftovers


class EndLeftovers(WorkerPlugin):
    """In a local cluster's worker process: SIGTERM and closing the worker stop its agent CLIs and remove
    their workspaces (``end_leftovers``); SIGINT is ignored."""

    name = "skillopt-end-leftovers"

    def setup(self, worker: Any) -> None:
        # Called in the worker's event loop, which runs in the process's main thread: a handler added to it
        # runs at once, also while the loop waits.
        with contextlib.suppress(RuntimeError, ValueError, NotImplementedError):  # no loop, thread or signals
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, _terminated, loop)
            loop.add_signal_handler(signal.SIGINT, _ignored)

    def teardown(self, worker: Any) -> None:
        _end_leftovers()


def _end_leftovers() -> None:
    # The rollouts whose CLIs this stops end as crashed task runs: not news on the run's console, where the
    # run's process reports why it stops (their state still reaches the Prefect API).
    logging.getLogger("prefect").setLevel(logging.CRITICAL)
    end_leftovers(grace_s=HELPER_GRACE_S)


def _terminated(loop: asyncio.AbstractEventLoop) -> None:
    """SIGTERM: end the leftovers, then end the process as SIGTERM would have."""
    try:
        _end_leftovers()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)  # back to the default action
        os.kill(os.getpid(), signal.SIGTERM)


def _ignored() -> None:
    """SIGINT: a caught signal (not SIG_IGN, which the agent CLIs would inherit) that does nothing."""


def worker_processes(cluster: Any) -> list[Any]:
    """The worker processes of a local cluster started with ``processes=True``, as the run's process holds
    them (``pid`` and ``is_alive()``)."""
    found = []
    for nanny in list(getattr(cluster, "workers", {}).values()):
        process = getattr(getattr(nanny, "process", None), "process", None)
        if process is not None:
            found.append(process)
    return found
