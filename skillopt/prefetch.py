"""The prefetch layer: it makes the rollouts a run is about to ask for on a bounded pool of threads, so that
their replies are already in the run's reply store when the flow's tasks make the same calls.

The flow and the task layer give hints ("these rollouts will be asked for"): at the run's start the first
batch of step 1, the baseline's selection rollouts and the starting skill's test split
(``Prefetcher.run_start``); once a step's update is decided, the next step's first batch with the skill
the step ends on; and each wave of rollouts the task layer is about to submit, so its calls leave together
instead of one task start after another. The optimizer's stages hint the same way (``Prefetcher.calls``):
the function of the task they run next, with that task's arguments, so its model call leaves before Prefect
has created the task run. A hint decides nothing: the task still runs its function as usual and decides what
to make of the reply. Its model call finds the reply the prefetch got (or waits on the reply store's claim
while that call is in flight) and takes it as its own call (``ReplyStore.take_prefetched``): a call is made,
paid and recorded once, and is no cache hit.

Every rollout, prefetched or not, holds one of the run's ``benchmark.workers`` rollout slots
(``Run.rollout_slots``), and every call takes the clients' provider limiter: the prefetch adds no
concurrency of its own.

It does nothing where it cannot help: without a reply store (the ``scripted`` backend answers instantly), when
the tasks run in other processes (``run.task_runner: dask``), or with a budget cap (a cap must be able to
stop the run before anything it did not decide to spend is spent). A hinted rollout whose result is already in
the task cache is skipped (its task would never ask). A prefetched call that fails is left to its task,
which makes it again with its retries.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from skillopt.llm.reply_store import PREFETCH
from skillopt.rollouts import direct_judge, first_batch, roll_out, rollout_key

if TYPE_CHECKING:
    from skillopt.assembly import Run

log = logging.getLogger(__name__)


def applies(run: Run) -> bool:
    """Whether prefetching can help ``run`` (see the module's docstring)."""
    config = run.config
    return (run.clients.target.replies is not None and config.run.task_runner == "threads"
            and not config.budget.capped)


class Prefetcher:
    """The rollouts hinted for one run, made at most once each on a pool ``benchmark.workers`` wide."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.enabled = applies(run)
        self._workers = max(1, int(getattr(run.bench_cfg, "workers", 4)))
        self._pool: ThreadPoolExecutor | None = None
        self._calls: ThreadPoolExecutor | None = None
        self._hinted: set[str] = set()
        self._lock = threading.Lock()

    def run_start(self) -> None:
        """The run's first rollouts: step 1's first batch (its optimizer calls wait for it alone), the
        baseline's selection split, then the starting skill's test split (``Run.baseline_test_ids``)."""
        if not self.enabled:
            return
        run, skill = self.run, self.run.starting_skill()
        if (first := first_batch(run)) is not None:
            batch, draws = first
            self.rollouts(skill, batch.item_ids, training=True, epoch=draws.epoch,
                          samples=draws.peek(batch.item_ids), view_seed=batch.seed)
        self.rollouts(skill, run.selection_ids("val"), training=False)
        self.rollouts(skill, run.baseline_test_ids(), training=False)

    def rollouts(self, skill: str, item_ids: Sequence[str], *, training: bool, epoch: int | None = None,
                 samples: Sequence[int] | None = None, view_seed: int | None = None) -> None:
        """Start the rollouts of ``item_ids`` with ``skill`` (one draw each, as ``evaluate`` asks for them)
        unless already hinted or in the task cache."""
        if not self.enabled or not item_ids:
            return
        run = self.run
        for item_id, sample in zip(item_ids, samples or [0] * len(item_ids), strict=True):
            draw: dict[str, Any] = {"training": training, "sample": sample, "epoch": epoch,
                                    "view_seed": view_seed}
            key = rollout_key(run, run.items[item_id], skill, **draw)
            with self._lock:
                if key in self._hinted or run.served_from_cache(key):
                    continue
                self._hinted.add(key)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self._workers,
                                                    thread_name_prefix="skillopt-prefetch")
                self._pool.submit(self._roll_out, item_id, skill, draw)

    def calls(self, fn: Callable[..., Any], arguments: Sequence[Mapping[str, Any]]) -> None:
        """Start ``fn(**kwargs)`` for each of ``arguments``: a task's function with the arguments of the task
        runs the caller submits next (their model calls only; the result is the task's to return). At most
        ``gradient.analyst_workers`` at once, on a pool of their own (never behind prefetched rollouts)."""
        if not self.enabled or not arguments or self.run.clients.optimizer.replies is None:
            return
        with self._lock:
            if self._calls is None:
                width = max(1, self.run.config.gradient.analyst_workers)
                self._calls = ThreadPoolExecutor(max_workers=width,
                                                 thread_name_prefix="skillopt-prefetch-calls")
            for kwargs in arguments:
                self._calls.submit(self._call, fn, dict(kwargs))

    def _call(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        token = PREFETCH.set(True)
        try:
            fn(**kwargs)
        except Exception as error:  # noqa: BLE001 - the task makes the call again and reports its error
            log.debug("a prefetched call of %s failed: %r", getattr(fn, "__name__", fn), error)
        finally:
            PREFETCH.reset(token)

    def _roll_out(self, item_id: str, skill: str, draw: dict[str, Any]) -> None:
        run = self.run
        token = PREFETCH.set(True)
        try:
            judge = direct_judge(run) if run.benchmark.needs_judge(run.bench_cfg) else None
            roll_out(run, run.items[item_id], skill, judge=judge, **draw)
        except Exception as error:  # noqa: BLE001 - the task makes the call again and reports its error
            log.debug("a prefetched rollout of %s failed: %r", item_id, error)
        finally:
            PREFETCH.reset(token)

    def close(self) -> None:
        """Drop what has not started; calls in flight finish in the background (their replies are stored)."""
        with self._lock:
            pools, self._pool, self._calls = [self._pool, self._calls], None, None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
