"""Rollout tasks: one item, one judge verdict, one whole evaluation of a skill on a split.

A rollout's body and key are in the library (``skillopt.rollouts``: ``roll_out``, ``rollout_key``); each
``rollout_item`` task is keyed by the rollout it makes, so a re-run finds every finished item.

``evaluate_skill`` is the selection cache: its key is the list of its items' rollout keys, so an unchanged
skill costs one cached task, never one per item. Inside it, each item is its own cached ``rollout_item``
task, so a crash mid-evaluation repeats only the items that had not finished. An item whose call failed
becomes an error row and keeps the evaluation from being cached (it raises ``PartialEvaluation`` carrying
the rows), so a re-run retries exactly the failed items.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any

from prefect import task
from pydantic import BaseModel

from skillopt import live
from skillopt.assembly import Run
from skillopt.benchmarks.runner import check_infrastructure, error_row
from skillopt.cache_keys import digest
from skillopt.data import Item
from skillopt.early_start import early_key
from skillopt.error_rows import answered_rows
from skillopt.errors import SkillOptError, StorageError
from skillopt.gate import Scores, score_rows
from skillopt.llm.chat import ChatRequest
from skillopt.records import ItemResult
from skillopt.rollouts import JudgeVerdict, judge_call_key, roll_out, rollout_key
from skillopt.skill import skill_hash
from skillopt.tasks.ahead import ahead
from skillopt.tasks.cache import bound, keyed, retry_only_retryable
from skillopt.tasks.cache_hits import record_hits
from skillopt.tasks.runners import pool_for


class Evaluation(BaseModel):
    split: str
    skill_sha: str
    rows: list[ItemResult]
    scores: Scores


class PartialEvaluation(SkillOptError):
    """Some items of an evaluation failed; the rows (error rows included) travel with the error."""

    def __init__(self, message: str, evaluation: Evaluation) -> None:
        super().__init__(message)
        self.evaluation = evaluation


def _rollout_item_key(p: dict[str, Any]) -> str:
    return rollout_key(p["run"], p["item"], p["skill"], training=p["training"],
                       probe_instruction=p.get("probe_instruction"), sample=p.get("sample", 0),
                       epoch=p.get("epoch"), view_seed=p.get("view_seed"))


@task(name="rollout_item", cache_key_fn=keyed(_rollout_item_key), persist_result=True,
      result_serializer="json", tags=["llm:target"], retry_condition_fn=retry_only_retryable)
def rollout_item(run: Run, item: Item, skill: str, *, training: bool, probe_instruction: str | None = None,
                 sample: int = 0, epoch: int | None = None, view_seed: int | None = None) -> ItemResult:
    """The target runs one item with ``skill``; the benchmark scores it (``skillopt.rollouts.roll_out``), or
    the result of the same rollout started before the flow (``skillopt.early_start``)."""
    if run.early is not None and probe_instruction is None and not ahead():  # the flow's task takes it
        early = run.early.take(early_key(skill, item.id, training=training, sample=sample, epoch=epoch,
                                         view_seed=view_seed))
        if early is not None:
            return early
    judge = _judge_for(run) if run.benchmark.needs_judge(run.bench_cfg) else None
    return roll_out(run, item, skill, training=training, judge=judge, probe_instruction=probe_instruction,
                    sample=sample, epoch=epoch, view_seed=view_seed)


@task(name="judge_item", cache_key_fn=lambda _context, p: judge_call_key(p["run"], p["request"]),
      persist_result=True, result_serializer="json", tags=["llm:judge"],
      retry_condition_fn=retry_only_retryable)
def judge_item(run: Run, item: Item, prediction: str, request: ChatRequest) -> JudgeVerdict:
    """One structured verdict from the judge role (temperature 0, recorded seed)."""
    verdict, _ = run.clients.get("judge").structured(request, JudgeVerdict)
    return verdict


def _judge_for(run: Run) -> Any:
    """The ``Judge`` callable a benchmark's ``score`` receives, backed by the cached ``judge_item`` task."""

    def judge(item: Item, prediction: str) -> tuple[bool, str]:
        request = run.benchmark.judge_request(item, prediction)
        verdict = bound(run, judge_item)(run, item, prediction, request)
        return verdict.verdict == "correct", verdict.reason

    return judge


def _evaluation_key(p: dict[str, Any]) -> str:
    """The rollout keys of every item in order: an evaluation is cached exactly as long as all its rollouts
    are."""
    run: Run = p["run"]
    samples = p.get("samples") or [0] * len(p["item_ids"])
    keys = [rollout_key(run, run.items[i], p["skill"], training=p.get("training", False), sample=sample,
                        epoch=p.get("epoch"), view_seed=p.get("view_seed"))
            for i, sample in zip(p["item_ids"], samples, strict=True)]
    return f"skillopt-evaluate-{digest({'split': p['split'], 'rollouts': keys})}"


@task(name="evaluate_skill", cache_key_fn=keyed(_evaluation_key), persist_result=True,
      result_serializer="json")
def evaluate_skill(run: Run, skill: str, split: str, item_ids: list[str], *, training: bool = False,
                   epoch: int | None = None, samples: list[int] | None = None,
                   view_seed: int | None = None) -> Evaluation:
    """Roll out every item of ``item_ids`` with ``skill`` (one cached task per item) and score the split.
    ``epoch`` and ``samples`` (one per id) make training rollouts new draws; evaluations leave them out."""
    shown_by_flow = _shown_by_flow(run, _flow_key({"skill": skill, "split": split, "item_ids": item_ids,
                                                   "training": training, "epoch": epoch, "samples": samples,
                                                   "view_seed": view_seed}))
    return run_rollouts(run, skill, split, item_ids, training=training, epoch=epoch, samples=samples,
                        view_seed=view_seed, shown=not shown_by_flow)


def run_rollouts(run: Run, skill: str, split: str, item_ids: list[str], *, training: bool,
                 probe_instruction: str | None = None, epoch: int | None = None,
                 samples: list[int] | None = None, view_seed: int | None = None,
                 shown: bool = True) -> Evaluation:
    """Submit one ``rollout_item`` per id (bounded pool), in id order; raise on outages and failures.
    ``shown``: report the progress and count error streaks (False where the flow does it itself)."""
    workers = max(1, int(getattr(run.bench_cfg, "workers", 4)))
    rollout = bound(run, rollout_item)
    rows: list[ItemResult] = []
    # Work ahead of the flow (skillopt.early_start) is the flow's to show and count.
    shown = shown and not ahead()
    if shown:
        live.emit("stage", name=f"rollout {split}", total=len(item_ids))
    with pool_for(run, "rollouts", workers) as runner:
        jobs = _rollout_jobs(run, skill, item_ids, training=training, probe_instruction=probe_instruction,
                             epoch=epoch, samples=samples, view_seed=view_seed)
        if not ahead():
            _start_calls(run, jobs)
        futures = [runner.submit(rollout, job) for job in jobs]
        errors = []
        for item_id, future in zip(item_ids, futures, strict=True):
            try:
                rows.append(future.result())
            except StorageError:
                raise  # a read-only folder or a full disk stops the run: it is not the item's failure
            except Exception as error:  # noqa: BLE001 - recorded as an error row, never as a score
                errors.append(error)
                rows.append(error_row(run.items[item_id], error))
            if shown:
                live.emit("item")
    check_infrastructure(rows, role_label=run.clients.roles.target.label())
    if shown:
        run.error_streak.observe(rows)
    evaluation = _scored(skill, split, rows)
    if errors:
        raise PartialEvaluation(f"{len(errors)} of {len(rows)} {split} items failed; first: {errors[0]}",
                                evaluation)
    return evaluation


def _rollout_jobs(run: Run, skill: str, item_ids: list[str], *, training: bool,
                  probe_instruction: str | None, epoch: int | None, samples: list[int] | None,
                  view_seed: int | None) -> list[dict[str, Any]]:
    """The parameters of the ``rollout_item`` task of each of ``item_ids``, in order."""
    common = {"run": run, "skill": skill, "training": training, "probe_instruction": probe_instruction,
              "epoch": epoch, "view_seed": view_seed}
    return [{**common, "item": run.items[i], "sample": sample}
            for i, sample in zip(item_ids, samples or [0] * len(item_ids), strict=True)]


def _scored(skill: str, split: str, rows: list[ItemResult]) -> Evaluation:
    # Error rows say nothing about the skill: the scores are those of the items that answered.
    return Evaluation(split=split, skill_sha=skill_hash(skill), rows=rows,
                      scores=score_rows(answered_rows(rows)))


#: How long a wave's tasks wait at most for the wave's early calls to leave (``_start_calls``).
WAVE_SEND_WAIT_S = 0.05


def _start_calls(run: Run, jobs: list[dict[str, Any]]) -> list[Future[ItemResult]] | None:
    """Begin the model calls of a wave's rollouts at once, each taken by its ``rollout_item`` task when
    it runs (``skillopt.early_start.EarlyRollouts``). A task's start (its run, its states, its cache key)
    takes 5-10 ms of the interpreter, so the tenth call of a wave of ten left 0.05-0.1 s after the first;
    the calls now leave together and the tasks start while they are in flight.

    Only where the run has early rollouts (its rollouts run in this process under its limits, with the
    target's replies stored), for rollouts without a probe or a judge (a judged rollout's verdict is its own
    cached task), and never for a rollout whose task would be served from the cache (it would never take
    the call).

    Returns each job's call, or None unless every job's call is started early and not yet taken."""
    early = run.early
    if early is None or run.benchmark.needs_judge(run.bench_cfg):
        return None
    target = run.clients.target
    sent, started, calls = target.requests_sent(), 0, []
    for job in jobs:
        if job["probe_instruction"] is None:
            call, new = early.start(run, job["item"].id, job["skill"], None, training=job["training"],
                                    sample=job["sample"], epoch=job["epoch"], view_seed=job["view_seed"])
            started += new
            calls.append(call)
    if started:
        # Let the first of them leave before the tasks start: ten task starts took the interpreter from the
        # threads building the requests, and the wave's calls left over 0.06-0.1 s instead of 0.02-0.04 s.
        target.wait_requests_sent(sent + min(started, early.workers), timeout_s=WAVE_SEND_WAIT_S)
    if len(calls) < len(jobs) or any(call is None for call in calls):
        return None
    return calls  # type: ignore[return-value]  # no None left


def evaluate(run: Run, skill: str, split: str, item_ids: list[str] | None = None, *, training: bool = False,
             epoch: int | None = None, samples: list[int] | None = None,
             view_seed: int | None = None) -> Evaluation:
    """Scores of ``skill`` on ``item_ids``, by default the whole split (val and test cut to their configured
    sizes). Items that failed are error rows in the result; the evaluation is then not cached. ``epoch`` and
    ``samples`` (training rollouts) say which draw each rollout is; ``view_seed`` is the training batch's
    seed the benchmark may show its items by."""
    ids = run.selection_ids(split) if item_ids is None else list(item_ids)
    job = {"run": run, "skill": skill, "split": split, "item_ids": ids, "training": training, "epoch": epoch,
           "samples": samples, "view_seed": view_seed}
    key = _evaluation_key(job)
    finished = _finished_evaluation(run, key)
    if finished is not None:
        return finished
    if not ahead():
        calls = _start_calls(run, _rollout_jobs(run, skill, ids, training=training, probe_instruction=None,
                                                epoch=epoch, samples=samples, view_seed=view_seed))
        if calls is not None:
            return _ahead_of_its_task(run, key, job, calls)
    return _settled(run, key, lambda: bound(run, evaluate_skill)(**job))


def _ahead_of_its_task(run: Run, key: str, job: dict[str, Any],
                       calls: list[Future[ItemResult]]) -> Evaluation:
    """The evaluation ``job`` from its calls, all started early (``_start_calls``), as soon as they are in.

    Its ``evaluate_skill`` task still runs (one task per item in the UI, each result cached) and finishes in
    the background: ten task runs ending (their results written, their states reported) held every stage
    0.03-0.05 s after its last reply on a two-core machine. The flow shows this evaluation's progress and
    counts its error streak; the run waits for the task before it ends (``settle_evaluations``). If a call
    failed, or an item's task made its call itself, the evaluation is its task's, as without this path."""
    split, shown = job["split"], _flow_key(job)
    _flow_shows(run, shown, True)
    live.emit("stage", name=f"rollout {split}", total=len(calls))
    submitted = bound(run, evaluate_skill).submit(**job)
    rows: list[ItemResult] = []
    for call in calls:
        try:
            rows.append(call.result())
        except (Exception, CancelledError):  # noqa: BLE001 - the task's own row for it decides
            break
        live.emit("item")
    if len(rows) == len(calls) and not any(row.is_error for row in rows):
        check_infrastructure(rows, role_label=run.clients.roles.target.label())
        run.error_streak.observe(rows)
        evaluation = _scored(job["skill"], split, rows)
        _keep_evaluation(run, key, evaluation)
        with _flow_lock:
            _in_background.setdefault(run, []).append(submitted)
        return evaluation
    try:
        evaluation = _settled(run, key, submitted.result)
    finally:
        _flow_shows(run, shown, False)
    for _ in range(len(calls) - len(rows)):
        live.emit("item")
    run.error_streak.observe(evaluation.rows)
    return evaluation


# Evaluations whose progress the flow shows itself (``_ahead_of_its_task``), and their tasks left finishing in
# the background, by run.
_flow_shown: weakref.WeakKeyDictionary[Run, set[tuple[Any, ...]]] = weakref.WeakKeyDictionary()
_in_background: weakref.WeakKeyDictionary[Run, list[Any]] = weakref.WeakKeyDictionary()
_flow_lock = threading.Lock()


def _flow_key(parameters: dict[str, Any]) -> tuple[Any, ...]:
    """An evaluation's ``evaluate_skill`` parameters, as the task finds itself by: its arguments as they are,
    not its cache key (rendering each item's request again in the task)."""
    return (parameters["skill"], parameters["split"], tuple(parameters["item_ids"]),
            parameters.get("training", False), parameters.get("epoch"),
            tuple(parameters["samples"]) if parameters.get("samples") else None, parameters.get("view_seed"))


def _flow_shows(run: Run, key: tuple[Any, ...], shows: bool) -> None:
    with _flow_lock:
        shown = _flow_shown.setdefault(run, set())
        if shows:
            shown.add(key)
        else:
            shown.discard(key)


def _shown_by_flow(run: Run, key: tuple[Any, ...]) -> bool:
    with _flow_lock:
        return key in _flow_shown.get(run, ())


def settle_evaluations(run: Run, *, wait_s: float | None = None) -> None:
    """Wait for the ``evaluate_skill`` tasks left finishing in the background (``_ahead_of_its_task``) and
    raise the first one's error (their rows were whole: none is expected). With ``wait_s`` (a run ending on
    an error or Ctrl-C): wait that long at most and raise nothing, so the run's own error is the one told."""
    with _flow_lock:
        left = _in_background.pop(run, [])
    deadline = None if wait_s is None else time.monotonic() + wait_s
    for submitted in left:
        submitted.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    with _flow_lock:
        _flow_shown.pop(run, None)
    if deadline is None:
        for submitted in left:
            submitted.result()


def start_rollouts(run: Run, skill: str, item_ids: list[str], *, training: bool, epoch: int | None = None,
                   samples: list[int] | None = None, view_seed: int | None = None) -> bool:
    """Begin the calls of the evaluation the flow will ask for next (``evaluate`` with the same arguments),
    while it finishes its current work; ``evaluate`` then takes them (see ``_start_calls``). Whether every
    one of them is in flight that way."""
    if ahead():
        return False
    return _start_calls(run, _rollout_jobs(run, skill, item_ids, training=training, probe_instruction=None,
                                           epoch=epoch, samples=samples, view_seed=view_seed)) is not None


def evaluate_many(run: Run, jobs: list[tuple[str, str, list[str]]], *, training: bool = False,
                  epoch: int | None = None) -> list[Evaluation]:
    """Several evaluations at once, in parallel: ``(skill, split, item_ids)`` each, results in order."""
    task = bound(run, evaluate_skill)
    keys = [_evaluation_key({"run": run, "skill": skill, "split": split, "item_ids": list(ids),
                             "training": training, "epoch": epoch}) for skill, split, ids in jobs]
    finished = {key: _finished_evaluation(run, key) for key in keys}
    futures = {key: task.submit(run, skill, split, list(ids), training=training, epoch=epoch)
               for key, (skill, split, ids) in zip(keys, jobs, strict=True) if finished[key] is None}
    return [known if (known := finished[key]) is not None else _settled(run, key, futures[key].result)
            for key in keys]


def _settled(run: Run, key: str, result: Callable[[], Evaluation]) -> Evaluation:
    """The evaluation ``result`` gives, kept for the run if it is whole; with failed items, its rows."""
    try:
        evaluation = result()
    except PartialEvaluation as partial:
        return partial.evaluation
    _keep_evaluation(run, key, evaluation)
    return evaluation


# Whole evaluations this process finished, by run and evaluation key. Asked for again (the current skill at
# every gate, the final stage's selection checks), one is answered here as a cache hit without a task run:
# each such task run, served from Prefect's cache, cost 0.02-0.06 s of the step's or the run's end on a busy
# two-core machine. Work ahead of the flow (``skillopt.early_start``) neither reads nor fills it: the flow's
# own tasks take what was made ahead.
_finished: weakref.WeakKeyDictionary[Run, dict[str, Evaluation]] = weakref.WeakKeyDictionary()
_finished_lock = threading.Lock()


def _finished_evaluation(run: Run, key: str) -> Evaluation | None:
    if ahead():
        return None
    with _finished_lock:
        evaluation = _finished.get(run, {}).get(key)
    if evaluation is not None:
        record_hits(run, "rollout", len(evaluation.rows))  # as a cached evaluate_skill records them
    return evaluation


def _keep_evaluation(run: Run, key: str, evaluation: Evaluation) -> None:
    if ahead():
        return
    with _finished_lock:
        _finished.setdefault(run, {})[key] = evaluation
