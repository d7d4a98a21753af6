"""The stages ``flows/train.py`` calls, one call each: the state a run carries from step to step, the fan-out
of analyst and merge calls, selection and the candidate, the gate, the step's
record, the epoch boundary's pairs, the budget guard and the nightly promotion. Model calls go through the
cached tasks of ``tasks/``; the decisions are ``skillopt``'s.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, Field

from skillopt.core.error_rows import answered_rows, paired_answered, too_many_errors
from skillopt.core.gate import GateResult, Scores, decide, gate_score, score_rows
from skillopt.core.records import ItemResult, Patch, StepRecord, unusable_replies_warning
from skillopt.llm.usage import Totals, check_budget, projection_from_history
from skillopt.optimizer.appendix import with_execution_notes
from skillopt.optimizer.merge import merge_groups
from skillopt.optimizer.pareto import Front
from skillopt.optimizer.reflect import split_and_batch
from skillopt.optimizer.select import needs_ranking
from skillopt.optimizer.slow_update import Pairs, pair_by_id, select_pairs
from skillopt.optimizer.update_modes import Picked, Update
from skillopt.run.assembly import Run
from skillopt.run.registry import PromotedSkill, SkillRegistry
from skillopt.run.rollouts import Draws
from skillopt.skill.document import Edit, skill_hash
from skillopt.tasks.artifacts import publish_promotion
from skillopt.tasks.cache import bound
from skillopt.tasks.optimize import (
    decide_budget_task,
    merge_patches,
    rank_edits,
    reflect_minibatch,
    rewrite_skill,
)
from skillopt.tasks.rollout import evaluate, evaluate_many
from skillopt.tasks.runners import pool_for

progress = logging.getLogger("skillopt.progress")


class TrainState(BaseModel):
    """What a run carries from step to step (all of it can be rebuilt from the cache on resume)."""

    initial_skill: str
    current_skill: str
    current_score: float
    best_skill: str
    best_score: float
    best_step: int = 0
    step: int = 0
    total_steps: int
    baseline: Scores
    meta_memory: str = ""
    guidance: str = ""
    epoch_last_skills: list[str] = Field(default_factory=list)
    history: list[StepRecord] = Field(default_factory=list)
    step_totals: list[Totals] = Field(default_factory=list)
    stopped_by: str | None = None
    stopped_message: str | None = None
    #: The dry-run estimate of one step's spend: the budget guard's projection until a step has finished.
    step_estimate: Totals | None = None
    #: The accepted skills kept with ``train.selection: pareto`` (``flows/front.py``).
    front: Front = Field(default_factory=Front)


class StepTimer:
    """Wall-clock seconds per stage of one step (``StepRecord.wall_s``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.monotonic() - start


class Evidence(BaseModel):
    """What the rollouts and analysts of one step produced."""

    rows: list[ItemResult] = Field(default_factory=list)
    failure_patches: list[Patch] = Field(default_factory=list)
    success_patches: list[Patch] = Field(default_factory=list)
    probe: dict[str, Any] | None = None

    @property
    def patches(self) -> list[Patch]:
        return self.failure_patches + self.success_patches


class StepOutcome(BaseModel):
    """How a step's update ended: the decision and what led to it (None where the step never got there)."""

    decision: str
    budget: int
    budget_decision: dict[str, Any] | None = None
    edits_proposed: int = 0
    picked: Picked | None = None
    update: Update | None = None
    gate: GateResult | None = None
    #: The step's idea as edits, for the step buffer, when the candidate was not accepted.
    rejected: list[Edit] = Field(default_factory=list)
    scores: tuple[float, float] | None = None
    #: Selection items the gate left out as error rows, and why it did not decide, if it did not.
    gate_error_ids: list[str] = Field(default_factory=list)
    skip_reason: str | None = None


# --------------------------------------------------------------------------------------------
# Reflect and aggregate


def reflect(run: Run, skill: str, rows: list[ItemResult], *, seed: int, budget: int, buffer: str,
            meta_skill: str) -> tuple[list[Patch], list[Patch]]:
    """One analyst call per minibatch of failures and of successes, at most ``gradient.analyst_workers`` at
    once."""
    jobs = reflect_jobs(run, skill, rows, seed=seed, budget=budget, buffer=buffer, meta_skill=meta_skill)
    run.prefetch.calls(reflect_minibatch.fn, [job for _, job in jobs])  # a hint: the calls of these tasks
    task = bound(run, reflect_minibatch)
    with pool_for(run, "analysts", run.config.gradient.analyst_workers) as runner:
        futures = [runner.submit(task, job) for _, job in jobs]
        patches = [future.result() for future in futures]
    return by_kind([kind for kind, _ in jobs], patches)


def by_kind(kinds: list[str], patches: list[Patch]) -> tuple[list[Patch], list[Patch]]:
    """The analysts' patches (one per ``reflect_jobs`` job, whose kinds are ``kinds``) as failure and success
    patches."""
    paired = list(zip(kinds, patches, strict=True))
    return [p for k, p in paired if k == "failure"], [p for k, p in paired if k == "success"]


def reflect_jobs(run: Run, skill: str, rows: list[ItemResult], *, seed: int, budget: int, buffer: str,
                 meta_skill: str) -> list[tuple[str, dict[str, Any]]]:
    """The analyst calls of ``reflect``: the kind ("failure" or "success") and the ``reflect_minibatch``
    arguments of each minibatch."""
    cfg = run.config
    failures, successes = split_and_batch(rows, size=cfg.gradient.minibatch_size, seed=seed,
                                          failure_only=cfg.gradient.failure_only)
    common = {"run": run, "skill": skill, "budget": budget, "step_buffer": buffer, "meta_skill": meta_skill}
    return [(kind, {**common, "kind": kind, "rows": batch})
            for kind, groups in (("failure", failures), ("success", successes)) for batch in groups]


#: One level of merge calls: the ``merge_patches`` arguments of each call in, their patches out (in order).
MergeCalls = Callable[[list[dict[str, Any]]], list[Patch]]


def merge_tasks(run: Run) -> MergeCalls:
    """The step's merge calls: ``merge_patches`` task runs, every call of a level submitted before waiting for
    any, their model calls hinted to the prefetch layer first."""
    def level(calls: list[dict[str, Any]]) -> list[Patch]:
        run.prefetch.calls(merge_patches.fn, calls)
        task = bound(run, merge_patches)
        futures = [task.submit(**arguments) for arguments in calls]
        return [future.result() for future in futures]

    return level


def aggregate(run: Run, skill: str, failures: list[Patch], successes: list[Patch], *,
              meta_skill: str, merges: MergeCalls | None = None) -> Patch:
    """Hierarchical merge of each tree, then the final merge that gives failure-driven edits priority.

    ``merges`` makes the merge calls: the step's tasks (``merge_tasks``) unless a hint makes them
    (``flows/train.hint_step_one``)."""
    merges = merges or merge_tasks(run)
    merged = merge_trees(run, skill, {"failure": failures, "success": successes}, meta_skill=meta_skill,
                         merges=merges)
    trees = [t for t in merged.values() if _has_content(t)]
    if not trees:
        return Patch(reasoning="no edits proposed")
    if len(trees) == 1:
        return trees[0]
    level = max(t.merge_level for t in trees) + 1
    return merges([{"run": run, "kind": "final", "skill": skill, "patches": trees, "level": level,
                    "meta_skill": meta_skill}])[0]


def _hinted_call(task: Any, **arguments: Any) -> Any:
    """``task`` run with ``arguments`` (its run among them), its model call hinted to the prefetch layer
    first: the call leaves before Prefect has created the task run, which then takes the reply as its own."""
    run: Run = arguments["run"]
    run.prefetch.calls(task.fn, [arguments])
    return bound(run, task)(**arguments)


def merge_trees(run: Run, skill: str, trees: dict[str, list[Patch]], *, meta_skill: str,
                merges: MergeCalls | None = None) -> dict[str, Patch]:
    """Merge each non-empty tree (kind -> patches) level by level until one patch is left, the trees side by
    side: the merge calls of a level, for all trees, go to ``merges`` together."""
    merges = merges or merge_tasks(run)
    # A tree of only empty patches has nothing to merge: one of them stands for it.
    pending = {kind: [p for p in patches if _has_content(p)] or patches[:1]
               for kind, patches in trees.items() if patches}
    level = 0
    while any(len(patches) > 1 for patches in pending.values()):
        level += 1
        groups = {kind: merge_groups(patches, run.config.gradient.merge_batch_size)
                  for kind, patches in pending.items() if len(patches) > 1}
        merged = iter(merges([
            {"run": run, "kind": kind, "skill": skill, "patches": g, "level": level, "meta_skill": meta_skill}
            for kind, gs in groups.items() for g in gs if len(g) > 1]))
        for kind, gs in groups.items():
            pending[kind] = [next(merged) if len(g) > 1 else g[0] for g in gs]
    return {kind: patches[0] for kind, patches in pending.items()}


def _has_content(patch: Patch) -> bool:
    return bool(patch.edits or patch.suggestions or (patch.skill or "").strip())


# --------------------------------------------------------------------------------------------
# Select and update


def autonomous_budget(run: Run, state: TrainState, skill: str, pool: list[Any], evidence: Evidence,
                      buffer: str) -> dict[str, Any]:
    """``optimizer.lr_control_mode: autonomous``: the optimizer decides how many of ``pool`` to apply."""
    rows = evidence.rows
    step_scores = {"current_score": state.current_score, "best_score": state.best_score,
                   "rollout_hard": sum(r.hard for r in rows) / len(rows),
                   "rollout_soft": sum(r.soft for r in rows) / len(rows),
                   "n_fail": sum(r.failed for r in rows), "n_total": len(rows)}
    return bound(run, decide_budget_task)(run, skill, step_scores, pool, len(pool), buffer, state.meta_memory)


def select(run: Run, skill: str, pool: list[Any], budget: int, meta_skill: str) -> Picked:
    """Gradient clipping: at most ``budget`` of ``pool``, ranked by one optimizer call when it must choose."""
    if needs_ranking(pool, budget):
        return _hinted_call(rank_edits, run=run, skill=skill, pool=pool, budget=budget,
                            meta_skill=meta_skill)
    return run.update_mode.pick(pool, budget, None)


def build_candidate(run: Run, skill: str, merged: Patch, picked: Picked, *, buffer: str, meta_skill: str,
                    timer: StepTimer) -> Update | None:
    """The update mode's candidate skill; None when its rewrite gave no skill."""

    def rewrite(suggestions: list[Any]) -> Any:
        with timer("rewrite"):
            return _hinted_call(rewrite_skill, run=run, skill=skill, suggestions=suggestions,
                                step_buffer=buffer, meta_skill=meta_skill)

    return run.update_mode.candidate(skill, merged, picked, rewrite=rewrite)


# --------------------------------------------------------------------------------------------
# Gate


class GateSkipped(BaseModel):
    """A gate that did not decide: too many of its items were error rows (``evaluation.max_error_share``)."""

    reason: str
    error_ids: list[str] = Field(default_factory=list)


def gate_candidate(run: Run, state: TrainState, candidate: str) -> GateResult | GateSkipped:
    """The candidate against the run's current and best skill at its step (``gate_skills``)."""
    return gate_skills(run, candidate, current=state.current_skill, best=state.best_skill, step=state.step)


def gate_skills(run: Run, candidate: str, *, current: str, best: str, step: int) -> GateResult | GateSkipped:
    """The candidate against the current skill on the selection split (evaluations cached by skill).

    Error rows are left out on every side, paired by item: an item that errored under the candidate, the
    current or the best skill counts for none of them, and the current and best scores are taken on the same
    items. An evaluation with error rows is retried once more first (its finished items come from the cache).
    """
    cfg = run.config.evaluation
    skills = {"candidate": candidate, "current": current, "best": best}
    by_hash: dict[str, Any] = {}
    for skill in skills.values():
        key = skill_hash(skill)
        if key not in by_hash:
            evaluation = evaluate(run, skill, "val")
            if any(row.is_error for row in evaluation.rows):
                evaluation = evaluate(run, skill, "val")  # one more try before the gate decides
            by_hash[key] = evaluation
    (proposed, current_rows, best_rows), dropped = paired_answered(
        *(by_hash[skill_hash(s)].rows for s in skills.values())
    )
    reason = too_many_errors(len(dropped), len(by_hash[skill_hash(candidate)].rows), cfg.max_error_share)
    if reason:
        return GateSkipped(reason=reason, error_ids=dropped)
    result = decide(proposed, current_rows, current_score=gate_value(run, score_rows(current_rows)),
                    best_score=gate_value(run, score_rows(best_rows)), metric=cfg.gate_metric,
                    mixed_weight=cfg.gate_mixed_weight, use_gate=cfg.use_gate, test=cfg.gate_test,
                    alpha=cfg.gate_alpha, seed=run.config.train.seed + step)
    return result.model_copy(update={"excluded": dropped})


def accept(run: Run, state: TrainState, candidate: str, score: float, *, new_best: bool) -> None:
    state.current_skill, state.current_score = candidate, score
    if new_best:
        state.best_skill, state.best_score, state.best_step = candidate, score, state.step
        run.dir.write_best_skill(candidate)
    if run.config.train.selection == "pareto":
        from skillopt.flows.front import admit

        admit(run, state, candidate)


def gate_value(run: Run, scores: Scores) -> float:
    cfg = run.config.evaluation
    return gate_score(scores.hard, scores.soft, cfg.gate_metric, cfg.gate_mixed_weight)


def rescore(run: Run, state: TrainState, skill: str) -> None:
    """Make ``skill`` the current skill outside the gate (guidance, execution notes): the best stays a
    validated snapshot, and the current skill is re-scored (cached by hash) so later gates compare against a
    true score."""
    state.current_skill = skill
    state.current_score = gate_value(run, evaluate(run, skill, "val").scores)


def add_execution_notes(run: Run, state: TrainState, patches: list[Patch]) -> list[str]:
    """After the gate: "the rule exists but was not followed" reminders go into the appendix block.
    Returns the notes that changed the current skill ([] when none did)."""
    notes = [note for patch in patches for note in patch.execution_notes if note.strip()]
    if not notes:
        return []
    updated = with_execution_notes(state.current_skill, notes)
    if skill_hash(updated) == skill_hash(state.current_skill):
        return []
    rescore(run, state, updated)
    return notes


# --------------------------------------------------------------------------------------------
# Record


def step_record(run: Run, state: TrainState, evidence: Evidence, merged: Patch, outcome: StepOutcome, *,
                epoch: int, step_in_epoch: int, appendix_notes: list[str], wall_s: dict[str, float],
                mark: int) -> StepRecord:
    """The step's line of ``history.jsonl``, from what the step produced and how it ended."""
    rows, picked, update = evidence.rows, outcome.picked, outcome.update
    answered = answered_rows(rows)  # error rows are neither failures nor successes
    warnings = [p.fallback for p in [*evidence.patches, merged] if p.fallback]
    warnings += [picked.fallback] if picked and picked.fallback else []
    if update and update.protected_restored:
        warnings.append("the rewrite lost or changed a protected block; it was restored")
    if outcome.skip_reason:
        warnings.append(outcome.skip_reason)
    parsed, fallback = reply_counts(evidence, merged, outcome)
    replies_warning = unusable_replies_warning(parsed, fallback)
    warnings += [replies_warning] if replies_warning else []
    return StepRecord(
        step=state.step,
        epoch=epoch,
        step_in_epoch=step_in_epoch,
        budget=outcome.budget,
        decision=outcome.decision,
        batch_ids=[r.id for r in rows],
        n_fail=sum(r.failed for r in answered),
        n_total=len(answered),
        n_error=len(rows) - len(answered),
        gate_error_ids=outcome.gate_error_ids,
        replies_parsed=parsed,
        replies_fallback=fallback,
        rollout_hard=_mean(r.hard for r in answered),
        rollout_soft=_mean(r.soft for r in answered),
        patches_proposed=len(evidence.patches),
        patches_parsed=sum(p.fallback is None for p in evidence.patches),
        edits_proposed=outcome.edits_proposed,
        edits_selected=picked.count if picked else 0,
        edits=picked.edits if picked else [],
        apply_report=update.report if update else None,
        edits_applied=update.report.n_applied if update and update.report else 0,
        change_summary=update.change_summary if update else [],
        protected_restored=update.protected_restored if update else False,
        budget_decision=outcome.budget_decision,
        probe=evidence.probe,
        appendix_notes=appendix_notes,
        gate=outcome.gate,
        current_score=state.current_score,
        best_score=state.best_score,
        skill_sha=skill_hash(state.current_skill),
        skill_chars=len(state.current_skill),
        warnings=warnings,
        usage=run.clients.ledger.summary(since=mark)["total"],
        wall_s=wall_s,
    )


def reply_counts(evidence: Evidence, merged: Patch, outcome: StepOutcome) -> tuple[int, int]:
    """``(parsed, fallback)``: the step's optimizer calls whose reply was used, and those that took their
    stage's fallback: analysts, the last merge (the one that produced ``merged``), the ranking, the
    autonomous budget and the probe. Read from the stages' results (a resumed step counts the same)."""
    outcomes = [patch.fallback for patch in evidence.patches]
    if merged.merge_level > 0 or merged.fallback:  # a single patch passes through without a merge call
        outcomes.append(merged.fallback)
    if outcome.picked is not None and 0 < outcome.budget < outcome.edits_proposed:  # a ranking call chose
        outcomes.append(outcome.picked.fallback)
    if outcome.budget_decision is not None:
        outcomes.append(outcome.budget_decision.get("fallback"))
    if evidence.probe is not None:
        outcomes.append(evidence.probe.get("fallback"))
    fallback = sum(reason is not None for reason in outcomes)
    return len(outcomes) - fallback, fallback


def _mean(values: Any) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


# --------------------------------------------------------------------------------------------
# Epoch boundary


def longitudinal_pairs(run: Run, epoch: int, before_skill: str, after_skill: str, *, draws: Draws) -> Pairs:
    """The same train items under both skills, paired by id and filtered by the pair policy.

    ``slow_update_samples`` items are drawn with seed ``seed + 2000*epoch``; with the ``changed`` or
    ``unchanged`` policy, more train items (the next ones in the same seeded order, both skills rolled
    out in parallel) top the selection up until it has that many pairs or the split runs out.
    """
    cfg = run.config
    train_ids = sorted(run.split_ids["train"])
    order = random.Random(cfg.train.seed + 2000 * epoch).sample(train_ids, len(train_ids))
    wanted = min(cfg.optimizer.slow_update_samples, len(order))
    policy = cfg.optimizer.longitudinal_pair_policy
    pairs, taken = Pairs(), 0
    while taken < len(order):
        chunk = order[taken:taken + wanted]
        taken += len(chunk)
        before, after = evaluate_many(run, [(before_skill, "train", chunk), (after_skill, "train", chunk)],
                                      training=True, epoch=draws.epoch)
        found = select_pairs(pair_by_id(before.rows, after.rows), policy)
        pairs = Pairs(**{group: [*getattr(pairs, group), *getattr(found, group)]
                         for group in Pairs.model_fields})
        if policy == "mixed" or len(pairs.ids()) >= wanted:
            break
    return pairs


# --------------------------------------------------------------------------------------------
# Budget guard


def step_estimate(run: Run) -> Totals:
    """The dry-run estimate of one step's spend (``skillopt.run.estimate``), from this run's data and
    roles."""
    from skillopt.run.estimate import estimate_benchmark_run

    items = {split: run.rows_of(ids) for split, ids in run.split_ids.items()}
    return estimate_benchmark_run(run.config, benchmark=run.benchmark, bench_cfg=run.bench_cfg, items=items,
                                  initial_skill=run.initial_skill, roles=run.clients.roles,
                                  prices=run.clients.ledger.prices).per_step


def budget_stop(run: Run, state: TrainState, where: str, *, projection: Totals | None = None) -> bool:
    """The budget guard before a step, an epoch boundary or the test evaluation (``where``): stop cleanly,
    saying why.

    The projection is ``projection``, else the next step's: the mean of the last three steps, else the
    dry-run estimate. A resumed run passes the guard for every step its earlier process recorded: the run
    took those steps within its budget then, and they are taken again from the cache (the spend the ledger
    holds already counts them, so stopping there would end the run short of what it had reached)."""
    if not run.config.budget.capped or run.dir.replays(state.step + 1):
        return False
    if projection is None:
        projection = projection_from_history(state.step_totals, state.step_estimate)
    verdict = check_budget(run.config.budget, run.clients.ledger.totals(), projection, where)
    if verdict.stop:
        state.stopped_by, state.stopped_message = "budget", verdict.message
        run.dir.write_text("STOPPED", verdict.message + "\n")
        progress.warning("%s", verdict.message)
    return verdict.stop


def rollout_projection(run: Run, items: int) -> Totals:
    """The expected spend of ``items`` rollouts: the mean spend of one item's rollout so far in this run
    (its target and judge calls, every turn), times ``items``."""
    per_item: dict[tuple[Any, ...], Totals] = {}
    for record in run.clients.ledger.records():
        tags = record.tags or {}
        if "item_id" in tags and not record.cache_hit:
            key = (tags["item_id"], tags.get("skill_sha"), tags.get("sample"), tags.get("training"))
            per_item.setdefault(key, Totals()).add(record)
    return Totals.mean(list(per_item.values())).times(items)


# --------------------------------------------------------------------------------------------
# Nightly promotion


def promote_if_better(run: Run, state: TrainState, registry: SkillRegistry,
                      incumbent: PromotedSkill | None) -> dict[str, Any]:
    """Promote the best skill only if it beats the skill the run started from on the selection split.

    That skill is the promoted one (the warm start) or, before anything was promoted, the initial
    skill; both were scored in this run's baseline, so the comparison is like for like. The decision
    goes to the registry history, ``promotion.json`` in the run directory and a Prefect artifact.
    """
    event = registry.decide(
        run.benchmark.id, candidate=state.best_skill, candidate_score=state.best_score,
        incumbent_sha=skill_hash(state.initial_skill), incumbent_score=gate_value(run, state.baseline),
        incumbent_version=incumbent.version if incumbent else None, metric=run.config.evaluation.gate_metric,
        source="nightly", run_name=run.run_name, run_dir=str(run.dir.path), carried=run.skill_source.carried,
    )
    run.dir.write_json("promotion.json", event)
    publish_promotion(run, event)
    progress.info("promotion: %s", event.reason)
    return event.model_dump(mode="json")
