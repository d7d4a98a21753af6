"""Rollout tasks: one item, one judge verdict, one whole evaluation of a skill on a split.

A rollout's body and key are in the library (``skillopt.run.rollouts``: ``roll_out``, ``rollout_key``); each
``rollout_item`` task is keyed by the rollout it makes, so a re-run finds every finished item.

``evaluate_skill`` is the selection cache: its key is the list of its items' rollout keys, so an unchanged
skill costs one cached task, never one per item. Inside it, each item is its own cached ``rollout_item``
task, so a crash mid-evaluation repeats only the items that had not finished. An item whose call failed
becomes an error row and keeps the evaluation from being cached (it raises ``PartialEvaluation`` carrying
the rows), so a re-run retries exactly the failed items. A failure of the benchmark plug-in's own code
(``BenchmarkPluginError``) is no error row: it stops the run once the items in flight have finished.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from prefect import task
from pydantic import BaseModel

from skillopt.benchmarks.runner import check_infrastructure, error_row
from skillopt.core import live
from skillopt.core.data import Item
from skillopt.core.error_rows import answered_rows
from skillopt.core.errors import BenchmarkPluginError, SkillOptError, StorageError
from skillopt.core.gate import Scores, score_rows
from skillopt.core.records import ItemResult
from skillopt.llm.chat import ChatRequest
from skillopt.llm.errors import BudgetExceeded
from skillopt.run.assembly import Run
from skillopt.run.cache_keys import digest
from skillopt.run.rollouts import JudgeVerdict, judge_call_key, roll_out, rollout_key
from skillopt.skill.document import skill_hash
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
    """The target runs one item with ``skill``; the benchmark scores it
    (``skillopt.run.rollouts.roll_out``)."""
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
    return run_rollouts(run, skill, split, item_ids, training=training, epoch=epoch, samples=samples,
                        view_seed=view_seed)


def run_rollouts(run: Run, skill: str, split: str, item_ids: list[str], *, training: bool,
                 probe_instruction: str | None = None, epoch: int | None = None,
                 samples: list[int] | None = None, view_seed: int | None = None) -> Evaluation:
    """Submit one ``rollout_item`` per id (bounded pool), in id order; report the progress, count error
    streaks, and raise on outages and failures."""
    workers = max(1, int(getattr(run.bench_cfg, "workers", 4)))
    rollout = bound(run, rollout_item)
    rows: list[ItemResult] = []
    stage = object()  # this evaluation's own key: others may run beside it
    live.emit("stage", name=f"rollout {split}", total=len(item_ids), key=stage)
    with pool_for(run, "rollouts", workers) as runner:
        jobs = _rollout_jobs(run, skill, item_ids, training=training, probe_instruction=probe_instruction,
                             epoch=epoch, samples=samples, view_seed=view_seed)
        if probe_instruction is None:
            # The wave's calls leave while its tasks are being created, not each after its task starts.
            run.prefetch.rollouts(skill, item_ids, training=training, epoch=epoch, samples=samples,
                                  view_seed=view_seed)
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
            live.emit("item", key=stage)
    if over_budget := next((error for error in errors if isinstance(error, BudgetExceeded)), None):
        # Every later call would be refused too: the run stops here (flows/train.py), not item by item.
        raise over_budget
    if plugin_bug := next((error for error in errors if isinstance(error, BenchmarkPluginError)), None):
        # The benchmark's own code failed: an error row would leave the item out of the scores and blame the
        # model. The run stops once the items in flight have finished (their calls are kept for the re-run).
        raise plugin_bug
    check_infrastructure(rows, role_label=run.clients.roles.target.label())
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
    return _settled(run, key, lambda: bound(run, evaluate_skill)(**job))


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
# every gate, the final stage's selection checks), one is answered here as a cache hit without a task run
# (a task run served from Prefect's cache still reports its states to the API).
_finished: weakref.WeakKeyDictionary[Run, dict[str, Evaluation]] = weakref.WeakKeyDictionary()
_finished_lock = threading.Lock()


def _finished_evaluation(run: Run, key: str) -> Evaluation | None:
    with _finished_lock:
        evaluation = _finished.get(run, {}).get(key)
    if evaluation is not None:
        record_hits(run, "rollout", len(evaluation.rows))  # as a cached evaluate_skill records them
    return evaluation


def _keep_evaluation(run: Run, key: str, evaluation: Evaluation) -> None:
    with _finished_lock:
        _finished.setdefault(run, {})[key] = evaluation
