"""A training run's first model calls, started before Prefect is imported.

Importing Prefect and starting the ``skill-train`` flow takes 2-4 s on a fast machine, and nothing of the
first wave of work depends on it: the baseline (the initial skill on the selection split) and step 1's
first batch of rollouts need only the run itself. So ``skillopt train`` builds the run in the library
(``Run.build``, the same run the flow then adopts, see ``hand_over``) and starts those rollouts at once on a
pool of the benchmark's ``workers`` threads, while Prefect loads.

When the flow's ``rollout_item`` task for one of them runs, it takes the early result (``EarlyRollouts.take``,
waiting for it while it is in flight) instead of calling again; a rollout the pool has not started yet when
its task asks for it is cancelled here and made by the task. Each call is accounted once, when it is made;
the flow's tasks, their cache entries and the Prefect UI are the same as without an early start.

Step 1 goes further ahead: once its first batch is rolled out and the flow's modules are loaded, its analyst,
merge and ranking calls and its candidate's selection rollouts are made as plain calls
(``flows.stages.step_one_ahead``, in an ``AHEAD`` context), while the flow still creates its baseline's task
runs and the epoch subflow. The reply store answers each request once in this process: the flow's task that
asks for a request made ahead waits for it if it is in flight and takes its reply as its own call
(``ReplyStore.take_ahead``), so the call is made, paid and recorded once and is no cache hit.

The flow uses the same pool for every later wave of rollouts (``tasks/rollout.run_rollouts``, in
deployment runs too, where ``tasks/run.start_run`` makes it): a wave's calls are started here together, and
each ``rollout_item`` task takes its result once Prefect has started it.

Only where the flow's rollouts run in this process under this process's limits (``run.task_runner:
threads``, ``model.rate_limit_mode: local``) and the target's replies are stored the moment they arrive (every
backend but ``scripted``), so a run killed after an early call resumes without making it again; with a budget
cap only the baseline starts early (a cap must be able to stop the run before step 1 spends anything).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from skillopt.assembly import Run, RunSpec, hand_over
from skillopt.config import LoadedConfig, SkillOptConfig
from skillopt.llm.reply_store import AHEAD
from skillopt.records import ItemResult
from skillopt.rollouts import direct_judge, first_batch, roll_out, rollout_key
from skillopt.skill import skill_hash

log = logging.getLogger(__name__)

#: A rollout as the flow asks for it: skill hash, item id, training, sample, epoch, batch view seed.
EarlyKey = tuple[str, str, bool, int, "int | None", "int | None"]


def early_key(skill: str, item_id: str, *, training: bool, sample: int = 0, epoch: int | None = None,
              view_seed: int | None = None) -> EarlyKey:
    return (skill_hash(skill), item_id, training, sample, epoch, view_seed)


class EarlyRollouts:
    """Rollouts started ahead of their tasks, each taken once by the task that asks for it."""

    def __init__(self, workers: int) -> None:
        #: Rollouts in flight at most (the pool's threads).
        self.workers = max(1, workers)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="skillopt-early")
        self._futures: dict[EarlyKey, Future[ItemResult]] = {}
        self._lock = threading.Lock()
        #: Set when the flow adopts the run (True) or the run is closed unadopted (False).
        self._flow = threading.Event()
        self._adopted = False

    def submit(self, key: EarlyKey, rollout: Callable[[], ItemResult]) -> Future[ItemResult]:
        with self._lock:
            future = self._futures[key] = self._pool.submit(rollout)
        return future

    def start(self, run: Run, item_id: str, skill: str, judge: Any, *, training: bool, sample: int = 0,
              epoch: int | None = None,
              view_seed: int | None = None) -> tuple[Future[ItemResult] | None, bool]:
        """The rollout of ``item_id`` with ``skill`` that its ``rollout_item`` task will ask for, started now
        unless it is started and not yet taken, and whether it was started now. None if its task will be
        served from the cache (a re-run: the task would never take it, and the call would find its reply
        stored)."""
        draw: dict[str, Any] = {"training": training, "sample": sample, "epoch": epoch,
                                "view_seed": view_seed}
        if run.served_from_cache(rollout_key(run, run.items[item_id], skill, **draw)):
            return None, False
        key = early_key(skill, item_id, **draw)
        with self._lock:
            if key in self._futures:
                return self._futures[key], False
            future = self._futures[key] = self._pool.submit(_rollout(run, item_id, skill, judge, **draw))
        return future, True

    def adopted(self) -> None:
        """The flow took the run over (its modules, Prefect's among them, are loaded)."""
        self._adopted = True
        self._flow.set()

    def wait_adopted(self) -> bool:
        self._flow.wait()
        return self._adopted

    def take(self, key: EarlyKey) -> ItemResult | None:
        """The early result of ``key`` (waiting for it while in flight; raising its call's error, as the
        task's own call would have), or None: not started early, not yet begun (then cancelled, and the
        caller makes it), or already taken."""
        with self._lock:
            future = self._futures.pop(key, None)
        if future is None or future.cancel():
            return None
        return future.result()

    def pending(self) -> int:
        with self._lock:
            return len(self._futures)

    def close(self) -> None:
        """Cancel what has not started; what is in flight finishes in the background (its reply is stored)."""
        self._flow.set()  # a look ahead still waiting for the flow gives up
        with self._lock:
            left, self._futures = self._futures, {}
        for future in left.values():
            future.cancel()
        if left:
            log.debug("early start: %d rollouts were never asked for", len(left))
        self._pool.shutdown(wait=False, cancel_futures=True)


def eligible(config: SkillOptConfig) -> bool:
    """Whether the flow's rollouts run in this process under this process's limits."""
    return config.run.task_runner == "threads" and config.model.rate_limit_mode == "local"


def start_training(loaded: LoadedConfig, *, cli_roles: Mapping[str, Any] | None,
                   run_name: str | None) -> Run | None:
    """Build the run ``skillopt train`` is about to start and begin its first rollouts; the flow adopts the
    run (``take_handed_over``). None where the early start does not apply (see the module's docstring)."""
    if not eligible(loaded.config):
        return None
    spec = RunSpec.create(loaded, cli_roles=cli_roles, run_name=run_name)
    with _held_progress() as held:  # said by the flow when it adopts the run, in its logs and on the console
        run = Run.build(spec, loaded=loaded)
    run.setup_messages = [(record.levelno, record.getMessage()) for record in held]
    if run.clients.target.replies is None:
        # No reply store (the scripted backend): a run stopped after an early call and before its task
        # finished would make that call again. Its calls are instant anyway: the flow adopts the run alone.
        hand_over(run)
        return run
    # Imported here, in the main thread, before any early rollout runs, not while this thread imports
    # Prefect: the backends' SDKs and httpx (Prefect imports it; the openai SDK looks it up in sys.modules
    # on every request and failed on a half-imported one: "partially initialized module 'httpx'").
    import httpx  # noqa: F401

    run.clients.target.backend  # noqa: B018 - built for its imports
    if run.benchmark.needs_judge(run.bench_cfg):
        run.clients.get("judge").backend  # noqa: B018
    run.early = start(run)
    hand_over(run)
    return run


@contextmanager
def _held_progress() -> Iterator[list[logging.LogRecord]]:
    """The progress lines logged inside, kept instead of emitted: before Prefect is loaded they have no
    handler (an INFO line would be lost, a warning printed bare on stderr)."""
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


def start(run: Run) -> EarlyRollouts:
    """Submit, without a budget cap, step 1's first batch (``first_batch``), then the baseline's rollouts,
    then the starting skill's test split (``Run.baseline_test_ids``). The batch goes first: step 1's
    optimizer calls, made ahead of the flow, need only its rows."""
    skill = run.starting_skill()
    judge = direct_judge(run) if run.benchmark.needs_judge(run.bench_cfg) else None
    early = EarlyRollouts(int(getattr(run.bench_cfg, "workers", 4)))
    batch_rows: list[Future[ItemResult] | None] = []
    if (first := first_batch(run)) is not None:
        batch, draws = first
        batch_rows = [early.start(run, item_id, skill, judge, training=True, sample=sample, epoch=draws.epoch,
                                  view_seed=batch.seed)[0]
                      for item_id, sample in zip(batch.item_ids, draws.take(batch.item_ids), strict=True)]
    for item_id in [*run.selection_ids("val"), *run.baseline_test_ids()]:
        early.start(run, item_id, skill, judge, training=False)
    started = [future for future in batch_rows if future is not None]
    if first is not None and len(started) == len(batch_rows) and run.clients.optimizer.replies is not None:
        # Its stage functions import Prefect: wait for the flow to have loaded them, unless they were loaded
        # before this process started its work (the preloaded process of `skillopt server start`).
        loaded = "skillopt.flows.stages" in sys.modules
        threading.Thread(target=_step_one_ahead, args=(run, early, started, first[0].seed, loaded),
                         name="skillopt-step-one-ahead", daemon=True).start()
    return early


def _step_one_ahead(run: Run, early: EarlyRollouts, batch_rows: list[Future[ItemResult]], seed: int,
                    loaded: bool) -> None:
    """Once step 1's first batch is rolled out and the flow's modules are loaded, make step 1's optimizer
    calls and its candidate's rollouts ahead of the flow's tasks (``flows.stages.step_one_ahead``): the flow's
    start (the baseline's tasks, the epoch subflow) no longer delays them. Best effort: on any error the flow
    makes the calls itself, as it would have."""
    try:
        # Found while the batch is in flight, not once it is in: the optimizer's backend (its SDK client, an
        # SSL context) and its context window (a server may be asked for it) took 0.15-0.25 s of this thread
        # before its first call while the flow was starting.
        run.clients.optimizer.context_window()
        rows = [future.result() for future in batch_rows]
        if not loaded and not early.wait_adopted():
            return
        from skillopt.flows.stages import step_one_ahead  # loaded with the flow by now

        token = AHEAD.set(True)
        try:
            step_one_ahead(run, rows, seed)
        finally:
            AHEAD.reset(token)
    except Exception as error:  # noqa: BLE001 - the flow makes these calls itself
        log.debug("step 1 ahead of the flow stopped: %r", error)


def _rollout(run: Run, item_id: str, skill: str, judge: Any, *, training: bool, sample: int = 0,
             epoch: int | None = None, view_seed: int | None = None) -> Callable[[], ItemResult]:
    def rollout() -> ItemResult:
        return roll_out(run, run.items[item_id], skill, training=training, judge=judge, sample=sample,
                        epoch=epoch, view_seed=view_seed)

    return rollout
