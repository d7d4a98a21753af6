"""The ``skill-train`` flow: train a skill the way one trains a network (DESIGN.md §4, §5.2).

Read it top to bottom like a training script: set up the run, score the initial skill (baseline),
then for each epoch (a ``skill-epoch`` subflow) walk its seeded batches, one step each:

    rollout -> reflect -> aggregate -> select -> update -> gate -> record

and at the epoch boundary write the slow update and the optimizer's memory. Finally check the
last skill against the best, evaluate the initial and best skills on the test split and write
``summary.json``. Every model call is a cached task, so re-running the same command after a crash
resumes without repeating a finished call.
"""

from __future__ import annotations

import logging
import os
import random
import time
from functools import partial
from pathlib import Path
from typing import Any, Literal

from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, Field

from skillopt.appendix import with_execution_notes
from skillopt.config import load_config
from skillopt.gate import Scores, decide, gate_score
from skillopt.llm.roles import CliRoleOptions
from skillopt.llm.usage import Totals, check_budget, projection_from_history
from skillopt.merge import merge_groups
from skillopt.probe import probe_record
from skillopt.records import ItemResult, Patch, StepRecord
from skillopt.reflect import split_and_batch
from skillopt.registry import PromotedSkill, SkillRegistry
from skillopt.rewrite import rewrite_as_edits
from skillopt.schedule import EditBudgetSchedule
from skillopt.select import needs_ranking
from skillopt.skill import SLOW_UPDATE, inject_block, replace_block, skill_hash
from skillopt.slow_update import Pairs, pair_by_id, select_pairs
from skillopt.step_buffer import StepBuffer, StepBufferEntry, failure_patterns
from tasks.artifacts import (
    publish_cost,
    publish_progress,
    publish_promotion,
    publish_report_link,
    publish_step,
)
from tasks.context import RunContext, build_run_context
from tasks.epoch import meta_skill, plan_epoch_task, slow_update
from tasks.optimize import (
    apply_update,
    decide_budget_task,
    deep_probe,
    merge_patches,
    pick,
    rank_edits,
    reflect_minibatch,
    rewrite_skill,
    rewritten,
)
from tasks.rollout import Evaluation, PartialEvaluation, evaluate_skill

progress = logging.getLogger("skillopt.progress")

# --------------------------------------------------------------------------------------------
# State carried from step to step (all of it can be rebuilt from the cache on resume)


class TrainState(BaseModel):
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
    #: The id of the run's Prefect progress artifact, updated in place after each step.
    progress_artifact: str | None = None
    #: The dry-run estimate of one step's spend: the budget guard's projection until a step has finished.
    step_estimate: Totals | None = None


# --------------------------------------------------------------------------------------------
# The flow


def _flow_run_name() -> str:
    """``<bench>-lr<L>-<scheduler>-<yyyymmdd-hhmm>``, from the flow run's own parameters."""
    from prefect.runtime import flow_run

    from skillopt.errors import SkillOptError
    from skillopt.runs import flow_run_name

    parameters = flow_run.parameters
    try:
        loaded = load_config(parameters["benchmark"], config_file=parameters.get("config_file"),
                             overrides=parameters.get("overrides") or [], env=os.environ)
    except SkillOptError:
        return str(parameters.get("benchmark", "skill-train"))  # the flow itself reports the config error
    return flow_run_name(parameters["benchmark"], loaded.config)


@flow(name="skill-train", flow_run_name=_flow_run_name, task_runner=ThreadPoolTaskRunner(max_workers=16),
      log_prints=False)
def skill_train(benchmark: str, config_file: str | None = None, overrides: list[str] | None = None,
                run_name: str | None = None, cli_roles: dict[str, Any] | None = None,
                mode: Literal["train", "nightly"] = "train") -> dict[str, Any]:
    """Train a skill for ``benchmark``; returns the run summary (also written to ``summary.json``).

    In ``nightly`` mode the run warm-starts from the benchmark's promoted skill in the registry
    (``run.skills_dir``) and promotes its best skill only if it beats that one on the selection split.

    Args:
        benchmark: The benchmark to train on, e.g. searchqa (one of `skillopt benchmarks`).
        config_file: A YAML config file on the machine that runs the flow, merged over the benchmark's config.
        overrides: Config overrides applied in order, each `section.key=value`, e.g. optimizer.learning_rate=8.
        run_name: Name of the run directory under run.runs_dir; re-use a name to resume. Empty: a fresh name.
        cli_roles: Model choice for every role without its own setting, as the command line gives it, e.g.
            {"backend": "openai", "model": "gpt-4.1-mini"}.
        mode: train: start from the configured initial skill. nightly: warm-start from the promoted skill and
            promote the new best only if it beats it on the selection split.
    """
    loaded = load_config(benchmark, config_file=config_file, overrides=overrides or [], env=os.environ)
    registry = SkillRegistry(Path(loaded.config.run.skills_dir))
    incumbent = registry.current(benchmark) if mode == "nightly" else None
    ctx = build_run_context(loaded, run_name=run_name, cli=CliRoleOptions(**(cli_roles or {})),
                            initial_skill=incumbent.text if incumbent else None)
    cfg = ctx.config
    started = time.monotonic()
    progress.info("run directory: %s", ctx.run.path)

    if incumbent:
        progress.info("warm start from promoted version %d of %s", incumbent.version, benchmark)
    state = baseline(ctx)
    for epoch in range(1, cfg.train.epochs + 1):
        state = run_epoch(ctx, state, epoch)
        if state.stopped_by:
            break
    summary = finish(ctx, state, wall_s=time.monotonic() - started)
    if mode == "nightly":
        summary["promotion"] = promote_if_better(ctx, state, registry, incumbent)
    return summary


def baseline(ctx: RunContext) -> TrainState:
    """Score the initial skill on the selection split: it is both the current and the best skill."""
    cfg = ctx.config
    skill = ctx.initial_skill
    if cfg.optimizer.use_slow_update:
        skill = inject_block(skill, SLOW_UPDATE, "")  # empty: invisible to the target and to the hash
    evaluation = evaluate(ctx, skill, "val")
    score = _gate_value(ctx, evaluation.scores)
    ctx.run.write_skill_snapshot(0, skill)
    ctx.run.write_best_skill(skill)
    ctx.run.write_evaluation("baseline_selection", evaluation.rows, split="val", skill_sha=evaluation.skill_sha,
                             scores=evaluation.scores)
    steps_per_epoch = len(plan_epoch_task(ctx.split_ids["train"], cfg.train.seed, 1, cfg.train.batch_size,
                                          cfg.train.accumulation).steps)
    state = TrainState(initial_skill=skill, current_skill=skill, current_score=score, best_skill=skill, best_score=score,
                       total_steps=cfg.train.epochs * steps_per_epoch, baseline=evaluation.scores)
    if _has_budget(ctx):
        state.step_estimate = step_estimate(ctx)
    state.progress_artifact = publish_progress(ctx, state.step, state.total_steps, 0, cfg.train.epochs,
                                               state.current_score, state.best_score)
    progress.info("baseline on the selection split: %.3f (%d items); %d steps to go", score,
                  len(evaluation.rows), state.total_steps)
    return state


def run_epoch(ctx: RunContext, state: TrainState, epoch: int) -> TrainState:
    """The ``skill-epoch`` subflow without flow-run heartbeats (the top-level flow keeps them): a sync subflow
    waits up to 1 s for its heartbeat thread to stop, which held the first step of every epoch after the first."""
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        return skill_epoch(ctx, state, epoch)


@flow(name="skill-epoch", flow_run_name="epoch-{epoch}", validate_parameters=False)
def skill_epoch(ctx: Any, state: TrainState, epoch: int) -> TrainState:
    """One pass over the train split, then the epoch boundary.

    ``ctx`` is the run's ``RunContext`` (typed ``Any``: Prefect builds a parameter schema from the
    annotations, and the context holds clients and locks that have none).
    """
    cfg = ctx.config
    schedule = EditBudgetSchedule.from_config(cfg.optimizer.lr_scheduler, cfg.optimizer.learning_rate,
                                              cfg.optimizer.min_learning_rate, state.total_steps)
    plan = plan_epoch_task(ctx.split_ids["train"], cfg.train.seed, epoch, cfg.train.batch_size,
                           cfg.train.accumulation)
    epoch_start_skill = state.current_skill
    buffer = StepBuffer()  # memory of this epoch only
    for step_plan in plan.steps:
        if _budget_stop(ctx, state, f"epoch {epoch} step {step_plan.index + 1}"):
            return state
        state.step += 1
        before = state.current_skill
        record = train_step(ctx, state, buffer, epoch=epoch, step_in_epoch=step_plan.index + 1,
                            batches=[(b.seed, b.item_ids) for b in step_plan.batches],
                            budget=schedule.budget(state.step))
        state.history.append(record)
        ctx.run.record_step(record)
        ctx.run.write_skill_snapshot(state.step, state.current_skill)
        progress.info("epoch %d step %d/%d (budget %d): %d/%d failed, %d edits proposed, %d selected -> %s; "
                      "current %.3f, best %.3f", epoch, state.step, state.total_steps, record.budget, record.n_fail,
                      record.n_total, record.edits_proposed, record.edits_selected, record.decision,
                      state.current_score, state.best_score)
        publish_step(ctx, record, state.history, previous_skill=before, current_skill=state.current_skill)
        state.progress_artifact = publish_progress(ctx, state.step, state.total_steps, epoch, cfg.train.epochs,
                                                   state.current_score, state.best_score, state.progress_artifact)
        publish_cost(ctx)
    state.epoch_last_skills.append(state.current_skill)
    if epoch >= 2 and not _budget_stop(ctx, state, f"the epoch {epoch} boundary"):
        epoch_boundary(ctx, state, epoch, epoch_start_skill)
    return state


# --------------------------------------------------------------------------------------------
# One step


def train_step(ctx: RunContext, state: TrainState, buffer: StepBuffer, *, epoch: int, step_in_epoch: int,
               batches: list[tuple[int, list[str]]], budget: int) -> StepRecord:
    cfg = ctx.config
    mode = cfg.optimizer.skill_update_mode
    timer = _Timer()
    mark = ctx.clients.ledger.mark()
    skill = state.current_skill

    # 1. Rollout, 2. Reflect — for each batch of the step (more than one with accumulation).
    rows: list[ItemResult] = []
    failure_patches: list[Patch] = []
    success_patches: list[Patch] = []
    probes = []
    for seed, item_ids in batches:
        with timer("rollout"):
            batch_rows = evaluate(ctx, skill, "train", item_ids, training=True).rows
        rows.extend(batch_rows)
        with timer("reflect"):
            f, s = reflect(ctx, skill, batch_rows, seed=seed, budget=budget, buffer=buffer.format(),
                           meta_skill=state.meta_memory)
            if cfg.gradient.deep_probe:  # diagnostic re-runs become extra minibatches
                probe = ctx.bind(deep_probe)(ctx, skill, batch_rows, buffer.format(), state.meta_memory)
                probes.append(probe)
                pf, ps = reflect(ctx, skill, probe.rows, seed=seed + 1_000_003, budget=budget,
                                 buffer=buffer.format(), meta_skill=state.meta_memory)
                f, s = f + pf, s + ps
        failure_patches += f
        success_patches += s
    n_fail = sum(r.failed for r in rows)
    record = StepRecord(step=state.step, epoch=epoch, step_in_epoch=step_in_epoch, budget=budget, decision="",
                        batch_ids=[r.id for r in rows], n_fail=n_fail, n_total=len(rows),
                        rollout_hard=sum(r.hard for r in rows) / len(rows),
                        rollout_soft=sum(r.soft for r in rows) / len(rows),
                        patches_proposed=len(failure_patches) + len(success_patches),
                        patches_parsed=sum(p.fallback is None for p in failure_patches + success_patches))
    if probes:
        record.probe = probe_record(probes[0].instruction, [r for p in probes for r in p.rows],
                                    fallback=next((p.fallback for p in probes if p.fallback), None))
    ctx.run.write_json(f"steps/{state.step:04d}/patches.json", {"failure": failure_patches,
                                                                "success": success_patches})
    ctx.run.write_jsonl(f"steps/{state.step:04d}/trajectories.jsonl", rows)
    finish = partial(_finish_step, ctx, state, buffer, record, rows=rows, failure_patches=failure_patches,
                     timer=timer, mark=mark)

    # 3. Aggregate: merge the failure and success trees, then one final merge (failures first).
    with timer("merge"):
        merged = aggregate(ctx, skill, failure_patches, success_patches, meta_skill=state.meta_memory)
    record.warnings += [p.fallback for p in failure_patches + success_patches + [merged] if p.fallback]
    ctx.run.write_json(f"steps/{state.step:04d}/merged.json", merged)

    # 4. Select (gradient clipping) and 5. Update, as the update mode does them.
    if mode == "full_rewrite_minibatch":  # each analyst wrote a whole skill; no budget, no ranking
        if not merged.skill:
            return finish("skip_no_rewrite")
        update = rewritten(skill, merged.skill, [merged.reasoning] if merged.reasoning else [])
    else:
        pool = merged.edits if mode == "patch" else merged.suggestions
        record.edits_proposed = len(pool)
        if not pool:
            return finish("skip_no_patches")
        if cfg.optimizer.lr_control_mode == "autonomous":
            decision = ctx.bind(decide_budget_task)(ctx, skill, _step_scores(state, record), pool, len(pool),
                                                    buffer.format(), state.meta_memory)
            budget = decision["learning_rate"]
            record.budget_decision, record.budget = decision, budget
        with timer("ranking"):
            if needs_ranking(pool, budget):
                picked = ctx.bind(rank_edits)(ctx, skill, pool, budget, state.meta_memory)
            else:
                picked = pick(pool, budget, None)
        record.edits_selected = picked.count
        record.edits = picked.edits
        if picked.fallback:
            record.warnings.append(picked.fallback)
        ctx.run.write_json(f"steps/{state.step:04d}/selection.json", picked)
        if not picked.count:
            return finish("skip_zero_budget")
        if mode == "patch":
            update = ctx.bind(apply_update)(skill, picked.edits)
        else:
            with timer("rewrite"):
                reply = ctx.bind(rewrite_skill)(ctx, skill, picked.suggestions, buffer.format(), state.meta_memory)
            if reply is None or not reply.new_skill.strip():
                return finish("skip_no_rewrite")
            update = rewritten(skill, reply.new_skill, reply.change_summary)
    record.apply_report = update.report
    record.edits_applied = update.report.n_applied if update.report else 0
    record.change_summary, record.protected_restored = update.change_summary, update.protected_restored
    if update.protected_restored:
        record.warnings.append("the rewrite lost or changed a protected block; it was restored")
    # What the step buffer shows as this step's idea if it is rejected.
    proposed = list(record.edits) if mode == "patch" else rewrite_as_edits(skill, update.candidate)
    if skill_hash(update.candidate) == skill_hash(skill):
        return finish("skip_identical", rejected=proposed)

    # 6. Gate on the selection split (an identical skill is never re-run: evaluations are cached by hash).
    with timer("gate"):
        gate = gate_candidate(ctx, state, update.candidate)
    record.gate = gate
    ctx.run.write_json(f"steps/{state.step:04d}/gate.json", gate)
    if gate.decision != "reject":
        accept(ctx, state, update.candidate, gate.candidate_gate, new_best=gate.new_best)
        return finish(gate.decision)
    return finish("reject", rejected=proposed, scores=(gate.current_gate, gate.candidate_gate))


def _step_scores(state: TrainState, record: StepRecord) -> dict[str, Any]:
    return {"current_score": state.current_score, "best_score": state.best_score,
            "rollout_hard": record.rollout_hard, "rollout_soft": record.rollout_soft, "n_fail": record.n_fail,
            "n_total": record.n_total}


def reflect(ctx: RunContext, skill: str, rows: list[ItemResult], *, seed: int, budget: int, buffer: str,
            meta_skill: str) -> tuple[list[Patch], list[Patch]]:
    """One analyst call per minibatch of failures and of successes, at most ``gradient.analyst_workers`` at once."""
    cfg = ctx.config
    failures, successes = split_and_batch(rows, size=cfg.gradient.minibatch_size, seed=seed,
                                          failure_only=cfg.gradient.failure_only)
    task = ctx.bind(reflect_minibatch)
    with ThreadPoolTaskRunner(max_workers=cfg.gradient.analyst_workers) as runner:
        futures = [(kind, runner.submit(task, {"ctx": ctx, "kind": kind, "skill": skill, "rows": batch,
                                               "budget": budget, "step_buffer": buffer, "meta_skill": meta_skill}))
                   for kind, groups in (("failure", failures), ("success", successes)) for batch in groups]
        patches = [(kind, future.result()) for kind, future in futures]
    return [p for k, p in patches if k == "failure"], [p for k, p in patches if k == "success"]


def aggregate(ctx: RunContext, skill: str, failures: list[Patch], successes: list[Patch], *,
              meta_skill: str) -> Patch:
    """Hierarchical merge of each tree, then the final merge that gives failure-driven edits priority."""
    merged = merge_trees(ctx, skill, {"failure": failures, "success": successes}, meta_skill=meta_skill)
    trees = [t for t in merged.values() if _has_content(t)]
    if not trees:
        return Patch(reasoning="no edits proposed")
    if len(trees) == 1:
        return trees[0]
    return ctx.bind(merge_patches)(ctx, "final", skill, trees, max(t.merge_level for t in trees) + 1, meta_skill)


def merge_tree(ctx: RunContext, kind: str, skill: str, patches: list[Patch], *, meta_skill: str) -> Patch:
    """Merge groups of ``merge_batch_size`` level by level until one patch is left."""
    return merge_trees(ctx, skill, {kind: patches}, meta_skill=meta_skill)[kind]


def merge_trees(ctx: RunContext, skill: str, trees: dict[str, list[Patch]], *, meta_skill: str) -> dict[str, Patch]:
    """Merge each non-empty tree (kind -> patches) level by level until one patch is left, the trees side by side:
    every merge call of a level is submitted, for all trees, before waiting for any."""
    pending = {kind: [p for p in patches if _has_content(p)] or patches[:1]  # nothing to merge in empty patches
               for kind, patches in trees.items() if patches}
    level = 0
    task = ctx.bind(merge_patches)
    while any(len(patches) > 1 for patches in pending.values()):
        level += 1
        futures = {
            kind: [task.submit(ctx, kind, skill, g, level, meta_skill) if len(g) > 1 else g[0]
                   for g in merge_groups(patches, ctx.config.gradient.merge_batch_size)]
            for kind, patches in pending.items() if len(patches) > 1
        }
        for kind, level_futures in futures.items():
            pending[kind] = [f if isinstance(f, Patch) else f.result() for f in level_futures]
    return {kind: patches[0] for kind, patches in pending.items()}


def _has_content(patch: Patch) -> bool:
    return bool(patch.edits or patch.suggestions or (patch.skill or "").strip())


def gate_candidate(ctx: RunContext, state: TrainState, candidate: str) -> Any:
    cfg = ctx.config.evaluation
    current = evaluate(ctx, state.current_skill, "val")
    proposed = evaluate(ctx, candidate, "val")
    return decide(proposed.rows, current.rows, current_score=state.current_score, best_score=state.best_score,
                  metric=cfg.gate_metric, mixed_weight=cfg.gate_mixed_weight, use_gate=cfg.use_gate,
                  test=cfg.gate_test, alpha=cfg.gate_alpha, seed=ctx.config.train.seed + state.step)


def accept(ctx: RunContext, state: TrainState, candidate: str, score: float, *, new_best: bool) -> None:
    state.current_skill, state.current_score = candidate, score
    if new_best:
        state.best_skill, state.best_score, state.best_step = candidate, score, state.step
        ctx.run.write_best_skill(candidate)


def _finish_step(ctx: RunContext, state: TrainState, buffer: StepBuffer, record: StepRecord, decision: str, *,
                 rows: list[ItemResult], failure_patches: list[Patch], timer: Any, mark: int,
                 rejected: list | None = None, scores: tuple[float, float] | None = None) -> StepRecord:
    record.decision = decision
    if ctx.config.optimizer.use_appendix:
        add_execution_notes(ctx, state, record, failure_patches)
    record.current_score, record.best_score = state.current_score, state.best_score
    record.skill_sha, record.skill_chars = skill_hash(state.current_skill), len(state.current_skill)
    record.usage = ctx.clients.ledger.summary(since=mark)["total"]
    state.step_totals.append(ctx.clients.ledger.totals(since=mark))
    record.wall_s = dict(timer.seconds)
    diagnoses = [d for p in failure_patches for d in p.diagnosis]
    buffer.add(StepBufferEntry(
        step=state.step, decision=decision, n_fail=record.n_fail, n_total=record.n_total,
        failure_patterns=failure_patterns(rows, diagnoses), rejected_edits=rejected or [],
        score_before=scores[0] if scores else None, score_after=scores[1] if scores else None,
    ))
    return record


def add_execution_notes(ctx: RunContext, state: TrainState, record: StepRecord, patches: list[Patch]) -> None:
    """After the gate: "the rule exists but was not followed" reminders go into the appendix block.

    The current skill changes, so it is re-scored (cached by hash) and later gates compare against
    its true score; the best skill stays a validated snapshot.
    """
    notes = [note for patch in patches for note in patch.execution_notes if note.strip()]
    if not notes:
        return
    updated = with_execution_notes(state.current_skill, notes)
    if skill_hash(updated) == skill_hash(state.current_skill):
        return
    state.current_skill = updated
    state.current_score = _gate_value(ctx, evaluate(ctx, updated, "val").scores)
    record.appendix_notes = notes


# --------------------------------------------------------------------------------------------
# Epoch boundary


def epoch_boundary(ctx: RunContext, state: TrainState, epoch: int, epoch_start_skill: str) -> None:
    """Slow update (new guidance for the target) and meta skill (memory for the optimizer)."""
    cfg = ctx.config
    if not (cfg.optimizer.use_slow_update or cfg.optimizer.use_meta_skill):
        return
    pairs = longitudinal_pairs(ctx, epoch, epoch_start_skill, state.current_skill)
    ctx.run.write_json(f"epochs/{epoch:02d}/pairs.json", pairs)

    if cfg.optimizer.use_meta_skill and len(state.epoch_last_skills) >= 2:
        reply = ctx.bind(meta_skill)(ctx, state.epoch_last_skills[-2], state.epoch_last_skills[-1],
                                     state.meta_memory, pairs)
        if reply is not None:
            state.meta_memory = reply.memory
        ctx.run.write_json(f"epochs/{epoch:02d}/meta_skill.json", {"reply": reply, "memory": state.meta_memory})

    if cfg.optimizer.use_slow_update:
        reply = ctx.bind(slow_update)(ctx, epoch_start_skill, state.current_skill, state.guidance, pairs)
        ctx.run.write_json(f"epochs/{epoch:02d}/slow_update.json", {"reply": reply})
        if reply is None or not reply.guidance.strip():
            return
        candidate = replace_block(state.current_skill, SLOW_UPDATE, reply.guidance)
        state.guidance = reply.guidance
        record = StepRecord(step=state.step, epoch=epoch, step_in_epoch=0, budget=0, kind="slow_update",
                            decision="")
        if cfg.optimizer.slow_update_gate:
            gate = gate_candidate(ctx, state, candidate)
            record.gate, record.decision = gate, gate.decision
            if gate.decision != "reject":
                accept(ctx, state, candidate, gate.candidate_gate, new_best=gate.new_best)
        else:
            # The current skill changes; the best stays a validated snapshot. Re-score so later gates
            # compare against a true score.
            state.current_skill = candidate
            state.current_score = _gate_value(ctx, evaluate(ctx, candidate, "val").scores)
            record.decision = "slow_update"
        progress.info("epoch %d boundary: slow update -> %s; current %.3f, best %.3f", epoch, record.decision,
                      state.current_score, state.best_score)
        record.current_score, record.best_score = state.current_score, state.best_score
        record.skill_sha, record.skill_chars = skill_hash(state.current_skill), len(state.current_skill)
        state.history.append(record)
        ctx.run.record_step(record)


def longitudinal_pairs(ctx: RunContext, epoch: int, before_skill: str, after_skill: str) -> Pairs:
    """The same train items under both skills, paired by id and filtered by the pair policy.

    ``slow_update_samples`` items are drawn with seed ``seed + 2000*epoch``; with the ``changed`` or
    ``unchanged`` policy, more train items (the next ones in the same seeded order, both skills rolled
    out in parallel) top the selection up until it has that many pairs or the split runs out.
    """
    cfg = ctx.config
    train_ids = sorted(ctx.split_ids["train"])
    order = random.Random(cfg.train.seed + 2000 * epoch).sample(train_ids, len(train_ids))
    wanted = min(cfg.optimizer.slow_update_samples, len(order))
    policy = cfg.optimizer.longitudinal_pair_policy
    pairs, taken = Pairs(), 0
    while taken < len(order):
        chunk = order[taken:taken + wanted]
        taken += len(chunk)
        before, after = evaluate_many(ctx, [(before_skill, "train", chunk), (after_skill, "train", chunk)],
                                      training=True)
        found = select_pairs(pair_by_id(before.rows, after.rows), policy)
        pairs = Pairs(**{group: [*getattr(pairs, group), *getattr(found, group)] for group in Pairs.model_fields})
        if policy == "mixed" or sum(len(getattr(pairs, g)) for g in Pairs.model_fields) >= wanted:
            break
    return pairs


# --------------------------------------------------------------------------------------------
# Final evaluation


def finish(ctx: RunContext, state: TrainState, *, wall_s: float) -> dict[str, Any]:
    """Promote the last skill if it beats the best, evaluate on test, write ``summary.json``."""
    from skillopt.report import write_report
    from skillopt.runs import build_summary, summary_dict

    cfg = ctx.config
    final_selection = evaluate(ctx, state.current_skill, "val")
    if skill_hash(state.current_skill) != skill_hash(state.best_skill):
        final_score = _gate_value(ctx, final_selection.scores)
        if final_score > state.best_score:
            state.best_skill, state.best_score, state.best_step = state.current_skill, final_score, state.step
            ctx.run.write_best_skill(state.best_skill)
    ctx.run.write_evaluation("final_selection", final_selection.rows, split="val",
                             skill_sha=final_selection.skill_sha, scores=final_selection.scores)
    best_selection = evaluate(ctx, state.best_skill, "val")
    tests: dict[str, Evaluation] = {}
    if cfg.evaluation.eval_test and state.stopped_by == "budget":
        # The selection checks above are cached gate results; the test split would be new spend past the cap.
        progress.warning("stopped by budget: the test evaluation is skipped; score the best skill later with "
                         "`skillopt eval %s --skill %s`", ctx.benchmark.id, ctx.run.best_skill_path)
    elif cfg.evaluation.eval_test:
        for name, skill in (("baseline", state.initial_skill), ("best", state.best_skill)):
            tests[name] = evaluate(ctx, skill, "test")
            ctx.run.write_evaluation(f"{name}_test", tests[name].rows, split="test", skill_sha=tests[name].skill_sha,
                                     scores=tests[name].scores)
    summary = build_summary(
        run_name=ctx.run_name, benchmark=ctx.benchmark.id, baseline_selection=state.baseline,
        baseline_test=tests["baseline"].scores if tests else None, best_selection=best_selection.scores,
        best_test=tests["best"].scores if tests else None, final_selection=final_selection.scores,
        history=state.history, usage=ctx.clients.ledger.summary(), wall_s=wall_s, stopped_by=state.stopped_by,
        stopped_message=state.stopped_message, best_skill_sha=skill_hash(state.best_skill), config=ctx.loaded.config,
    )
    ctx.run.write_summary(summary)
    progress.info("wrote %s", ctx.run.summary_path)
    publish_cost(ctx)
    report = write_report(ctx.run.path)
    publish_report_link(ctx, report)
    progress.info("report: %s", report)
    return {**summary_dict(summary), "run_dir": str(ctx.run.path)}


# --------------------------------------------------------------------------------------------
# Nightly promotion


def promote_if_better(ctx: RunContext, state: TrainState, registry: SkillRegistry,
                      incumbent: PromotedSkill | None) -> dict[str, Any]:
    """Promote the best skill only if it beats the skill the run started from on the selection split.

    That skill is the promoted one (the warm start) or, before anything was promoted, the initial
    skill; both were scored in this run's baseline, so the comparison is like for like. The decision
    goes to the registry history, ``promotion.json`` in the run directory and a Prefect artifact.
    """
    event = registry.decide(
        ctx.benchmark.id, candidate=state.best_skill, candidate_score=state.best_score,
        incumbent_sha=skill_hash(state.initial_skill), incumbent_score=_gate_value(ctx, state.baseline),
        incumbent_version=incumbent.version if incumbent else None, metric=ctx.config.evaluation.gate_metric,
        source="nightly", run_name=ctx.run_name, run_dir=str(ctx.run.path),
    )
    ctx.run.write_json("promotion.json", event)
    publish_promotion(ctx, event)
    progress.info("promotion: %s", event.reason)
    return event.model_dump(mode="json")


# --------------------------------------------------------------------------------------------
# Helpers


def evaluate(ctx: RunContext, skill: str, split: str, item_ids: list[str] | None = None, *,
             training: bool = False) -> Evaluation:
    """Scores of ``skill`` on a split (the selection split honours ``evaluation.sel_size``)."""
    if item_ids is None:
        item_ids = ctx.split_ids[split]
        size = {"val": ctx.config.evaluation.sel_size, "test": ctx.config.evaluation.test_size}.get(split, 0)
        if size:
            item_ids = item_ids[:size]
    try:
        return ctx.bind(evaluate_skill)(ctx, skill, split, list(item_ids), training=training)
    except PartialEvaluation as partial:
        return partial.evaluation


def evaluate_many(ctx: RunContext, jobs: list[tuple[str, str, list[str]]], *, training: bool = False
                  ) -> list[Evaluation]:
    """Several evaluations at once, in parallel: ``(skill, split, item_ids)`` each, results in order."""
    task = ctx.bind(evaluate_skill)
    futures = [task.submit(ctx, skill, split, list(ids), training=training) for skill, split, ids in jobs]
    results = []
    for future in futures:
        try:
            results.append(future.result())
        except PartialEvaluation as partial:
            results.append(partial.evaluation)
    return results


def _gate_value(ctx: RunContext, scores: Scores) -> float:
    cfg = ctx.config.evaluation
    return gate_score(scores.hard, scores.soft, cfg.gate_metric, cfg.gate_mixed_weight)


def _has_budget(ctx: RunContext) -> bool:
    budget = ctx.config.budget
    return not (budget.max_usd is None and budget.max_tokens is None and budget.max_calls is None)


def step_estimate(ctx: RunContext) -> Totals:
    """The dry-run estimate of one step's spend (``skillopt.estimate``), from this run's data and roles."""
    from skillopt.estimate import estimate_benchmark_run

    items = {split: ctx.rows_of(ids) for split, ids in ctx.split_ids.items()}
    return estimate_benchmark_run(ctx.config, benchmark=ctx.benchmark, bench_cfg=ctx.bench_cfg, items=items,
                                  initial_skill=ctx.initial_skill, roles=ctx.clients.roles,
                                  prices=ctx.clients.ledger.prices).per_step


def _budget_stop(ctx: RunContext, state: TrainState, where: str) -> bool:
    """The budget guard before a step or an epoch boundary (``where``): stop cleanly, saying why.

    The projection of the next step is the mean of the last three steps, else the dry-run estimate."""
    if not _has_budget(ctx):
        return False
    verdict = check_budget(ctx.config.budget, ctx.clients.ledger.totals(),
                           projection_from_history(state.step_totals, state.step_estimate), where)
    if verdict.stop:
        state.stopped_by, state.stopped_message = "budget", verdict.message
        ctx.run.write_text("STOPPED", verdict.message + "\n")
        progress.warning("%s", verdict.message)
    return verdict.stop


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, stage: str) -> Any:
        timer = self

        class _Span:
            def __enter__(self) -> None:
                self.start = time.monotonic()

            def __exit__(self, *exc: object) -> None:
                timer.seconds[stage] = timer.seconds.get(stage, 0.0) + time.monotonic() - self.start

        return _Span()
