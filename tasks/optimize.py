"""Optimizer tasks of one step: reflect, merge, rank, apply (DESIGN.md §4.3 steps 2–5).

Each task builds its request with a pure stage function, makes one structured call through the
optimizer client (which re-asks once on a bad reply) and turns the reply into a ``Patch`` or a
selection. A reply that still cannot be parsed takes the stage's recorded fallback; an outage
raises. Keys hash the optimizer's fingerprint, the skill, the evidence and the prompt templates.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from pydantic import BaseModel, Field

from skillopt.autonomous import BudgetReply, budget_request, decide_budget
from skillopt.benchmarks.images import item_image_paths
from skillopt.llm.errors import ParseError
from skillopt.merge import MergeReply, concat_fallback, merge_request, patch_from_merge
from skillopt.probe import ProbeReply, pick_probe_items, probe_request
from skillopt.prompts import prompt_hash
from skillopt.records import ItemResult, Patch, Suggestion
from skillopt.reflect import (
    AnalystReply,
    analyst_fallback,
    analyst_request,
    patch_from_reply,
    with_item_images,
)
from skillopt.rewrite import (
    FullRewriteAnalystReply,
    RewriteReply,
    SkillMergeReply,
    SuggestionAnalystReply,
    SuggestionMergeReply,
    concat_suggestions,
    finish_rewrite,
    keep_first_skill,
    merge_skills_request,
    merge_suggestions_request,
    patch_from_full_rewrite_reply,
    patch_from_skill_merge,
    patch_from_suggestion_merge,
    patch_from_suggestion_reply,
    rewrite_analyst_request,
    rewrite_request,
    suggestion_ranking_request,
)
from skillopt.select import RankingReply, ranking_request, select_edits, select_items
from skillopt.skill import ApplyReport, Edit, apply_edits, skill_hash
from tasks.cache import content_key, digest, keyed, retry_only_retryable
from tasks.context import RunContext
from tasks.rollout import PartialEvaluation, run_rollouts

_OPTIONS: dict[str, Any] = {"persist_result": True, "result_serializer": "json", "tags": ["llm:optimizer"],
                            "retry_condition_fn": retry_only_retryable}


def _optimizer(ctx: RunContext) -> str:
    return ctx.clients.roles.optimizer.fingerprint()


def _reflect_key(p: dict[str, Any]) -> str:
    ctx: RunContext = p["ctx"]
    return content_key(
        "reflect", optimizer=_optimizer(ctx), mode=ctx.config.optimizer.skill_update_mode, kind=p["kind"], skill=skill_hash(p["skill"]), budget=p["budget"],
        rows=[digest(r) for r in p["rows"]], buffer=p["step_buffer"], meta=p["meta_skill"],
        prompts=prompt_hash("optimizer/analyst_failure", "optimizer/analyst_success", "optimizer/analyst_execution_notes",
                            "optimizer/analyst_suggestions", "optimizer/analyst_full_rewrite"), guidance=ctx.bench_prompt_hash,
        appendix=ctx.config.optimizer.use_appendix,
        # With analyst_images the pictures are part of the prompt: their content hashes are in data_hash.
        images=ctx.data_hash if ctx.config.optimizer.analyst_images else None,
    )


@task(name="reflect_minibatch", cache_key_fn=keyed(_reflect_key), **_OPTIONS)
def reflect_minibatch(ctx: RunContext, kind: str, skill: str, rows: list[ItemResult], budget: int,
                      step_buffer: str, meta_skill: str) -> Patch:
    """One analyst call on one minibatch of train trajectories (edits, suggestions or a whole skill)."""
    mode = ctx.config.optimizer.skill_update_mode
    common = {"kind": kind, "skill": skill, "budget": budget, "rows": rows, "step_buffer": step_buffer,
              "meta_skill": meta_skill, "use_appendix": ctx.config.optimizer.use_appendix,
              "benchmark_guidance": ctx.benchmark_guidance["error" if kind == "failure" else "success"]}
    if mode == "patch":
        request, schema = analyst_request(**common), AnalystReply
    else:
        request = rewrite_analyst_request(mode=mode, **common)
        schema = SuggestionAnalystReply if mode == "rewrite_from_suggestions" else FullRewriteAnalystReply
    if ctx.config.optimizer.analyst_images:
        request = with_item_images(request, rows, {row.id: item_image_paths(ctx.items.get(row.id, {})) for row in rows},
                                   detail=getattr(ctx.bench_cfg, "image_detail", None))
    try:
        reply, _ = ctx.clients.optimizer.structured(request, schema)
    except ParseError as error:
        return analyst_fallback(kind=kind, rows=rows, reason=f"analyst reply unusable: {error.reason}")
    if mode == "patch":
        return patch_from_reply(reply, kind=kind, rows=rows, budget=budget)
    if mode == "rewrite_from_suggestions":
        return patch_from_suggestion_reply(reply, kind=kind, rows=rows, budget=budget)
    return patch_from_full_rewrite_reply(reply, kind=kind, rows=rows)


def _merge_key(p: dict[str, Any]) -> str:
    return content_key("merge", optimizer=_optimizer(p["ctx"]), mode=p["ctx"].config.optimizer.skill_update_mode,
                       kind=p["kind"], skill=skill_hash(p["skill"]),
                       patches=[digest(x) for x in p["patches"]], level=p["level"], meta=p["meta_skill"],
                       prompts=prompt_hash("optimizer/merge", "optimizer/merge_final", "optimizer/merge_suggestions",
                                           "optimizer/merge_skills"))


@task(name="merge_patches", cache_key_fn=keyed(_merge_key), **_OPTIONS)
def merge_patches(ctx: RunContext, kind: str, skill: str, patches: list[Patch], level: int, meta_skill: str) -> Patch:
    """Merge one group of patches into one; a reply that cannot be used takes the mode's fallback."""
    mode = ctx.config.optimizer.skill_update_mode
    args = {"kind": kind, "skill": skill, "patches": patches, "level": level, "meta_skill": meta_skill}
    build, schema, convert, fallback = {
        "patch": (merge_request, MergeReply, patch_from_merge, concat_fallback),
        "rewrite_from_suggestions": (merge_suggestions_request, SuggestionMergeReply, patch_from_suggestion_merge,
                                     concat_suggestions),
        "full_rewrite_minibatch": (merge_skills_request, SkillMergeReply, patch_from_skill_merge, keep_first_skill),
    }[mode]
    try:
        reply, _ = ctx.clients.optimizer.structured(build(**args), schema)
    except ParseError as error:
        return fallback(patches, reason=f"merge reply unusable: {error.reason}")
    return convert(reply, kind=kind, level=level, patches=patches)


def _rank_key(p: dict[str, Any]) -> str:
    return content_key("rank", optimizer=_optimizer(p["ctx"]), skill=skill_hash(p["skill"]),
                       pool=[digest(e) for e in p["pool"]], budget=p["budget"], meta=p["meta_skill"],
                       prompts=prompt_hash("optimizer/ranking", "optimizer/ranking_suggestions"))


class Picked(BaseModel):
    """The selected edits or suggestions (whichever the mode uses), in priority order."""

    edits: list[Edit] = Field(default_factory=list)
    suggestions: list[Suggestion] = Field(default_factory=list)
    fallback: str | None = None

    @property
    def count(self) -> int:
        return len(self.edits) + len(self.suggestions)


def pick(pool: list[Edit] | list[Suggestion], budget: int, reply: RankingReply | None) -> Picked:
    """Keep at most ``budget`` of the pool: the ranked indices, or the first ones without a reply."""
    if pool and isinstance(pool[0], Suggestion):
        chosen = select_items(pool, budget, reply)
        return Picked(suggestions=chosen.items, fallback=chosen.fallback)
    selection = select_edits(pool, budget, reply)
    return Picked(edits=selection.edits, fallback=selection.fallback)


@task(name="rank_edits", cache_key_fn=keyed(_rank_key), **_OPTIONS)
def rank_edits(ctx: RunContext, skill: str, pool: list[Edit] | list[Suggestion], budget: int,
               meta_skill: str) -> Picked:
    """Gradient clipping: keep the ``budget`` most important edits or suggestions (one ranking call)."""
    if pool and isinstance(pool[0], Suggestion):
        request = suggestion_ranking_request(skill=skill, pool=pool, budget=budget, meta_skill=meta_skill)
    else:
        request = ranking_request(skill=skill, pool=pool, budget=budget, meta_skill=meta_skill)
    try:
        reply, _ = ctx.clients.optimizer.structured(request, RankingReply)
    except ParseError:
        reply = None
    return pick(pool, budget, reply)


def _budget_key(p: dict[str, Any]) -> str:
    return content_key("budget", optimizer=_optimizer(p["ctx"]), skill=skill_hash(p["skill"]),
                       scores=p["step_scores"], pool=[digest(e) for e in p["pool"]], available=p["available"],
                       buffer=p["step_buffer"], meta=p["meta_skill"], prompts=prompt_hash("optimizer/autonomous_budget"))


@task(name="decide_budget", cache_key_fn=keyed(_budget_key), **_OPTIONS)
def decide_budget_task(ctx: RunContext, skill: str, step_scores: dict[str, Any], pool: list[Edit] | list[Suggestion],
                       available: int, step_buffer: str, meta_skill: str) -> dict[str, Any]:
    """The autonomous edit budget: the optimizer decides how many to apply; an unusable answer means 0."""
    request = budget_request(skill=skill, step_scores=step_scores, pool=pool, available=available,
                             step_buffer=step_buffer, meta_skill=meta_skill)
    try:
        reply, _ = ctx.clients.optimizer.structured(request, BudgetReply)
    except ParseError:
        reply = None
    return decide_budget(reply, available)


def _rewrite_key(p: dict[str, Any]) -> str:
    return content_key("rewrite", optimizer=_optimizer(p["ctx"]), skill=skill_hash(p["skill"]),
                       suggestions=[digest(x) for x in p["suggestions"]], buffer=p["step_buffer"],
                       meta=p["meta_skill"], prompts=prompt_hash("optimizer/rewrite"))


@task(name="rewrite_skill", cache_key_fn=keyed(_rewrite_key), **_OPTIONS)
def rewrite_skill(ctx: RunContext, skill: str, suggestions: list[Suggestion], step_buffer: str,
                  meta_skill: str) -> RewriteReply | None:
    """One rewrite call that applies the selected suggestions; None when the reply stays unusable."""
    request = rewrite_request(skill=skill, suggestions=suggestions, step_buffer=step_buffer, meta_skill=meta_skill)
    try:
        reply, _ = ctx.clients.optimizer.structured(request, RewriteReply)
    except ParseError:
        return None
    return reply


class Update(BaseModel):
    candidate: str
    report: ApplyReport | None = None
    change_summary: list[str] = Field(default_factory=list)
    protected_restored: bool = False


def _apply_key(p: dict[str, Any]) -> str:
    return content_key("apply", skill=digest(p["skill"]), edits=[digest(e) for e in p["edits"]])


@task(name="apply_update", cache_key_fn=keyed(_apply_key), persist_result=True, result_serializer="json")
def apply_update(skill: str, edits: list[Edit]) -> Update:
    """Apply the selected edits in order to the current skill (pure, cheap)."""
    candidate, report = apply_edits(skill, edits)
    return Update(candidate=candidate, report=report)


def rewritten(skill: str, new_skill: str, change_summary: list[str]) -> Update:
    """A whole new skill from a rewrite or a merged full rewrite, with its protected blocks verified."""
    candidate, restored = finish_rewrite(skill, new_skill)
    return Update(candidate=candidate, change_summary=change_summary, protected_restored=restored)


class ProbeResult(BaseModel):
    instruction: str | None = None
    rows: list[ItemResult] = Field(default_factory=list)
    fallback: str | None = None


def _probe_key(p: dict[str, Any]) -> str:
    ctx: RunContext = p["ctx"]
    return content_key("deep-probe", optimizer=_optimizer(ctx), target=ctx.clients.roles.target.fingerprint(),
                       skill=skill_hash(p["skill"]), rows=[digest(r) for r in p["rows"]], buffer=p["step_buffer"],
                       meta=p["meta_skill"], prompts=prompt_hash("optimizer/deep_probe"),
                       counts=[ctx.config.gradient.deep_probe_failures, ctx.config.gradient.deep_probe_successes])


@task(name="deep_probe", cache_key_fn=keyed(_probe_key), **_OPTIONS)
def deep_probe(ctx: RunContext, skill: str, rows: list[ItemResult], step_buffer: str, meta_skill: str) -> ProbeResult:
    """Ask for a diagnostic instruction, then re-run representative items with it appended (DESIGN §4.9)."""
    cfg = ctx.config.gradient
    picked = pick_probe_items(rows, failures=cfg.deep_probe_failures, successes=cfg.deep_probe_successes)
    if not picked:
        return ProbeResult(fallback="no items to probe")
    request = probe_request(skill=skill, rows=picked, step_buffer=step_buffer, meta_skill=meta_skill)
    try:
        reply, _ = ctx.clients.optimizer.structured(request, ProbeReply)
    except ParseError as error:
        return ProbeResult(rows=[], fallback=f"probe reply unusable: {error.reason}")
    if not reply.probe_instruction.strip():
        return ProbeResult(fallback="the probe instruction was empty")
    try:
        evaluation = run_rollouts(ctx, skill, "train", [row.id for row in picked], training=True,
                                  probe_instruction=reply.probe_instruction)
    except PartialEvaluation as partial:
        evaluation = partial.evaluation
    return ProbeResult(instruction=reply.probe_instruction, rows=evaluation.rows)
