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

from skillopt.benchmarks.runner import check_infrastructure, error_row, run_item
from skillopt.data import Item
from skillopt.errors import SkillOptError, StorageError
from skillopt.gate import Scores, score_rows
from skillopt.llm.chat import ChatRequest
from skillopt.records import ItemResult
from skillopt.skill import skill_hash
from tasks.cache import content_key, keyed, retry_only_retryable
from tasks.context import RunContext


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
    ctx: RunContext = p["ctx"]
    return content_key(
        "rollout", benchmark=ctx.benchmark.id, benchmark_version=ctx.benchmark.version, item=p["item"].id,
        data=ctx.data_hash, skill=skill_hash(p["skill"]), target=ctx.clients.roles.target.fingerprint(),
        prompts=ctx.bench_prompt_hash, training=p["training"], probe=p.get("probe_instruction") or "",
        sample=p.get("sample", 0), bench_cfg=ctx.bench_cfg.model_dump(mode="json", exclude={"workers"}),
    )


@task(name="rollout_item", cache_key_fn=keyed(_rollout_key), persist_result=True, result_serializer="json",
      tags=["llm:target"], retry_condition_fn=retry_only_retryable)
def rollout_item(ctx: RunContext, item: Item, skill: str, *, training: bool, probe_instruction: str | None = None,
                 sample: int = 0) -> ItemResult:
    """The target runs one item with ``skill``; the benchmark scores it."""
    judge = _judge_for(ctx) if ctx.benchmark.needs_judge(ctx.bench_cfg) else None
    return run_item(ctx.benchmark, item, skill, ctx.bench_cfg, target=ctx.clients.target, judge=judge,
                    probe_instruction=probe_instruction, sample=sample,
                    tags={"training": training, "skill_sha": skill_hash(skill)[:16]})


def _judge_key(p: dict[str, Any]) -> str:
    ctx: RunContext = p["ctx"]
    judge = ctx.clients.roles.judge
    return content_key("judge", judge=judge.fingerprint() if judge else None, item=p["item"].id,
                       prediction=p["prediction"], prompts=ctx.bench_prompt_hash)


@task(name="judge_item", cache_key_fn=keyed(_judge_key), persist_result=True, result_serializer="json",
      tags=["llm:judge"], retry_condition_fn=retry_only_retryable)
def judge_item(ctx: RunContext, item: Item, prediction: str, request: ChatRequest) -> JudgeVerdict:
    """One structured verdict from the judge role (temperature 0, recorded seed)."""
    verdict, _ = ctx.clients.get("judge").structured(request, JudgeVerdict)
    return verdict


def _judge_for(ctx: RunContext) -> Any:
    """The ``Judge`` callable a benchmark's ``score`` receives, backed by the cached ``judge_item`` task."""
    def judge(item: Item, prediction: str) -> tuple[bool, str]:
        request = ctx.benchmark.judge_request(item, prediction)
        verdict = ctx.bind(judge_item)(ctx, item, prediction, request)
        return verdict.verdict == "correct", verdict.reason

    return judge


def _evaluation_key(p: dict[str, Any]) -> str:
    ctx: RunContext = p["ctx"]
    judge = ctx.clients.roles.judge
    return content_key(
        "evaluate", benchmark=ctx.benchmark.id, benchmark_version=ctx.benchmark.version, split=p["split"],
        items=list(p["item_ids"]), data=ctx.data_hash, skill=skill_hash(p["skill"]),
        target=ctx.clients.roles.target.fingerprint(), judge=judge.fingerprint() if judge else None,
        prompts=ctx.bench_prompt_hash, training=p.get("training", False),
        bench_cfg=ctx.bench_cfg.model_dump(mode="json", exclude={"workers"}),
    )


@task(name="evaluate_skill", cache_key_fn=keyed(_evaluation_key), persist_result=True, result_serializer="json")
def evaluate_skill(ctx: RunContext, skill: str, split: str, item_ids: list[str], *, training: bool = False
                   ) -> Evaluation:
    """Roll out every item of ``item_ids`` with ``skill`` (one cached task per item) and score the split."""
    return run_rollouts(ctx, skill, split, item_ids, training=training)


def run_rollouts(ctx: RunContext, skill: str, split: str, item_ids: list[str], *, training: bool,
                 probe_instruction: str | None = None) -> Evaluation:
    """Submit one ``rollout_item`` per id (bounded pool), in id order; raise on outages and failures."""
    workers = max(1, int(getattr(ctx.bench_cfg, "workers", 4)))
    rollout = ctx.bind(rollout_item)
    rows: list[ItemResult] = []
    with ThreadPoolTaskRunner(max_workers=workers) as runner:
        futures = [runner.submit(rollout, {"ctx": ctx, "item": ctx.items[i], "skill": skill, "training": training,
                                           "probe_instruction": probe_instruction}) for i in item_ids]
        errors = []
        for item_id, future in zip(item_ids, futures, strict=True):
            try:
                rows.append(future.result())
            except StorageError:
                raise  # a read-only folder or a full disk stops the run: it is not the item's failure
            except Exception as error:  # noqa: BLE001 - recorded as an error row, never as a score
                errors.append(error)
                rows.append(error_row(ctx.items[item_id], error))
    evaluation = Evaluation(split=split, skill_sha=skill_hash(skill), rows=rows, scores=score_rows(rows))
    check_infrastructure(rows, role_label=ctx.clients.roles.target.label())
    if errors:
        limit = ctx.config.model.max_error_rate
        message = f"{len(errors)} of {len(rows)} {split} items failed; first: {errors[0]}"
        if len(errors) / len(rows) > limit:
            raise SkillOptError(f"{message} (more than model.max_error_rate {limit:.0%}); stopping")
        raise PartialEvaluation(message, evaluation)
    return evaluation
