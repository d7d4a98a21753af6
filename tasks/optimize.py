"""Optimizer tasks of one step: reflect, merge, rank, apply (DESIGN.md §4.3 steps 2–5).

Each task builds its request with a pure stage function, makes one structured call through the
optimizer client (which re-asks once on a bad reply) and turns the reply into a ``Patch`` or a
selection. A reply that still cannot be parsed takes the stage's recorded fallback; an outage
raises. Keys hash the optimizer's fingerprint, the skill, the evidence and the prompt templates.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from pydantic import BaseModel

from skillopt.llm.errors import ParseError
from skillopt.merge import MergeReply, concat_fallback, merge_request, patch_from_merge
from skillopt.prompts import prompt_hash
from skillopt.records import ItemResult, Patch
from skillopt.reflect import AnalystReply, analyst_fallback, analyst_request, patch_from_reply
from skillopt.select import RankingReply, Selection, ranking_request, select_edits
from skillopt.skill import ApplyReport, Edit, apply_edits, skill_hash
from tasks.cache import content_key, digest, keyed, retry_only_retryable
from tasks.context import RunContext

_OPTIONS: dict[str, Any] = {"persist_result": True, "result_serializer": "json", "tags": ["llm:optimizer"],
                            "retry_condition_fn": retry_only_retryable}


def _optimizer(ctx: RunContext) -> str:
    return ctx.clients.roles.optimizer.fingerprint()


def _reflect_key(p: dict[str, Any]) -> str:
    ctx: RunContext = p["ctx"]
    return content_key(
        "reflect", optimizer=_optimizer(ctx), kind=p["kind"], skill=skill_hash(p["skill"]), budget=p["budget"],
        rows=[digest(r) for r in p["rows"]], buffer=p["step_buffer"], meta=p["meta_skill"],
        prompts=prompt_hash("optimizer/analyst_failure", "optimizer/analyst_success", "optimizer/analyst_execution_notes"), guidance=ctx.bench_prompt_hash,
        appendix=ctx.config.optimizer.use_appendix,
    )


@task(name="reflect_minibatch", cache_key_fn=keyed(_reflect_key), **_OPTIONS)
def reflect_minibatch(ctx: RunContext, kind: str, skill: str, rows: list[ItemResult], budget: int,
                      step_buffer: str, meta_skill: str) -> Patch:
    """One analyst call on one minibatch of train trajectories."""
    guidance = ctx.benchmark_guidance["error" if kind == "failure" else "success"]
    request = analyst_request(kind=kind, skill=skill, budget=budget, rows=rows, step_buffer=step_buffer,
                              meta_skill=meta_skill, benchmark_guidance=guidance,
                              use_appendix=ctx.config.optimizer.use_appendix)
    try:
        reply, _ = ctx.clients.optimizer.structured(request, AnalystReply)
    except ParseError as error:
        return analyst_fallback(kind=kind, rows=rows, reason=f"analyst reply unusable: {error.reason}")
    return patch_from_reply(reply, kind=kind, rows=rows, budget=budget)


def _merge_key(p: dict[str, Any]) -> str:
    return content_key("merge", optimizer=_optimizer(p["ctx"]), kind=p["kind"], skill=skill_hash(p["skill"]),
                       patches=[digest(x) for x in p["patches"]], level=p["level"], meta=p["meta_skill"],
                       prompts=prompt_hash("optimizer/merge", "optimizer/merge_final"))


@task(name="merge_patches", cache_key_fn=keyed(_merge_key), **_OPTIONS)
def merge_patches(ctx: RunContext, kind: str, skill: str, patches: list[Patch], level: int, meta_skill: str) -> Patch:
    """Merge one group of patches into one; a reply that cannot be used falls back to concatenation."""
    request = merge_request(kind=kind, skill=skill, patches=patches, level=level, meta_skill=meta_skill)
    try:
        reply, _ = ctx.clients.optimizer.structured(request, MergeReply)
    except ParseError as error:
        return concat_fallback(patches, reason=f"merge reply unusable: {error.reason}")
    return patch_from_merge(reply, kind=kind, level=level, patches=patches)


def _rank_key(p: dict[str, Any]) -> str:
    return content_key("rank", optimizer=_optimizer(p["ctx"]), skill=skill_hash(p["skill"]),
                       pool=[digest(e) for e in p["pool"]], budget=p["budget"], meta=p["meta_skill"],
                       prompts=prompt_hash("optimizer/ranking"))


@task(name="rank_edits", cache_key_fn=keyed(_rank_key), **_OPTIONS)
def rank_edits(ctx: RunContext, skill: str, pool: list[Edit], budget: int, meta_skill: str) -> Selection:
    """Gradient clipping: keep the ``budget`` most important edits (one ranking call)."""
    request = ranking_request(skill=skill, pool=pool, budget=budget, meta_skill=meta_skill)
    try:
        reply, _ = ctx.clients.optimizer.structured(request, RankingReply)
    except ParseError:
        reply = None
    return select_edits(pool, budget, reply)


class Update(BaseModel):
    candidate: str
    report: ApplyReport


def _apply_key(p: dict[str, Any]) -> str:
    return content_key("apply", skill=skill_hash(p["skill"]), skill_text=digest(p["skill"]),
                       edits=[digest(e) for e in p["edits"]])


@task(name="apply_update", cache_key_fn=keyed(_apply_key), persist_result=True, result_serializer="json")
def apply_update(skill: str, edits: list[Edit]) -> Update:
    """Apply the selected edits in order to the current skill (pure, cheap)."""
    candidate, report = apply_edits(skill, edits)
    return Update(candidate=candidate, report=report)
