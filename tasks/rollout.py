"""Rollout tasks: one item, one judge verdict, one whole evaluation of a skill on a split.

``evaluate_skill`` is the selection cache: its key is the skill's hash plus the split's item ids
and everything that decides a rollout, so an unchanged skill costs one cached task, never one per
item. Inside it, each item is its own cached ``rollout_item`` task, so a crash mid-evaluation
repeats only the items that had not finished. An item whose call failed becomes an error row and
keeps the evaluation from being cached (it raises ``PartialEvaluation`` carrying the rows), so a
re-run retries exactly the failed items.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel

from skillopt import live
from skillopt.assembly import Run
from skillopt.benchmarks.runner import check_infrastructure, error_row, run_item
from skillopt.data import Item
from skillopt.errors import SkillOptError, StorageError
from skillopt.gate import Scores, score_rows
from skillopt.llm.chat import ChatRequest
from skillopt.records import ItemResult
from skillopt.skill import skill_hash
from skillopt.tasks.cache import bound, content_key, keyed, retry_only_retryable


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


class JudgeVerdict(BaseModel):
    verdict: str
    reason: str = ""


def _rollout_key(p: dict[str, Any]) -> str:
    run: Run = p["run"]
    return content_key(
        "rollout", benchmark=run.benchmark.id, benchmark_version=run.benchmark.version, item=p["item"].id,
        data=run.data_hash, skill=skill_hash(p["skill"]), target=run.clients.roles.target.fingerprint(),
        prompts=run.bench_prompt_hash, training=p["training"], probe=p.get("probe_instruction") or "",
        sample=p.get("sample", 0), view=p.get("view_seed"),
        bench_cfg=run.bench_cfg.model_dump(mode="json", exclude={"workers"}),
    )


@task(name="rollout_item", cache_key_fn=keyed(_rollout_key), persist_result=True, result_serializer="json",
      tags=["llm:target"], retry_condition_fn=retry_only_retryable)
def rollout_item(run: Run, item: Item, skill: str, *, training: bool, probe_instruction: str | None = None,
                 sample: int = 0, view_seed: int | None = None) -> ItemResult:
    """The target runs one item with ``skill``; the benchmark scores it. With ``view_seed`` (a training
    batch's seed) the item is shown as the benchmark's view of that batch (e.g. reshuffled choices)."""
    if view_seed is not None:
        item = run.benchmark.batch_view(item, run.bench_cfg, seed=view_seed, training=training)
    judge = _judge_for(run) if run.benchmark.needs_judge(run.bench_cfg) else None
    return run_item(run.benchmark, item, skill, run.bench_cfg, target=run.clients.target, judge=judge,
                    probe_instruction=probe_instruction, sample=sample,
                    tags={"training": training, "skill_sha": skill_hash(skill)[:16]})


def _judge_key(p: dict[str, Any]) -> str:
    run: Run = p["run"]
    judge = run.clients.roles.judge
    return content_key("judge", judge=judge.fingerprint() if judge else None, item=p["item"].id,
                       prediction=p["prediction"], prompts=run.bench_prompt_hash)


@task(name="judge_item", cache_key_fn=keyed(_judge_key), persist_result=True, result_serializer="json",
      tags=["llm:judge"], retry_condition_fn=retry_only_retryable)
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
    run: Run = p["run"]
    judge = run.clients.roles.judge
    return content_key(
        "evaluate", benchmark=run.benchmark.id, benchmark_version=run.benchmark.version, split=p["split"],
        items=list(p["item_ids"]), data=run.data_hash, skill=skill_hash(p["skill"]),
        target=run.clients.roles.target.fingerprint(), judge=judge.fingerprint() if judge else None,
        prompts=run.bench_prompt_hash, training=p.get("training", False), view=p.get("view_seed"),
        bench_cfg=run.bench_cfg.model_dump(mode="json", exclude={"workers"}),
    )


@task(name="evaluate_skill", cache_key_fn=keyed(_evaluation_key), persist_result=True, result_serializer="json")
def evaluate_skill(run: Run, skill: str, split: str, item_ids: list[str], *, training: bool = False,
                   view_seed: int | None = None) -> Evaluation:
    """Roll out every item of ``item_ids`` with ``skill`` (one cached task per item) and score the split."""
    return run_rollouts(run, skill, split, item_ids, training=training, view_seed=view_seed)


def run_rollouts(run: Run, skill: str, split: str, item_ids: list[str], *, training: bool,
                 probe_instruction: str | None = None, view_seed: int | None = None) -> Evaluation:
    """Submit one ``rollout_item`` per id (bounded pool), in id order; raise on outages and failures."""
    workers = max(1, int(getattr(run.bench_cfg, "workers", 4)))
    rollout = bound(run, rollout_item)
    rows: list[ItemResult] = []
    live.emit("stage", name=f"rollout {split}", total=len(item_ids))
    with ThreadPoolTaskRunner(max_workers=workers) as runner:
        futures = [runner.submit(rollout, {"run": run, "item": run.items[i], "skill": skill, "training": training,
                                           "probe_instruction": probe_instruction, "view_seed": view_seed})
                   for i in item_ids]
        errors = []
        for item_id, future in zip(item_ids, futures, strict=True):
            try:
                rows.append(future.result())
            except StorageError:
                raise  # a read-only folder or a full disk stops the run: it is not the item's failure
            except Exception as error:  # noqa: BLE001 - recorded as an error row, never as a score
                errors.append(error)
                rows.append(error_row(run.items[item_id], error))
            live.emit("item")
    evaluation = Evaluation(split=split, skill_sha=skill_hash(skill), rows=rows, scores=score_rows(rows))
    check_infrastructure(rows, role_label=run.clients.roles.target.label())
    if errors:
        limit = run.config.model.max_error_rate
        message = f"{len(errors)} of {len(rows)} {split} items failed; first: {errors[0]}"
        if len(errors) / len(rows) > limit:
            raise SkillOptError(f"{message} (more than model.max_error_rate {limit:.0%}); stopping")
        raise PartialEvaluation(message, evaluation)
    return evaluation


def evaluate(run: Run, skill: str, split: str, item_ids: list[str] | None = None, *,
             training: bool = False, view_seed: int | None = None) -> Evaluation:
    """Scores of ``skill`` on ``item_ids``, by default the whole split (val and test cut to their configured
    sizes). Items that failed are error rows in the result; the evaluation is then not cached."""
    ids = run.selection_ids(split) if item_ids is None else list(item_ids)
    try:
        return bound(run, evaluate_skill)(run, skill, split, ids, training=training, view_seed=view_seed)
    except PartialEvaluation as partial:
        return partial.evaluation


def evaluate_many(run: Run, jobs: list[tuple[str, str, list[str]]], *, training: bool = False) -> list[Evaluation]:
    """Several evaluations at once, in parallel: ``(skill, split, item_ids)`` each, results in order."""
    task = bound(run, evaluate_skill)
    futures = [task.submit(run, skill, split, list(ids), training=training) for skill, split, ids in jobs]
    results = []
    for future in futures:
        try:
            results.append(future.result())
        except PartialEvaluation as partial:
            results.append(partial.evaluation)
    return results
