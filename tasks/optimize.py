"""Optimizer tasks of one step: reflect, merge, rank, decide the budget, rewrite, probe.

Each task renders its request with the run's update mode or a pure stage function (``*_request`` below,
which the task's cache key renders too), makes one structured call through ``structured_or_fallback`` (the
client re-asks once on a bad reply; what still fails takes the stage's recorded fallback, an outage raises)
and turns the reply into a ``Patch`` or a selection.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from prefect import task
from pydantic import BaseModel, Field

from skillopt.benchmarks.images import item_image_paths
from skillopt.core.records import ItemResult, Patch, Suggestion
from skillopt.llm.chat import ChatRequest
from skillopt.optimizer.autonomous import BudgetReply, budget_request, decide_budget
from skillopt.optimizer.probe import ProbeReply, pick_probe_items, probe_request
from skillopt.optimizer.reflect import analyst_fallback, with_item_images
from skillopt.optimizer.rewrite import RewriteReply, rewrite_request
from skillopt.optimizer.select import RankingReply
from skillopt.optimizer.stage_call import structured_or_fallback
from skillopt.optimizer.trajectory import trajectory_chars
from skillopt.optimizer.update_modes import Picked
from skillopt.run.assembly import Run
from skillopt.run.cache_keys import digest
from skillopt.run.rollouts import rollout_key
from skillopt.skill.document import Edit
from skillopt.tasks.cache import OPTIMIZER_TASK_OPTIONS as _OPTIONS
from skillopt.tasks.cache import keyed_by_request
from skillopt.tasks.rollout import PartialEvaluation, run_rollouts


def analyst_request(run: Run, kind: str, skill: str, rows: list[ItemResult], budget: int, step_buffer: str,
                    meta_skill: str, prompt_chars: int | None = None) -> ChatRequest:
    """The update mode's analyst request on one minibatch, with the items' images when the analyst sees
    them, sized to ``prompt_chars`` (default: the room the optimizer's context window leaves)."""
    if prompt_chars is None:
        prompt_chars = run.clients.optimizer.prompt_chars(run.update_mode.analyst_reply)
    request = run.update_mode.analyst_request(
        kind=kind, skill=skill, budget=budget, rows=rows, step_buffer=step_buffer, meta_skill=meta_skill,
        use_appendix=run.config.optimizer.use_appendix,
        benchmark_guidance=run.benchmark_guidance["error" if kind == "failure" else "success"],
        prompt_chars=prompt_chars, trajectory_chars=trajectory_chars(run.config.gradient.trajectory_tokens))
    if not run.config.optimizer.analyst_images:
        return request
    images = {row.id: item_image_paths(run.items.get(row.id, {})) for row in rows}
    return with_item_images(request, rows, images, detail=getattr(run.bench_cfg, "image_detail", None))


@task(name="reflect_minibatch",
      cache_key_fn=keyed_by_request(analyst_request, lambda run: run.update_mode.analyst_reply), **_OPTIONS)
def reflect_minibatch(run: Run, kind: str, skill: str, rows: list[ItemResult], budget: int,
                      step_buffer: str, meta_skill: str) -> Patch:
    """One analyst call on one minibatch of train trajectories (edits, suggestions or a whole skill)."""
    mode = run.update_mode
    # A builder: the client rebuilds the request smaller if the server still finds it too long.
    request = partial(analyst_request, run, kind, skill, rows, budget, step_buffer, meta_skill)
    reply = structured_or_fallback(
        run.clients.optimizer, request, mode.analyst_reply,
        fallback=lambda reason: analyst_fallback(kind=kind, rows=rows,  # type: ignore[arg-type]
                                                 reason=f"analyst reply unusable: {reason}"))
    if isinstance(reply, Patch):
        return reply
    return mode.patch_from_analyst(reply, kind=kind, rows=rows, budget=budget)


def merge_request(run: Run, kind: str, skill: str, patches: list[Patch], level: int,
                  meta_skill: str) -> ChatRequest:
    return run.update_mode.merge_request(kind=kind, skill=skill, patches=patches, level=level,
                                         meta_skill=meta_skill)


@task(name="merge_patches",
      cache_key_fn=keyed_by_request(merge_request, lambda run: run.update_mode.merge_reply), **_OPTIONS)
def merge_patches(run: Run, kind: str, skill: str, patches: list[Patch], level: int,
                  meta_skill: str) -> Patch:
    """Merge one group of patches into one; a reply that cannot be used takes the mode's fallback."""
    mode = run.update_mode
    reply = structured_or_fallback(
        run.clients.optimizer, merge_request(run, kind, skill, patches, level, meta_skill), mode.merge_reply,
        fallback=lambda reason: mode.merge_fallback(patches, reason=f"merge reply unusable: {reason}"))
    if isinstance(reply, Patch):
        return reply
    return mode.patch_from_merge(reply, kind=kind, level=level, patches=patches)


def ranking_request(run: Run, skill: str, pool: list[Edit] | list[Suggestion], budget: int,
                    meta_skill: str) -> ChatRequest:
    return run.update_mode.ranking_request(skill=skill, pool=pool, budget=budget, meta_skill=meta_skill)


@task(name="rank_edits", cache_key_fn=keyed_by_request(ranking_request, RankingReply), **_OPTIONS)
def rank_edits(run: Run, skill: str, pool: list[Edit] | list[Suggestion], budget: int,
               meta_skill: str) -> Picked:
    """Gradient clipping: keep the ``budget`` most important edits or suggestions (one ranking call)."""
    request = ranking_request(run, skill, pool, budget, meta_skill)
    reply = structured_or_fallback(run.clients.optimizer, request, RankingReply, fallback=lambda _: None)
    return run.update_mode.pick(pool, budget, reply)


def _budget_request(run: Run, skill: str, step_scores: dict[str, Any], pool: list[Edit] | list[Suggestion],
                    available: int, step_buffer: str, meta_skill: str) -> ChatRequest:
    return budget_request(skill=skill, step_scores=step_scores, pool=pool, available=available,
                          step_buffer=step_buffer, meta_skill=meta_skill)


@task(name="decide_budget", cache_key_fn=keyed_by_request(_budget_request, BudgetReply), **_OPTIONS)
def decide_budget_task(run: Run, skill: str, step_scores: dict[str, Any], pool: list[Edit] | list[Suggestion],
                       available: int, step_buffer: str, meta_skill: str) -> dict[str, Any]:
    """The autonomous edit budget: the optimizer decides how many to apply; an unusable answer means 0."""
    request = _budget_request(run, skill, step_scores, pool, available, step_buffer, meta_skill)
    reply = structured_or_fallback(run.clients.optimizer, request, BudgetReply, fallback=lambda _: None)
    return decide_budget(reply, available)


def _rewrite_request(run: Run, skill: str, suggestions: list[Suggestion], step_buffer: str,
                     meta_skill: str) -> ChatRequest:
    return rewrite_request(skill=skill, suggestions=suggestions, step_buffer=step_buffer,
                           meta_skill=meta_skill)


@task(name="rewrite_skill", cache_key_fn=keyed_by_request(_rewrite_request, RewriteReply), **_OPTIONS)
def rewrite_skill(run: Run, skill: str, suggestions: list[Suggestion], step_buffer: str,
                  meta_skill: str) -> RewriteReply | None:
    """One rewrite call that applies the selected suggestions; None when the reply stays unusable."""
    request = _rewrite_request(run, skill, suggestions, step_buffer, meta_skill)
    return structured_or_fallback(run.clients.optimizer, request, RewriteReply, fallback=lambda _: None)


class ProbeResult(BaseModel):
    instruction: str | None = None
    rows: list[ItemResult] = Field(default_factory=list)
    fallback: str | None = None


def _probe_request(run: Run, skill: str, picked: list[ItemResult], step_buffer: str,
                   meta_skill: str, prompt_chars: int | None = None) -> ChatRequest:
    if prompt_chars is None:
        prompt_chars = run.clients.optimizer.prompt_chars(ProbeReply)
    return probe_request(
        skill=skill,
        rows=picked,
        step_buffer=step_buffer,
        meta_skill=meta_skill,
        benchmark_guidance=run.benchmark_guidance.get("probe", ""),
        prompt_chars=prompt_chars,
        trajectory_chars=trajectory_chars(run.config.gradient.trajectory_tokens),
    )


def _probe_picks(run: Run, rows: list[ItemResult]) -> list[ItemResult]:
    cfg = run.config.gradient
    return pick_probe_items(rows, failures=cfg.deep_probe_failures, successes=cfg.deep_probe_successes)


def _probe_key(context: Any, p: dict[str, Any]) -> str:
    """The probe request, and the re-runs' own first requests (the probe instruction is appended to them)."""
    run: Run = p["run"]
    picked = _probe_picks(run, p["rows"])
    request = _probe_request(run, p["skill"], picked, p["step_buffer"], p["meta_skill"])
    reruns = [rollout_key(run, run.items[row.id], p["skill"], training=True, epoch=p.get("epoch"))
              for row in picked]
    probe = request.model_copy(update={"response_schema": ProbeReply})
    probe_key = probe.cache_key(run.clients.roles.optimizer.fingerprint())
    return f"skillopt-deep_probe-{digest([probe_key, reruns])}"


@task(name="deep_probe", cache_key_fn=_probe_key, **_OPTIONS)
def deep_probe(run: Run, skill: str, rows: list[ItemResult], step_buffer: str, meta_skill: str,
               epoch: int | None = None) -> ProbeResult:
    """Ask for a diagnostic instruction, then re-run representative items with it appended."""
    picked = _probe_picks(run, rows)
    if not picked:
        return ProbeResult(fallback="no items to probe")
    request = partial(_probe_request, run, skill, picked, step_buffer, meta_skill)
    reply = structured_or_fallback(
        run.clients.optimizer, request, ProbeReply,
        fallback=lambda reason: ProbeResult(fallback=f"probe reply unusable: {reason}"))
    if isinstance(reply, ProbeResult):
        return reply
    if not reply.probe_instruction.strip():
        return ProbeResult(fallback="the probe instruction was empty")
    try:
        evaluation = run_rollouts(run, skill, "train", [row.id for row in picked], training=True,
                                  probe_instruction=reply.probe_instruction, epoch=epoch)
    except PartialEvaluation as incomplete:
        evaluation = incomplete.evaluation
    return ProbeResult(instruction=reply.probe_instruction, rows=evaluation.rows)
