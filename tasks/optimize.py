"""Optimizer tasks of one step: reflect, merge, rank, decide the budget, rewrite, probe.

Each task builds its request with the run's update mode or a pure stage function, makes one structured call
through ``structured_or_fallback`` (the client re-asks once on a bad reply; what still fails takes the stage's
recorded fallback, an outage raises) and turns the reply into a ``Patch`` or a selection.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from pydantic import BaseModel, Field

from skillopt.assembly import Run
from skillopt.autonomous import BudgetReply, budget_request, decide_budget
from skillopt.benchmarks.images import item_image_paths
from skillopt.probe import ProbeReply, pick_probe_items, probe_request
from skillopt.prompts import prompt_hash
from skillopt.records import ItemResult, Patch, Suggestion
from skillopt.reflect import analyst_fallback, with_item_images
from skillopt.rewrite import RewriteReply, rewrite_request
from skillopt.select import RankingReply
from skillopt.skill import Edit, skill_hash
from skillopt.stage_call import structured_or_fallback
from skillopt.tasks.cache import content_key, digest, keyed, retry_only_retryable
from skillopt.tasks.rollout import PartialEvaluation, run_rollouts
from skillopt.update_modes import Picked

_OPTIONS: dict[str, Any] = {"persist_result": True, "result_serializer": "json", "tags": ["llm:optimizer"],
                            "retry_condition_fn": retry_only_retryable}


def _optimizer(run: Run) -> str:
    return run.clients.roles.optimizer.fingerprint()


def _reflect_key(p: dict[str, Any]) -> str:
    run: Run = p["run"]
    return content_key(
        "reflect", optimizer=_optimizer(run), mode=run.update_mode.name, kind=p["kind"], skill=skill_hash(p["skill"]),
        budget=p["budget"], rows=[digest(r) for r in p["rows"]], buffer=p["step_buffer"], meta=p["meta_skill"],
        prompts=prompt_hash("optimizer/analyst_failure", "optimizer/analyst_success",
                            "optimizer/analyst_execution_notes", "optimizer/analyst_suggestions",
                            "optimizer/analyst_full_rewrite"),
        guidance=digest(run.benchmark_guidance), appendix=run.config.optimizer.use_appendix,
        # With analyst_images the pictures are part of the prompt: their content hashes are in data_hash.
        images=run.data_hash if run.config.optimizer.analyst_images else None,
    )


@task(name="reflect_minibatch", cache_key_fn=keyed(_reflect_key), **_OPTIONS)
def reflect_minibatch(run: Run, kind: str, skill: str, rows: list[ItemResult], budget: int,
                      step_buffer: str, meta_skill: str) -> Patch:
    """One analyst call on one minibatch of train trajectories (edits, suggestions or a whole skill)."""
    mode = run.update_mode
    request = mode.analyst_request(
        kind=kind, skill=skill, budget=budget, rows=rows, step_buffer=step_buffer, meta_skill=meta_skill,
        use_appendix=run.config.optimizer.use_appendix,
        benchmark_guidance=run.benchmark_guidance["error" if kind == "failure" else "success"])
    if run.config.optimizer.analyst_images:
        request = with_item_images(request, rows, {row.id: item_image_paths(run.items.get(row.id, {})) for row in rows},
                                   detail=getattr(run.bench_cfg, "image_detail", None))
    reply = structured_or_fallback(
        run.clients.optimizer, request, mode.analyst_reply,
        fallback=lambda reason: analyst_fallback(kind=kind, rows=rows,  # type: ignore[arg-type]
                                                 reason=f"analyst reply unusable: {reason}"))
    if isinstance(reply, Patch):
        return reply
    return mode.patch_from_analyst(reply, kind=kind, rows=rows, budget=budget)


def _merge_key(p: dict[str, Any]) -> str:
    return content_key("merge", optimizer=_optimizer(p["run"]), mode=p["run"].update_mode.name,
                       kind=p["kind"], skill=skill_hash(p["skill"]),
                       patches=[digest(x) for x in p["patches"]], level=p["level"], meta=p["meta_skill"],
                       prompts=prompt_hash("optimizer/merge", "optimizer/merge_final", "optimizer/merge_suggestions",
                                           "optimizer/merge_skills"))


@task(name="merge_patches", cache_key_fn=keyed(_merge_key), **_OPTIONS)
def merge_patches(run: Run, kind: str, skill: str, patches: list[Patch], level: int, meta_skill: str) -> Patch:
    """Merge one group of patches into one; a reply that cannot be used takes the mode's fallback."""
    mode = run.update_mode
    request = mode.merge_request(kind=kind, skill=skill, patches=patches, level=level, meta_skill=meta_skill)
    reply = structured_or_fallback(
        run.clients.optimizer, request, mode.merge_reply,
        fallback=lambda reason: mode.merge_fallback(patches, reason=f"merge reply unusable: {reason}"))
    if isinstance(reply, Patch):
        return reply
    return mode.patch_from_merge(reply, kind=kind, level=level, patches=patches)


def _rank_key(p: dict[str, Any]) -> str:
    return content_key("rank", optimizer=_optimizer(p["run"]), skill=skill_hash(p["skill"]),
                       pool=[digest(e) for e in p["pool"]], budget=p["budget"], meta=p["meta_skill"],
                       prompts=prompt_hash("optimizer/ranking", "optimizer/ranking_suggestions"))


@task(name="rank_edits", cache_key_fn=keyed(_rank_key), **_OPTIONS)
def rank_edits(run: Run, skill: str, pool: list[Edit] | list[Suggestion], budget: int,
               meta_skill: str) -> Picked:
    """Gradient clipping: keep the ``budget`` most important edits or suggestions (one ranking call)."""
    mode = run.update_mode
    request = mode.ranking_request(skill=skill, pool=pool, budget=budget, meta_skill=meta_skill)
    reply = structured_or_fallback(run.clients.optimizer, request, RankingReply, fallback=lambda _: None)
    return mode.pick(pool, budget, reply)


def _budget_key(p: dict[str, Any]) -> str:
    return content_key("budget", optimizer=_optimizer(p["run"]), skill=skill_hash(p["skill"]),
                       scores=p["step_scores"], pool=[digest(e) for e in p["pool"]], available=p["available"],
                       buffer=p["step_buffer"], meta=p["meta_skill"],
                       prompts=prompt_hash("optimizer/autonomous_budget"))


@task(name="decide_budget", cache_key_fn=keyed(_budget_key), **_OPTIONS)
def decide_budget_task(run: Run, skill: str, step_scores: dict[str, Any], pool: list[Edit] | list[Suggestion],
                       available: int, step_buffer: str, meta_skill: str) -> dict[str, Any]:
    """The autonomous edit budget: the optimizer decides how many to apply; an unusable answer means 0."""
    request = budget_request(skill=skill, step_scores=step_scores, pool=pool, available=available,
                             step_buffer=step_buffer, meta_skill=meta_skill)
    reply = structured_or_fallback(run.clients.optimizer, request, BudgetReply, fallback=lambda _: None)
    return decide_budget(reply, available)


def _rewrite_key(p: dict[str, Any]) -> str:
    return content_key("rewrite", optimizer=_optimizer(p["run"]), skill=skill_hash(p["skill"]),
                       suggestions=[digest(x) for x in p["suggestions"]], buffer=p["step_buffer"],
                       meta=p["meta_skill"], prompts=prompt_hash("optimizer/rewrite"))


@task(name="rewrite_skill", cache_key_fn=keyed(_rewrite_key), **_OPTIONS)
def rewrite_skill(run: Run, skill: str, suggestions: list[Suggestion], step_buffer: str,
                  meta_skill: str) -> RewriteReply | None:
    """One rewrite call that applies the selected suggestions; None when the reply stays unusable."""
    request = rewrite_request(skill=skill, suggestions=suggestions, step_buffer=step_buffer, meta_skill=meta_skill)
    return structured_or_fallback(run.clients.optimizer, request, RewriteReply, fallback=lambda _: None)


class ProbeResult(BaseModel):
    instruction: str | None = None
    rows: list[ItemResult] = Field(default_factory=list)
    fallback: str | None = None


def _probe_key(p: dict[str, Any]) -> str:
    run: Run = p["run"]
    return content_key("deep-probe", optimizer=_optimizer(run), target=run.clients.roles.target.fingerprint(),
                       skill=skill_hash(p["skill"]), rows=[digest(r) for r in p["rows"]], buffer=p["step_buffer"],
                       meta=p["meta_skill"], prompts=prompt_hash("optimizer/deep_probe"),
                       guidance=run.benchmark_guidance.get("probe", ""),
                       counts=[run.config.gradient.deep_probe_failures, run.config.gradient.deep_probe_successes])


@task(name="deep_probe", cache_key_fn=keyed(_probe_key), **_OPTIONS)
def deep_probe(run: Run, skill: str, rows: list[ItemResult], step_buffer: str, meta_skill: str) -> ProbeResult:
    """Ask for a diagnostic instruction, then re-run representative items with it appended."""
    cfg = run.config.gradient
    picked = pick_probe_items(rows, failures=cfg.deep_probe_failures, successes=cfg.deep_probe_successes)
    if not picked:
        return ProbeResult(fallback="no items to probe")
    request = probe_request(skill=skill, rows=picked, step_buffer=step_buffer, meta_skill=meta_skill,
                            benchmark_guidance=run.benchmark_guidance.get("probe", ""))
    reply = structured_or_fallback(run.clients.optimizer, request, ProbeReply,
                                   fallback=lambda reason: ProbeResult(fallback=f"probe reply unusable: {reason}"))
    if isinstance(reply, ProbeResult):
        return reply
    if not reply.probe_instruction.strip():
        return ProbeResult(fallback="the probe instruction was empty")
    try:
        evaluation = run_rollouts(run, skill, "train", [row.id for row in picked], training=True,
                                  probe_instruction=reply.probe_instruction)
    except PartialEvaluation as partial:
        evaluation = partial.evaluation
    return ProbeResult(instruction=reply.probe_instruction, rows=evaluation.rows)
