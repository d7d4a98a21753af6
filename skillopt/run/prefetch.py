"""The prefetch layer: it makes the model calls a run is about to ask for (rollouts, and the optimizer stages'
calls) on bounded pools of threads, so that their replies are already in the run's reply store when the
flow's tasks make the same calls.

The flow and the task layer give hints ("these rollouts will be asked for"): at the run's start step 1's
first batch, the baseline's selection rollouts and the starting skill's test split
(``Prefetcher.run_start``), and step 1's analyst calls once that first batch has answered, then the merges
of their patches (``Prefetcher.when_first_batch_answered`` and ``Prefetcher.results``: they read nothing the
baseline decides); once a step's update is
decided, the next step's first batch with the skill the step ends on, or, when that step ends the run on
its best skill, the best skill's test split; and each wave of rollouts the task layer is about to submit,
so its calls leave as the wave's task runs are being created instead of each after its own. The optimizer's
stages hint the same way (``Prefetcher.calls``): the function of the task they run next, with that task's
arguments, so its model call leaves before Prefect has created the task run. A hint decides nothing: the
task still runs its function as usual and decides what to make of the reply. Its model call finds the reply
the prefetch got (or waits on the reply store's claim while that call is in flight) and takes it as its own
call (``ReplyStore.take_prefetched``): a call is made, paid and recorded once, and is no cache hit.

Every rollout, prefetched or not, holds one of the run's ``benchmark.workers`` rollout slots
(``Run.rollout_slots``), and every call takes the clients' provider limiter: the prefetch adds no
concurrency of its own.

``skillopt train`` and ``demo`` start the layer before Prefect is loaded (``start_before_flow``): the CLI
builds the run in the library, hints its start, and the flow adopts that same run (``take_prepared``)
instead of building its own, so the first calls leave while Prefect imports and creates the flow run.

It does nothing where it cannot help: without a reply store, for the ``scripted`` backend (it answers
instantly), when the tasks run in other processes (``run.task_runner: dask``), when the provider limits are
Prefect's (``model.rate_limit_mode: prefect``: they need the flow's Prefect context, which the layer's threads
do not have), or with a budget cap (a cap must be able to stop the run before anything it did not decide
to spend is spent). A hinted rollout whose result is already in the task cache is skipped (its task would
never ask). A prefetched call that fails is left to its task, which makes it again with its retries.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from skillopt.llm.reply_store import PREFETCH
from skillopt.run.rollouts import direct_judge, first_batch, roll_out, rollout_key

if TYPE_CHECKING:
    from skillopt.core.config import LoadedConfig
    from skillopt.core.records import ItemResult
    from skillopt.run.assembly import Run, RunSpec

log = logging.getLogger(__name__)


def applies(run: Run) -> bool:
    """Whether prefetching can help ``run`` (see the module's docstring)."""
    config = run.config
    return (worth_prefetching(run.clients.target) and config.run.task_runner == "threads"
            and config.model.rate_limit_mode == "local" and not config.budget.capped)


def worth_prefetching(client: Any) -> bool:
    """Whether a role's calls are worth making ahead: they go through a reply store and take time."""
    return client.replies is not None and client.role.backend != "scripted"


class NotPrefetched(Exception):
    """A hint could not get the results it waits for (``Prefetcher.results``); its task makes the calls."""


class Prefetcher:
    """The calls hinted for one run: rollouts, each made at most once on a pool ``benchmark.workers`` wide,
    and optimizer calls on a pool ``gradient.analyst_workers`` wide."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.enabled = applies(run)
        self._workers = max(1, int(getattr(run.bench_cfg, "workers", 4)))
        self._pool: ThreadPoolExecutor | None = None
        self._calls: ThreadPoolExecutor | None = None
        self._hinted: set[str] = set()
        #: The rollouts of step 1's first batch, once ``run_start`` has started them all.
        self._first_batch: list[Future[ItemResult | None]] = []
        self._lock = threading.Lock()
        #: Set by ``close``: a hint still running then starts nothing more.
        self._closed = False

    def run_start(self) -> None:
        """The run's first rollouts: step 1's first batch, the baseline's selection split, then the starting
        skill's test split (``Run.baseline_test_ids``). The first batch goes first although the flow asks
        for the baseline first: the flow needs both before step 1 can merge, and step 1's analysts
        (``when_first_batch_answered``) can then be in flight while the baseline's rollouts are."""
        if not self.enabled:
            return
        run, skill = self.run, self.run.starting_skill()
        if (first := first_batch(run)) is not None:
            batch, draws = first
            started = self.rollouts(skill, batch.item_ids, training=True, epoch=draws.epoch,
                                    samples=draws.peek(batch.item_ids), view_seed=batch.seed)
            if len(started) == len(batch.item_ids):
                self._first_batch = started
        self.rollouts(skill, run.selection_ids("val"), training=False)
        self.rollouts(skill, run.baseline_test_ids(), training=False)

    def rollouts(self, skill: str, item_ids: Sequence[str], *, training: bool, epoch: int | None = None,
                 samples: Sequence[int] | None = None,
                 view_seed: int | None = None) -> list[Future[ItemResult | None]]:
        """Start the rollouts of ``item_ids`` with ``skill`` (one draw each, as ``evaluate`` asks for them)
        unless already hinted or in the task cache; the rollouts started (each one's row, None if it
        failed)."""
        started: list[Future[ItemResult | None]] = []
        if not self.enabled or not item_ids:
            return started
        run = self.run
        for item_id, sample in zip(item_ids, samples or [0] * len(item_ids), strict=True):
            draw: dict[str, Any] = {"training": training, "sample": sample, "epoch": epoch,
                                    "view_seed": view_seed}
            key = rollout_key(run, run.items[item_id], skill, **draw)
            with self._lock:
                if self._closed or key in self._hinted or run.served_from_cache(key):
                    continue
                self._hinted.add(key)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self._workers,
                                                    thread_name_prefix="skillopt-prefetch")
                started.append(self._pool.submit(self._roll_out, item_id, skill, draw))
        return started

    def when_first_batch_answered(self, then: Callable[[list[ItemResult]], None]) -> None:
        """Once step 1's first batch, all of it started by ``run_start``, has answered, ``then(rows)`` with
        its rows in order: a hint of the calls that read those rows (step 1's analysts), given before the flow
        has them. Nothing is hinted if ``run_start`` did not start the whole batch or a rollout failed, and
        only the first call hints."""
        futures, self._first_batch = self._first_batch, []
        if not futures:
            return
        waiting, lock = [len(futures)], threading.Lock()

        def one_done(_: Future[ItemResult | None]) -> None:
            with lock:
                waiting[0] -= 1
                if waiting[0]:
                    return
            rows = [row for future in futures
                    if not future.cancelled() and (row := future.result()) is not None]
            if len(rows) == len(futures):
                # On a thread of its own: ``then`` may wait for calls (``results``); this is a pool thread.
                threading.Thread(target=hint, args=(rows,), name="skillopt-prefetch-hint",
                                 daemon=True).start()

        def hint(rows: list[ItemResult]) -> None:
            try:
                then(rows)
            except Exception as error:  # noqa: BLE001 - the flow makes these calls itself
                log.debug("a hint after step 1's first batch failed: %r", error)

        for future in futures:
            future.add_done_callback(one_done)

    def calls(self, fn: Callable[..., Any], arguments: Sequence[Mapping[str, Any]]) -> None:
        """Start ``fn(**kwargs)`` for each of ``arguments``: a task's function with the arguments of the task
        runs the caller submits next (their model calls only; the result is the task's to return). At most
        ``gradient.analyst_workers`` at once, on a pool of their own (never behind prefetched rollouts)."""
        self._start_calls(fn, arguments)

    def results(self, fn: Callable[..., Any], arguments: Sequence[Mapping[str, Any]]) -> list[Any]:
        """``calls``, waiting for them: the result of ``fn(**kwargs)`` for each of ``arguments``, in order,
        for a hint whose next calls read them (step 1's merges read its analysts' patches). Raises
        ``NotPrefetched`` if the layer is off or a call failed. Not for a thread of the calls' own pool."""
        futures = self._start_calls(fn, arguments)
        if futures is None:
            raise NotPrefetched("the prefetch layer is off for this run, or closed")
        values = [future.result() for future in futures]
        if any(value is None for value in values):
            raise NotPrefetched(f"a prefetched call of {getattr(fn, '__name__', fn)} failed")
        return values

    def _start_calls(self, fn: Callable[..., Any],
                     arguments: Sequence[Mapping[str, Any]]) -> list[Future[Any]] | None:
        if not self.enabled or not worth_prefetching(self.run.clients.optimizer):
            return None
        with self._lock:
            if self._closed:
                return None
            if self._calls is None:
                width = max(1, self.run.config.gradient.analyst_workers)
                self._calls = ThreadPoolExecutor(max_workers=width,
                                                 thread_name_prefix="skillopt-prefetch-calls")
            return [self._calls.submit(self._call, fn, dict(kwargs)) for kwargs in arguments]

    def _call(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """``fn(**kwargs)`` as a prefetch, or None if it failed."""
        token = PREFETCH.set(True)
        try:
            return fn(**kwargs)
        except Exception as error:  # noqa: BLE001 - the task makes the call again and reports its error
            log.debug("a prefetched call of %s failed: %r", getattr(fn, "__name__", fn), error)
            return None
        finally:
            PREFETCH.reset(token)

    def _roll_out(self, item_id: str, skill: str, draw: dict[str, Any]) -> ItemResult | None:
        run = self.run
        token = PREFETCH.set(True)
        try:
            judge = direct_judge(run) if run.benchmark.needs_judge(run.bench_cfg) else None
            return roll_out(run, run.items[item_id], skill, judge=judge, **draw)
        except Exception as error:  # noqa: BLE001 - the task makes the call again and reports its error
            log.debug("a prefetched rollout of %s failed: %r", item_id, error)
            return None
        finally:
            PREFETCH.reset(token)

    def close(self) -> None:
        """Drop what has not started and start nothing more; calls in flight finish in the background (their
        replies are stored)."""
        with self._lock:
            self._closed = True
            pools, self._pool, self._calls = [self._pool, self._calls], None, None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


#: Runs built before their flow (``start_before_flow``), each with the progress lines its set-up logged.
_prepared: list[tuple[Run, list[tuple[int, str]]]] = []
_prepared_lock = threading.Lock()


def start_before_flow(loaded: LoadedConfig, *, cli_roles: Mapping[str, Any] | None,
                      run_name: str | None) -> str | None:
    """Build the training run the command is about to start and hint its start, before Prefect is loaded;
    the flow adopts the run (``take_prepared``). Returns the run's name for the flow (a fresh name is chosen
    here, once), or ``run_name`` where the run's limits are not this process's alone
    (``model.rate_limit_mode: prefect``) or its rollouts run elsewhere (``run.task_runner: dask``)."""
    from skillopt.run.assembly import Run, RunSpec

    config = loaded.config
    if config.run.task_runner != "threads" or config.model.rate_limit_mode != "local":
        return run_name
    spec = RunSpec.create(loaded, cli_roles=cli_roles, run_name=run_name)
    with _held_progress() as held:  # said by the flow when it adopts the run, in its logs and on the console
        run = Run.build(spec, loaded=loaded)
    if run.prefetch.enabled:
        # Imported here, in the main thread, before a prefetched call runs, not while this thread imports
        # Prefect: the backends' SDKs and httpx (Prefect imports it; the openai SDK looks it up in sys.modules
        # on every request and fails on a half-imported one: "partially initialized module 'httpx'").
        import httpx  # noqa: F401

        run.clients.target.backend  # noqa: B018 - built for its imports
        if run.benchmark.needs_judge(run.bench_cfg):
            run.clients.get("judge").backend  # noqa: B018
        run.prefetch.run_start()
    with _prepared_lock:
        _prepared.append((run, [(record.levelno, record.getMessage()) for record in held]))
    return run.run_name


def take_prepared(spec: RunSpec) -> tuple[Run, list[tuple[int, str]]] | None:
    """The run built before the flow for ``spec`` (same content key) and its set-up's progress lines, once;
    None if there is none. A run prepared for another spec has its prefetching stopped."""
    with _prepared_lock:
        waiting = list(_prepared)
        _prepared.clear()
    found = None
    for run, messages in waiting:
        if found is None and run.spec.key() == spec.key():
            found = (run, messages)
        else:
            run.prefetch.close()
    return found


@contextmanager
def _held_progress() -> Iterator[list[logging.LogRecord]]:
    """The progress lines logged inside, kept instead of emitted: before the flow runs they have no handler
    (an INFO line would be lost, a warning printed bare on stderr)."""
    held: list[logging.LogRecord] = []

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            held.append(record)

    progress = logging.getLogger("skillopt.progress")
    handler, propagate, level = Hold(logging.INFO), progress.propagate, progress.level
    progress.addHandler(handler)
    progress.propagate = False
    progress.setLevel(logging.INFO)
    try:
        yield held
    finally:
        progress.removeHandler(handler)
        progress.propagate = propagate
        progress.setLevel(level)
