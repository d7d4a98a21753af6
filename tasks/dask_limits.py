"""Provider limits for the whole Dask cluster (``run.task_runner: dask`` with ``model.rate_limit_mode:
local``).

Every process of a run — the flow and each worker — builds its clients with this limiter, so the limits
of ``model.providers`` hold for the run as a whole, not per process. It is built from dask.distributed's own
primitives, kept by the cluster's scheduler:

- ``max_concurrency``: a ``distributed.Semaphore`` named after the key, with that many leases. A lease held
  by a worker that dies expires on the scheduler, so a killed worker never keeps a slot;
- ``rpm`` / ``tpm``: the same start-time reservation as the in-process limiter (the next request slot
  ``60/rpm`` apart, room for the call's estimated tokens), kept in the scheduler's metadata under a
  one-lease semaphore used as the lock. Times are wall-clock seconds, since the processes do not share a
  monotonic clock (hosts keep their clocks in step with NTP);
- a 429 sets the key's pause in the same record, so every process backs off, not just the one that was told
  (each caller still with its own jitter after the pause, as in one process).

Every exchange with the scheduler is bounded by ``timeout_s`` (``run.dask_timeout_s``): a scheduler that is
gone or frozen would otherwise hold a call in the flow's process (an analyst's, say) for ever. In the flow's
process that stops the run the way a lost cluster does (exit 2, :mod:`skillopt.tasks.dask_wait`); on a
worker the call fails with ``TimeoutError``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn

from skillopt.core.config import ProviderLimits
from skillopt.llm.limiter import LocalRateLimiter, Pause
from skillopt.tasks.dask_wait import lose_cluster
from skillopt.tasks.limits import limit_name


class DaskRateLimiter:
    """The ``RateLimiter`` protocol over a Dask cluster's semaphores and scheduler metadata.

    ``client`` is the flow's Dask client; on a worker it stays None and the worker's own connection is used.
    One ``Semaphore`` object per name and process, made on first use: each keeps its leases alive on the
    scheduler while it holds them."""

    def __init__(self, providers: Mapping[str, ProviderLimits], *, client: Any = None,
                 defaults: Mapping[str, ProviderLimits] | None = None,
                 timeout_s: float | None = None) -> None:
        self.providers = providers
        self.defaults = defaults or {}
        self.timeout_s = timeout_s
        self._client = client
        self._semaphores: dict[str, Any] = {}
        self._lock = threading.Lock()

    def limits(self, key: str) -> ProviderLimits | None:
        return self.providers.get(key) or self.defaults.get(key)

    @contextmanager
    def acquire(self, key: str, *, tokens: int) -> Iterator[None]:
        limits = self.limits(key)
        if limits is None:
            yield
            return
        with self._shared(key, limits) as local:
            start = local.reserve(key, tokens=tokens)
        wait = start - time.time()
        if wait > 0:
            time.sleep(wait)
        if not limits.max_concurrency:
            yield
            return
        with self._held(self._semaphore(limit_name(key, "conc"), limits.max_concurrency)):
            yield

    def rollout_slots(self, name: str, size: int) -> DaskSlots:
        """``size`` slots for the whole cluster under ``name`` (the run's ``benchmark.workers`` rollout slots:
        ``skillopt.run.rollouts.RolloutSlots`` bounds one process only, and a run's rollouts spread over every
        worker process)."""
        return DaskSlots(self, name, size)

    def pause(self, key: str, seconds: float) -> None:
        with self._shared(key, self.limits(key) or ProviderLimits()) as local:
            local.pause(key, seconds)

    def _connection(self) -> Any:
        """The flow's client, or this worker (both have ``scheduler`` and ``loop``)."""
        if self._client is not None:
            return self._client
        from distributed import get_worker

        return get_worker()

    def _semaphore(self, name: str, leases: int) -> Any:
        from distributed import Semaphore

        with self._lock:
            semaphore = self._semaphores.get(name)
            if semaphore is None:
                connection = self._connection()
                semaphore = self._semaphores[name] = Semaphore(
                    max_leases=leases, name=name, scheduler_rpc=connection.scheduler, loop=connection.loop)
            return semaphore

    @contextmanager
    def _shared(self, key: str, limits: ProviderLimits) -> Iterator[LocalRateLimiter]:
        """A one-bucket in-process limiter loaded with the key's shared record, saved back on leaving, all
        under the key's cluster-wide lock: both limiters reserve with the same arithmetic."""
        connection = self._connection()
        name = limit_name(key, "reservations")
        with self._held(self._semaphore(limit_name(key, "lock"), 1)):
            saved = self._sync(connection, connection.scheduler.get_metadata, keys=[name], default=None) or {}
            local = LocalRateLimiter(providers={key: limits}, clock=time.time)
            bucket = local._bucket(key)  # noqa: SLF001 - the one bucket, loaded from the shared record
            bucket.request_at = saved.get("request_at", float("-inf"))
            bucket.tokens_at = saved.get("tokens_at", float("-inf"))
            bucket.pause = Pause(
                until=saved.get("pause_until", float("-inf")), spread=saved.get("pause_spread", 0.0)
            )
            yield local
            self._sync(connection, connection.scheduler.set_metadata, keys=[name],
                  value={"request_at": bucket.request_at, "tokens_at": bucket.tokens_at,
                         "pause_until": bucket.pause.until, "pause_spread": bucket.pause.spread})


    @contextmanager
    def _held(self, semaphore: Any) -> Iterator[None]:
        """One lease of ``semaphore`` for the block (``_take``)."""
        self._take(semaphore)
        try:
            yield
        finally:
            semaphore.release()

    def _take(self, semaphore: Any) -> None:
        """One lease of ``semaphore``; asking for it waits at most ``timeout_s`` in all
        (``Semaphore.acquire``'s own timeout does not cover a scheduler that does not answer)."""
        try:
            acquired = semaphore.sync(semaphore._acquire, timeout=self.timeout_s,  # noqa: SLF001
                                      callback_timeout=self.timeout_s)
        except TimeoutError:
            acquired = False
        if not acquired:
            self._lost(f"the Dask scheduler gave no {semaphore.name!r} lease within {self.timeout_s:g} s")

    def _sync(self, connection: Any, call: Any, **kwargs: Any) -> Any:
        """Run a scheduler call from a thread that is not the connection's event loop, for at most
        ``timeout_s``."""
        from distributed.utils import sync

        try:
            return sync(connection.loop, call, callback_timeout=self.timeout_s, **kwargs)
        except TimeoutError:
            self._lost(f"the Dask scheduler did not answer within {self.timeout_s:g} s")

    def _lost(self, what: str) -> NoReturn:
        if self._client is None:  # on a worker: the call fails (its task cannot report to the scheduler)
            raise TimeoutError(f"{what} (run.dask_timeout_s)")
        lose_cluster(f"{what} (run.dask_timeout_s)")


class DaskSlots:
    """``RolloutSlots``' ``acquire``/``release`` over a cluster-wide semaphore of ``size`` leases: every
    process of the run (the flow and each worker) holds at most ``size`` rollouts in flight together. A worker
    that dies holding a lease loses it once the scheduler's lease timeout passes."""

    def __init__(self, limiter: DaskRateLimiter, name: str, size: int) -> None:
        self.size = max(1, size)
        self._limiter = limiter
        self._name = f"skillopt-rollouts-{name}"

    def acquire(self) -> None:
        self._limiter._take(self._limiter._semaphore(self._name, self.size))  # noqa: SLF001

    def release(self) -> None:
        self._limiter._semaphore(self._name, self.size).release()  # noqa: SLF001
