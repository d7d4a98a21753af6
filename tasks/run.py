"""The run a flow works on, with the task layer's one addition: the provider limiter the config asks for.

``start_run`` builds the flow's run in its own process; ``run_of`` gives any process (a worker that received
only the ``RunSpec``) the same run, built once per process. A ``Run`` sent to a Dask worker unpickles through
``skillopt.run.assembly.join_run`` with ``limiter_for`` below, so the worker's clients take the same limits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from skillopt.core.config import LoadedConfig, SkillOptConfig
from skillopt.llm.limiter import RateLimiter
from skillopt.run.assembly import Run, RunSpec, open_run, remember_run
from skillopt.run.prefetch import take_prepared

progress = logging.getLogger("skillopt.progress")


def limiter_for(config: SkillOptConfig, *, dask_client: Any = None) -> RateLimiter | None:
    """The clients' provider limiter: Prefect's global concurrency limits with ``model.rate_limit_mode:
    prefect``; with ``run.task_runner: dask`` and ``local`` limits, one limiter for the whole cluster (kept by
    its scheduler; ``dask_client`` is the flow's client, a worker uses its own); else None, the clients'
    own."""
    if config.model.rate_limit_mode == "prefect":
        from skillopt.tasks.limits import PrefectRateLimiter

        return PrefectRateLimiter(config.model.providers)
    if config.model.rate_limit_mode == "local" and config.run.task_runner == "dask":
        from skillopt.tasks.dask_limits import DaskRateLimiter

        return DaskRateLimiter(config.model.providers, client=dask_client,
                               timeout_s=config.run.dask_timeout_s)
    return None


def start_run(spec: RunSpec, *, loaded: LoadedConfig | None = None, dask_client: Any = None) -> Run:
    """Build the run ``spec`` describes for a flow in this process (``loaded``: the config, already
    validated; ``dask_client``: the flow's Dask client with ``run.task_runner: dask``)."""
    loaded = loaded or spec.loaded()
    if loaded.config.model.rate_limit_mode == "prefect":  # once per run, before any call
        from skillopt.tasks.limits import check_limits_exist

        check_limits_exist(loaded.config.model.providers)
    limiter = limiter_for(loaded.config, dask_client=dask_client)
    prepared = take_prepared(spec) if limiter is None else None
    if prepared is not None:  # built by the CLI before Prefect was loaded (skillopt.run.prefetch)
        run, messages = prepared
        for level, message in messages:
            progress.log(level, "%s", message)
    else:
        run = Run.build(spec, loaded=loaded, limiter=limiter)
    run.limiter_for = limiter_for
    return remember_run(run)


def run_of(spec: RunSpec) -> Run:
    """The run ``spec`` describes, built on first use in this process."""
    return open_run(spec, limiter_for=limiter_for)


@contextmanager
def started_run(spec: RunSpec, *, loaded: LoadedConfig | None = None) -> Iterator[Run]:
    """The flow's run with its task pools (``run.task_runner``) started around the flow's work, and stopped
    after it (a local Dask cluster with them), with the run's prefetch layer closed at the end."""
    from skillopt.tasks.runners import TaskPools, use_pools
    from skillopt.tasks.stale_runs import settle_previous_flow_run

    loaded = loaded or spec.loaded()
    with TaskPools(loaded.config.run) as pools:
        run = start_run(spec, loaded=loaded, dask_client=pools.client())
        settle_previous_flow_run(run.dir.path)  # this process holds the run directory's lock now
        use_pools(run, pools)
        try:
            yield run
        finally:
            run.prefetch.close()
