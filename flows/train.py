"""The ``skill-train`` flow: train a skill the way one trains a network.

Read it top to bottom like a training script: set up the run, score the initial skill (baseline),
then for each epoch (a ``skill-epoch`` subflow) walk its seeded batches, one step each:

    rollout -> reflect -> aggregate -> select -> update -> gate -> record

and at the epoch boundary write the slow update and the optimizer's memory. Finally check the
last skill against the best, evaluate the initial and best skills on the test split and write
``summary.json``. Every model call is a cached task, so re-running the same command after a crash
resumes without repeating a finished call. The stages are one call away, in ``flows/stages.py``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prefect import flow
from prefect.runtime import deployment, flow_run
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.task_runners import ThreadPoolTaskRunner

from skillopt.core import live
from skillopt.core.config import load_config
from skillopt.core.data import StepPlan
from skillopt.core.errors import SkillOptError
from skillopt.core.records import (
    ItemResult,
    Patch,
    StepRecord,
    counted,
    unusable_replies_warning,
    unusable_streak,
)
from skillopt.flows.front import choose_final, start_from_front
from skillopt.flows.naming import config_overrides, train_run_name
from skillopt.flows.parameters import named_overrides, role_options
from skillopt.flows.run import PROGRESS_LOGGER, api_unreachable, wait_for_api
from skillopt.flows.stages import (
    Evidence,
    GateSkipped,
    StepOutcome,
    StepTimer,
    TrainState,
    accept,
    add_execution_notes,
    aggregate,
    autonomous_budget,
    budget_stop,
    build_candidate,
    by_kind,
    gate_candidate,
    gate_value,
    longitudinal_pairs,
    promote_if_better,
    reflect,
    reflect_jobs,
    rescore,
    rollout_projection,
    select,
    step_estimate,
    step_record,
)
from skillopt.flows.story import STORY_LOGGER, run_story
from skillopt.llm.errors import BudgetExceeded
from skillopt.llm.roles import CliRoleOptions
from skillopt.llm.usage import Totals
from skillopt.optimizer.probe import probe_record
from skillopt.optimizer.schedule import EditBudgetSchedule
from skillopt.optimizer.step_buffer import StepBuffer, StepBufferEntry, failure_patterns
from skillopt.optimizer.update_modes import Picked
from skillopt.run.assembly import Run, RunSpec
from skillopt.run.registry import SkillRegistry
from skillopt.run.rollouts import Draws, first_batch
from skillopt.run.run_checks import check_run
from skillopt.skill.diff import file_diffs
from skillopt.skill.document import SLOW_UPDATE, replace_block, skill_hash
from skillopt.skill.folder import load_skill
from skillopt.tasks.artifacts import (
    publish_cost,
    publish_progress,
    publish_report_link,
    publish_step,
    published,
)
from skillopt.tasks.cache import bound
from skillopt.tasks.epoch import meta_skill, slow_update
from skillopt.tasks.optimize import deep_probe, merge_patches, reflect_minibatch
from skillopt.tasks.rollout import Evaluation, evaluate, evaluate_many
from skillopt.tasks.run import started_run
from skillopt.tasks.stale_runs import record_sub_flow_run

if TYPE_CHECKING:
    from skillopt.run.runs import RunSummary

progress = logging.getLogger(PROGRESS_LOGGER)
story = logging.getLogger(STORY_LOGGER)


# Prefect types flow(task_runner=) as TaskRunner[PrefectFuture], which its own thread-pool runner
# (a TaskRunner[PrefectConcurrentFuture]) does not match under an invariant type parameter.
@flow(name="skill-train", flow_run_name=train_run_name,
      task_runner=ThreadPoolTaskRunner(max_workers=16), log_prints=False)  # type: ignore[arg-type]
def skill_train(benchmark: str, data: str | None = None, epochs: int | None = None,
                batch_size: int | None = None, learning_rate: int | None = None, skill: str | None = None,
                backend: str | None = None, model: str | None = None,
                target_backend: str | None = None, target_model: str | None = None,
                optimizer_backend: str | None = None, optimizer_model: str | None = None,
                judge_backend: str | None = None, judge_model: str | None = None,
                overrides: list[str] | None = None, config_file: str | None = None,
                run_name: str | None = None,
                mode: Literal["train", "nightly"] = "train", verbose: bool = False,
                cli_roles: CliRoleOptions | None = None) -> dict[str, Any]:
    """Train a skill for ``benchmark``; returns the run summary (also written to ``summary.json``).

    In ``nightly`` mode the run warm-starts from the benchmark's promoted skill in the registry
    (``run.skills_dir``) and promotes its best skill only if it beats that one on the selection split.
    Empty fields keep what the benchmark's config says.

    Args:
        benchmark: The benchmark to train on, e.g. searchqa (one of `skillopt benchmarks`).
        data: The benchmark's data on the machine that runs the flow: a folder holding train/, val/ and test/
            (also the root of the images and files the items name) or one data file, split by
            benchmark.split_ratio. Empty: the data named in the benchmark's config.
        epochs: Passes over the training split, e.g. 1 for a quick run.
        batch_size: Training items per step.
        learning_rate: At most this many edits to the skill per step (the edit budget).
        skill: The skill to start from, on the machine that runs the flow: an Agent Skills folder (SKILL.md,
            references/, ...) or a markdown file (train.skill_init). Empty: the config's. A nightly run
            warm-starts from the promoted skill instead once one exists.
        backend: Model backend for every role without its own, e.g. openai, anthropic, openai_compatible,
            local or scripted (offline, for the shipped fixtures).
        model: Model for every role without its own, e.g. gpt-4.1-mini.
        target_backend: Backend of the target model, the one the skill is written for.
        target_model: Model of the target.
        optimizer_backend: Backend of the optimizer model, which reads the rollouts and proposes edits.
        optimizer_model: Model of the optimizer.
        judge_backend: Backend of the judge model, for benchmarks graded by a judge.
        judge_model: Model of the judge.
        overrides: Any other setting, each `section.key=value`, e.g. optimizer.lr_scheduler=linear
            (see `skillopt config show BENCHMARK`). The named fields above win over these.
        config_file: A YAML config file on the machine that runs the flow, merged over the benchmark's config.
        run_name: Name of the run directory under run.runs_dir; re-use a name to resume. Empty: a fresh name.
        mode: train: start from the configured initial skill. nightly: warm-start from the promoted skill and
            promote the new best only if it beats it on the selection split.
        verbose: Also log Prefect's line for every task run ("Finished in state Completed()").
        cli_roles: Reasoning effort per role, e.g. {"effort": {"optimizer": "high"}}, and the role choices
            above as one object, as `skillopt train` passes them; the named fields win.
    """
    named = {"epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate, "skill": skill,
             "backend": backend, "model": model,
             "target_backend": target_backend, "target_model": target_model,
             "optimizer_backend": optimizer_backend, "optimizer_model": optimizer_model,
             "judge_backend": judge_backend, "judge_model": judge_model}
    all_overrides = [*(overrides or []), *named_overrides(named)]
    roles = role_options(named, asdict(cli_roles) if cli_roles else None)
    with run_story(verbose=verbose):
        if deployment.id is not None:
            # A deployment run had no command line to check its input: the same checks, before any rollout
            # (credentials by presence: the run's own clients are the ones that reach the endpoints).
            check_run(load_config(benchmark, config_file=config_file,
                                  overrides=config_overrides(data, all_overrides), env=os.environ,
                                  cli_roles=roles),
                      cli=CliRoleOptions(**roles), env=os.environ, probe=False)
        return train(benchmark, data=data, config_file=config_file, overrides=all_overrides,
                     run_name=run_name or flow_run.name, cli_roles=CliRoleOptions(**roles) if roles else None,
                     mode=mode)


def train(
    benchmark: str,
    *,
    data: str | None,
    config_file: str | None,
    overrides: list[str] | None,
    run_name: str | None,
    cli_roles: CliRoleOptions | None,
    mode: Literal["train", "nightly"],
) -> dict[str, Any]:
    """The body of ``skill-train``: set up the run, baseline, epochs, final evaluation (and the promotion)."""
    loaded = load_config(benchmark, config_file=config_file, overrides=config_overrides(data, overrides),
                         env=os.environ, cli_roles=asdict(cli_roles) if cli_roles else None)
    registry = SkillRegistry(Path(loaded.config.run.skills_dir))
    incumbent = registry.current(benchmark) if mode == "nightly" else None
    spec = RunSpec.create(loaded, cli_roles=asdict(cli_roles) if cli_roles else None, run_name=run_name,
                          initial_skill=incumbent.text if incumbent else None)
    with started_run(spec, loaded=loaded) as run, published(run):
        started = time.monotonic()
        progress.info("run directory: %s", run.dir.path)
        if incumbent:
            progress.info("warm start from promoted version %d of %s", incumbent.version, benchmark)
            if incumbent.folder:  # the promoted folder's untrained files (binaries, scripts/) come along
                promoted = load_skill(Path(incumbent.folder), max_file_bytes=run.config.skill.max_file_bytes,
                                      train_scripts=run.config.skill.train_scripts)
                run.skill_source = replace(run.skill_source, carried=promoted.carried)

        try:
            state = baseline(run)
        except BudgetExceeded as error:  # the in-flight hard cap, before the starting skill was scored
            return baseline_budget_stop(run, error, wall_s=time.monotonic() - started)
        try:
            for epoch in range(1, run.config.train.epochs + 1):
                state = run_epoch(run, state, epoch)
                if state.stopped_by:
                    break
        except BudgetExceeded as error:  # the in-flight hard cap, inside a step the guard had let start
            hard_budget_stop(run, state, error, epoch)
        if run.config.train.selection == "pareto":
            choose_final(run, state)
        summary = finish(run, state, wall_s=time.monotonic() - started)
        if mode == "nightly":
            summary["promotion"] = promote_if_better(run, state, registry, incumbent)
    return summary


def hard_budget_stop(run: Run, state: TrainState, error: BudgetExceeded, epoch: int) -> None:
    """End the run as a budget stop after a call was refused at the hard cap: the step it was in is left
    unrecorded (its finished calls are cached) and the run ends on its best skill (the final check of another
    skill could need calls, and every call is refused now)."""
    state.current_skill, state.current_score = state.best_skill, state.best_score
    message = (f"budget: {error.reason}; stopped in epoch {epoch} step {state.step}/{state.total_steps}, "
               f"which is not recorded; {error.hint or 'raise the cap and resume'}")
    state.stopped_by, state.stopped_message = "budget", message
    run.dir.write_text("STOPPED", message + "\n")
    progress.warning("%s", message)


def baseline_budget_stop(run: Run, error: BudgetExceeded, *, wall_s: float) -> dict[str, Any]:
    """End the run as a budget stop after a call of the baseline evaluation was refused at the hard cap, as
    ``hard_budget_stop`` ends one inside a step: ``STOPPED`` and ``summary.json`` say why, the best skill is
    the starting skill, and a resume with a raised cap takes the finished calls from the cache. Nothing was
    scored, so the summary has no scores, nothing is evaluated on test and a nightly run decides nothing."""
    from skillopt.run.runs import build_summary

    message = (f"budget: {error.reason}; stopped in the baseline evaluation, which is not recorded; "
               f"{error.hint or 'raise the cap and resume'}")
    write_starting_skill(run, run.starting_skill())
    run.dir.write_text("STOPPED", message + "\n")
    progress.warning("%s", message)
    summary = build_summary(
        run_name=run.run_name, benchmark=run.benchmark.id, baseline_selection=None, best_selection=None,
        final_selection=None, usage=run.clients.ledger.summary(), wall_s=wall_s, stopped_by="budget",
        stopped_message=message, best_skill_sha=skill_hash(run.starting_skill()), config=run.recorded_config,
        context_windows=run.clients.windows.learned())
    run.dir.write_summary(summary)
    return end_of_run(run, summary)


def write_starting_skill(run: Run, skill: str) -> None:
    """The starting skill as step 0's snapshot and as the best skill so far, with what an export needs."""
    run.dir.write_skill_snapshot(0, skill)
    run.dir.write_best_skill(skill)
    source = run.skill_source
    run.dir.write_skill_source(
        name=source.name, front_matter=source.front_matter, carried=source.carried,
        description=source.description or f"How to solve {run.benchmark.id} tasks (trained by skillopt).")


def baseline(run: Run) -> TrainState:
    """Score the initial skill on the selection split: it is both the current and the best skill."""
    cfg = run.config
    skill = run.starting_skill()
    first_epoch = run.epoch_plan(1)
    run.prefetch.run_start()  # a hint: step 1's first batch and the test split need nothing of the baseline
    total_steps = cfg.train.epochs * len(first_epoch.steps)
    hint_step_one(run, skill, total_steps)
    evaluation = evaluate(run, skill, "val")
    score = gate_value(run, evaluation.scores)
    write_starting_skill(run, skill)
    run.dir.write_evaluation("baseline_selection", evaluation.rows, split="val",
                             skill_sha=evaluation.skill_sha, scores=evaluation.scores)
    state = TrainState(initial_skill=skill, current_skill=skill, current_score=score, best_skill=skill,
                       best_score=score, total_steps=total_steps,
                       baseline=evaluation.scores)
    if run.config.budget.capped:
        state.step_estimate = step_estimate(run)
    publish_progress(run, state.step, state.total_steps, 0, cfg.train.epochs, state.current_score,
                     state.best_score)
    progress.info(baseline_line(score, len(evaluation.rows), state.total_steps))
    return state


def baseline_line(score: float, items: int, steps: int) -> str:
    """The run log's line after the baseline, e.g. "baseline on the selection split: 0.500 (1 item); 2 steps
    to go"."""
    return (f"baseline on the selection split: {score:.3f} ({counted(items, 'item')}); "
            f"{counted(steps, 'step')} to go")


def hint_step_one(run: Run, skill: str, total_steps: int) -> None:
    """A hint: step 1's analysts read the starting skill, step 1's first batch (prefetched with the
    baseline), step 1's budget, an empty step buffer and no meta memory, so their calls can leave as soon as
    that batch has answered instead of after the baseline's tasks and the epoch's sub-flow. When that batch
    is all of the step's evidence (one batch per step, no deep probe), the merges of their patches follow
    them the same way. The step makes these calls again as its own tasks and takes the replies."""
    if (first := first_batch(run)) is None:
        return
    batch, _ = first
    budget = edit_budget_schedule(run, total_steps).budget(1)
    merges_too = len(run.epoch_plan(1).steps[0].batches) == 1 and not run.config.gradient.deep_probe

    def optimizer_calls(rows: list[ItemResult]) -> None:
        jobs = reflect_jobs(run, skill, rows, seed=batch.seed, budget=budget, buffer=StepBuffer().format(),
                            meta_skill="")
        if not merges_too:
            run.prefetch.calls(reflect_minibatch.fn, [job for _, job in jobs])
            return
        patches = run.prefetch.results(reflect_minibatch.fn, [job for _, job in jobs])
        failures, successes = by_kind([kind for kind, _ in jobs], patches)
        aggregate(run, skill, failures, successes, meta_skill="",
                  merges=lambda calls: run.prefetch.results(merge_patches.fn, calls))

    run.prefetch.when_first_batch_answered(optimizer_calls)


def edit_budget_schedule(run: Run, total_steps: int) -> EditBudgetSchedule:
    """The edit budget of each of the run's ``total_steps`` steps."""
    optimizer = run.config.optimizer
    return EditBudgetSchedule.from_config(optimizer.lr_scheduler, optimizer.learning_rate,
                                          optimizer.min_learning_rate, total_steps)


def run_epoch(run: Run, state: TrainState, epoch: int) -> TrainState:
    """The ``skill-epoch`` subflow without flow-run heartbeats (the top-level flow keeps them): a sync
    subflow waits up to 1 s for its heartbeat thread to stop, which held the first step of every epoch after
    the first."""
    # Prefect creates the sub-flow through a new API client, and a new client does not retry a connection
    # refused: a server restarting at that moment would fail the run. Wait for the API first; if it went away
    # between that check and the creation (the epoch's body had not begun), wait and create it once more.
    for attempt in (1, 2):
        wait_for_api(f"epoch {epoch}")
        try:
            if PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None:  # the CLI runs flows without heartbeats
                return skill_epoch(run, state, epoch)
            with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
                return skill_epoch(run, state, epoch)
        except Exception as error:
            if attempt == 2 or (id(run), epoch) in _epochs_begun or api_unreachable(error) is None:
                raise
            progress.info("epoch %d's sub-flow was not created: the Prefect API stopped answering", epoch)
        finally:
            _epochs_begun.discard((id(run), epoch))
    raise AssertionError("unreachable")


#: The (run, epoch) pairs whose sub-flow body has begun, while ``run_epoch`` waits on it: a failure before
#: that point created nothing the run depends on, so the sub-flow can be created again.
_epochs_begun: set[tuple[int, int]] = set()


@flow(name="skill-epoch", flow_run_name="epoch-{epoch}", validate_parameters=False)
def skill_epoch(run: Any, state: TrainState, epoch: int) -> TrainState:
    """One pass over the train split, then the epoch boundary.

    ``run`` is the run's ``Run`` (typed ``Any``: Prefect builds a parameter schema from the annotations, and
    the run holds clients and locks that have none).
    """
    _epochs_begun.add((id(run), epoch))
    record_sub_flow_run(run.dir.path)  # a resume after a lost API settles it (tasks/stale_runs.py)
    cfg = run.config
    schedule = edit_budget_schedule(run, state.total_steps)
    plan = run.epoch_plan(epoch)
    epoch_start_skill = state.current_skill
    buffer = StepBuffer()  # memory of this epoch only
    draws = Draws(epoch, resample=cfg.train.resample_each_epoch)
    for step_plan, next_plan in zip(plan.steps, [*plan.steps[1:], None], strict=True):
        if budget_stop(run, state, f"epoch {epoch} step {state.step + 1}/{state.total_steps}"):  # as printed
            return state
        state.step += 1
        live.emit("step", epoch=epoch, step=state.step, total_steps=state.total_steps)
        if cfg.train.selection == "pareto":  # the step starts from a skill of the front (flows/front.py)
            start_from_front(run, state)
        before = state.current_skill
        record = train_step(run, state, buffer, draws, epoch=epoch, step_plan=step_plan,
                            budget=schedule.budget(state.step))
        if next_plan is not None:
            # A hint: the next step's first batch with the skill this step ends on, prefetched while the
            # step's records, lines and artifacts below are written.
            batch = next_plan.batches[0]
            run.prefetch.rollouts(state.current_skill, batch.item_ids, training=True, epoch=draws.epoch,
                                  samples=draws.peek(batch.item_ids), view_seed=batch.seed)
        elif ends_the_run_on_the_best_skill(run, state, epoch):
            # A hint: the best skill's test split, which ``finish`` asks for first.
            run.prefetch.rollouts(state.best_skill, run.baseline_test_ids(), training=False)
        state.history.append(record)
        run.dir.record_step(record)
        run.dir.write_skill_snapshot(state.step, state.current_skill)
        progress.info(
            "epoch %d step %d/%d (budget %d): %d/%d failed%s, %d edits proposed, %d selected -> "
            "%s; current %.3f, best %.3f; optimizer replies %d parsed / %d unusable",
            epoch,
            state.step,
            state.total_steps,
            record.budget,
            record.n_fail,
            record.n_total,
            f" ({record.n_error} error rows)" if record.n_error else "",
            record.edits_proposed,
            record.edits_selected,
            record.gate.explain() if record.gate else record.decision,
            state.current_score,
            state.best_score,
            record.replies_parsed,
            record.replies_fallback,
        )
        for warning in record.warnings if record.decision == "skip_errors" else []:
            progress.warning("step %d: %s", state.step, warning)
        replies_warning = unusable_replies_warning(record.replies_parsed, record.replies_fallback)
        if replies_warning:
            progress.warning("step %d: %s", state.step, replies_warning)
        publish_step(run, record, state.history, previous_skill=before, current_skill=state.current_skill)
        publish_progress(run, state.step, state.total_steps, epoch, cfg.train.epochs, state.current_score,
                         state.best_score, last_step=record)  # with the spend so far
        stop_if_optimizer_unusable(run, state.history)
    state.epoch_last_skills.append(state.current_skill)
    if epoch >= 2 and not budget_stop(run, state, f"the epoch {epoch} boundary"):
        epoch_boundary(run, state, epoch, epoch_start_skill, draws)
    progress.info("epoch %d/%d done: current %.3f, best %.3f", epoch, cfg.train.epochs, state.current_score,
                  state.best_score)
    return state


def ends_the_run_on_the_best_skill(run: Run, state: TrainState, epoch: int) -> bool:
    """Whether the step just taken is the run's last and leaves the best skill final: the last epoch, no
    slow update after it to change the skill, no front to choose from, and the last skill is the best
    (so the final check cannot replace it)."""
    cfg = run.config
    return (epoch == cfg.train.epochs and not (epoch >= 2 and cfg.optimizer.use_slow_update)
            and cfg.train.selection != "pareto" and not state.stopped_by
            and skill_hash(state.current_skill) == skill_hash(state.best_skill))


class UnusableOptimizer(SkillOptError):
    """``optimizer.max_unusable_steps`` steps in a row had no usable optimizer reply."""


def stop_if_optimizer_unusable(run: Run, history: Sequence[StepRecord]) -> None:
    """Stop the run (exit 2) once ``optimizer.max_unusable_steps`` steps in a row had no usable optimizer
    reply: the run can only spend time without changing the skill."""
    limit = run.config.optimizer.max_unusable_steps
    if not limit or unusable_streak(history) < limit:
        return
    client = run.clients.optimizer
    role = client.role
    last = next(r for r in reversed(history) if r.kind == "step")  # the streak's last step
    generic = unusable_replies_warning(last.replies_parsed, last.replies_fallback)
    cause = next((warning for warning in last.warnings if warning != generic), None)  # e.g. a cut-off reply
    if cause and "cut off at max_tokens" in cause:
        fix = "raise model.optimizer.max_tokens, or use a stronger optimizer model"
    elif role.structured_output != "auto" and cause and "structured_output is" in cause:
        fix = "set model.optimizer.structured_output: auto, or use a model on a server that takes the mode"
    elif client.modes.fallen_to(client.endpoint()) is not None:  # the server refused json_schema already
        fix = "use a stronger optimizer model, or serve it where replies are constrained to the schema"
    else:
        fix = ("use a stronger optimizer model, or set model.optimizer.structured_output: json_schema (a "
               "server that constrains replies to the schema)")
    raise UnusableOptimizer(
        f"[optimizer] {role.short_label()}: no usable optimizer reply in {limit} steps in a row "
        f"(optimizer.max_unusable_steps)" + (f"; the last: {cause}" if cause else "") + f"; {fix}")


# --------------------------------------------------------------------------------------------
# One step


def train_step(run: Run, state: TrainState, buffer: StepBuffer, draws: Draws, *, epoch: int,
               step_plan: StepPlan, budget: int) -> StepRecord:
    """rollout -> reflect -> aggregate -> select -> update -> gate; returns the step's record."""
    timer, mark, skill = StepTimer(), run.clients.ledger.mark(), state.current_skill
    step_dir = f"steps/{state.step:04d}"

    # 1. Rollout, 2. Reflect — for each batch of the step (more than one with accumulation).
    evidence = Evidence()
    probes = []
    for batch in step_plan.batches:
        with timer("rollout"):
            rows = evaluate(run, skill, "train", batch.item_ids, training=True, epoch=draws.epoch,
                            samples=draws.take(batch.item_ids), view_seed=batch.seed).rows
        evidence.rows += rows
        with timer("reflect"):
            failures, successes = reflect(run, skill, rows, seed=batch.seed, budget=budget,
                                          buffer=buffer.format(), meta_skill=state.meta_memory)
            if run.config.gradient.deep_probe:  # diagnostic re-runs become extra minibatches
                probe = bound(run, deep_probe)(run, skill, rows, buffer.format(), state.meta_memory,
                                               epoch=draws.epoch)
                probes.append(probe)
                pf, ps = reflect(run, skill, probe.rows, seed=batch.seed + 1_000_003, budget=budget,
                                 buffer=buffer.format(), meta_skill=state.meta_memory)
                failures, successes = failures + pf, successes + ps
        evidence.failure_patches += failures
        evidence.success_patches += successes
    if probes:
        evidence.probe = probe_record(probes[0].instruction, [r for p in probes for r in p.rows],
                                      fallback=next((p.fallback for p in probes if p.fallback), None))
    run.dir.write_json(f"{step_dir}/patches.json", {"failure": evidence.failure_patches,
                                                    "success": evidence.success_patches})
    run.dir.write_jsonl(f"{step_dir}/trajectories.jsonl", evidence.rows)

    # 3. Aggregate: merge the failure and success trees, then one final merge (failures first).
    with timer("merge"):
        merged = aggregate(run, skill, evidence.failure_patches, evidence.success_patches,
                           meta_skill=state.meta_memory)
    run.dir.write_json(f"{step_dir}/merged.json", merged)

    # 4. Select, 5. Update, 6. Gate.
    outcome = update_and_gate(run, state, buffer, skill, merged, evidence, budget=budget, timer=timer)

    # 7. Record.
    appendix_notes = (add_execution_notes(run, state, evidence.failure_patches)
                      if run.config.optimizer.use_appendix else [])
    record = step_record(run, state, evidence, merged, outcome, epoch=epoch,
                         step_in_epoch=step_plan.index + 1, appendix_notes=appendix_notes,
                         wall_s=dict(timer.seconds), mark=mark)
    if outcome.update is not None:  # the files the candidate changed, and their diffs in the step's folder
        diffs = file_diffs(skill, outcome.update.candidate, old_label=f"before step {state.step}",
                           new_label=f"candidate step {state.step}")
        record.files_changed = list(diffs)
        run.dir.write_json(f"{step_dir}/file_diffs.json", diffs)
    recorded = run.dir.recorded_usage(state.step)
    if recorded is None:
        state.step_totals.append(run.clients.ledger.totals(since=mark))
    else:  # a replayed step: what it spent when it was taken, for the record and the budget's projection
        record.usage = recorded
        state.step_totals.append(Totals.model_validate({k: v for k, v in recorded.items()
                                                        if k in Totals.model_fields}))
    diagnoses = [d for p in evidence.failure_patches for d in p.diagnosis]
    buffer.add(StepBufferEntry(
        step=state.step, decision=outcome.decision, n_fail=record.n_fail, n_total=record.n_total,
        failure_patterns=failure_patterns(evidence.rows, diagnoses),
        rejected_edits=outcome.rejected, score_before=outcome.scores[0] if outcome.scores else None,
        score_after=outcome.scores[1] if outcome.scores else None,
    ))
    # The buffer after this step: its entries, and the text the next step's analysts will read.
    run.dir.write_json(f"{step_dir}/step_buffer.json",
                       {"entries": buffer.entries, "formatted": buffer.format()})
    return record


def update_and_gate(run: Run, state: TrainState, buffer: StepBuffer, skill: str, merged: Patch,
                    evidence: Evidence, *, budget: int, timer: StepTimer) -> StepOutcome:
    """Select (clip to the budget), update (the mode's candidate) and gate it; accept it into ``state`` if it
    passes. The update mode answers every mode-specific question."""
    mode = run.update_mode
    skip = mode.nothing_to_apply(merged)
    if skip:
        return StepOutcome(decision=skip, budget=budget)
    picked, budget_decision, pool = Picked(), None, mode.pool(merged)
    if mode.budgeted:
        if run.config.optimizer.lr_control_mode == "autonomous":
            budget_decision = autonomous_budget(run, state, skill, pool, evidence, buffer.format())
            budget = budget_decision["learning_rate"]
        with timer("ranking"):
            picked = select(run, skill, pool, budget, state.meta_memory)
        run.dir.write_json(f"steps/{state.step:04d}/selection.json", picked)
    outcome = StepOutcome(decision="", budget=budget, budget_decision=budget_decision,
                          edits_proposed=len(pool), picked=picked if mode.budgeted else None)
    if mode.budgeted and not picked.count:
        return outcome.model_copy(update={"decision": "skip_zero_budget"})

    update = build_candidate(run, skill, merged, picked, buffer=buffer.format(), meta_skill=state.meta_memory,
                             timer=timer)
    if update is None:
        return outcome.model_copy(update={"decision": "skip_no_rewrite"})
    rejected = mode.proposed_edits(skill, picked, update)
    outcome = outcome.model_copy(update={"update": update, "rejected": rejected})
    if skill_hash(update.candidate) == skill_hash(skill):
        return outcome.model_copy(update={"decision": "skip_identical"})
    broken = run.skill_spec.problem(update.candidate, current=skill)
    if broken:  # never gated, never written: the Agent Skills specification must hold after every update
        return outcome.model_copy(update={"decision": "skip_invalid_skill",
                                          "skip_reason": f"candidate rejected: {broken}"})

    with timer("gate"):
        gate = gate_candidate(run, state, update.candidate)
    run.dir.write_json(f"steps/{state.step:04d}/gate.json", gate)
    if isinstance(gate, GateSkipped):
        return outcome.model_copy(update={"decision": "skip_errors", "skip_reason": gate.reason,
                                          "gate_error_ids": gate.error_ids})
    outcome = outcome.model_copy(update={"gate_error_ids": gate.excluded})
    if gate.decision != "reject":
        accept(run, state, update.candidate, gate.candidate_gate, new_best=gate.new_best)
        return outcome.model_copy(update={"decision": gate.decision, "gate": gate, "rejected": []})
    return outcome.model_copy(update={"decision": "reject", "gate": gate,
                                      "scores": (gate.current_gate, gate.candidate_gate)})


# --------------------------------------------------------------------------------------------
# Epoch boundary


def epoch_boundary(run: Run, state: TrainState, epoch: int, epoch_start_skill: str, draws: Draws) -> None:
    """Slow update (new guidance for the target) and meta skill (memory for the optimizer)."""
    cfg = run.config
    if not (cfg.optimizer.use_slow_update or cfg.optimizer.use_meta_skill):
        return
    pairs = longitudinal_pairs(run, epoch, epoch_start_skill, state.current_skill, draws=draws)
    run.dir.write_json(f"epochs/{epoch:02d}/pairs.json", pairs)

    if cfg.optimizer.use_meta_skill and len(state.epoch_last_skills) >= 2:
        reply = bound(run, meta_skill)(run, state.epoch_last_skills[-2], state.epoch_last_skills[-1],
                                       state.meta_memory, pairs)
        if reply is not None:
            state.meta_memory = reply.memory
        run.dir.write_json(f"epochs/{epoch:02d}/meta_skill.json",
                           {"reply": reply, "memory": state.meta_memory})

    if not cfg.optimizer.use_slow_update:
        return
    reply = bound(run, slow_update)(run, epoch_start_skill, state.current_skill, state.guidance, pairs)
    run.dir.write_json(f"epochs/{epoch:02d}/slow_update.json", {"reply": reply})
    if reply is None or not reply.guidance.strip():
        return
    before = state.current_skill
    candidate = replace_block(before, SLOW_UPDATE, reply.guidance)
    state.guidance = reply.guidance
    gate = None
    decision: str
    if cfg.optimizer.slow_update_gate:
        checked = gate_candidate(run, state, candidate)
        if isinstance(checked, GateSkipped):
            decision = "skip_errors"
            progress.warning("epoch %d boundary: %s", epoch, checked.reason)
        else:
            gate, decision = checked, checked.decision
            if gate.decision != "reject":
                accept(run, state, candidate, gate.candidate_gate, new_best=gate.new_best)
    else:
        rescore(run, state, candidate)
        decision = "slow_update"
    if skill_hash(state.current_skill) != skill_hash(before):  # the report's diff of the boundary's change
        run.dir.write_skill_snapshot(state.step, state.current_skill, after="slow_update")
    progress.info("epoch %d boundary: slow update -> %s; current %.3f, best %.3f", epoch, decision,
                  state.current_score, state.best_score)
    record = StepRecord(step=state.step, epoch=epoch, step_in_epoch=0, budget=0, kind="slow_update",
                        decision=decision, gate=gate, current_score=state.current_score,
                        best_score=state.best_score, skill_sha=skill_hash(state.current_skill),
                        skill_chars=len(state.current_skill))
    state.history.append(record)
    run.dir.record_step(record)


# --------------------------------------------------------------------------------------------
# Final evaluation


def finish(run: Run, state: TrainState, *, wall_s: float) -> dict[str, Any]:
    """Promote the last skill if it beats the best, evaluate on test, write ``summary.json``."""
    from skillopt.run.runs import answer_format_counts, build_summary, signal_counts

    cfg = run.config
    with_test = cfg.evaluation.eval_test and state.stopped_by != "budget"
    if with_test and cfg.budget.capped:  # the test split is new spend too: guarded like a step
        skills = {skill_hash(state.initial_skill), skill_hash(state.best_skill)}
        items = len(skills) * len(run.selection_ids("test"))
        with_test = not budget_stop(run, state, "the test evaluation",
                                    projection=rollout_projection(run, items))
    if cfg.evaluation.eval_test and not with_test:
        # The selection checks are cached gate results; the test split would be new spend past the cap.
        progress.warning("stopped by budget: the test evaluation is skipped; score the best skill later with "
                         "`skillopt eval %s --skill %s`", run.benchmark.id, run.dir.best_skill_path)
    # The evaluations that do not wait for the final check run side by side with it: the initial skill's test
    # split, and the best skill's when the final check cannot change it (the last skill is the best).
    # One evaluation per distinct skill: two identical ones at once would both make every call.
    settled = skill_hash(state.current_skill) == skill_hash(state.best_skill)
    early = [("baseline", state.initial_skill)] + ([("best", state.best_skill)] if settled else [])
    early_skills = {skill_hash(skill): skill for _, skill in early} if with_test else {}
    final_selection, *early_tests = evaluate_many(
        run, [(state.current_skill, "val", run.selection_ids("val"))]
        + [(skill, "test", run.selection_ids("test")) for skill in early_skills.values()])
    tested = dict(zip(early_skills, early_tests, strict=True))
    tests: dict[str, Evaluation] = {name: tested[skill_hash(skill)] for name, skill in early if with_test}
    if not settled:
        final_score = gate_value(run, final_selection.scores)
        if final_score > state.best_score:
            state.best_skill, state.best_score, state.best_step = state.current_skill, final_score, state.step
            run.dir.write_best_skill(state.best_skill)
    run.dir.write_evaluation("final_selection", final_selection.rows, split="val",
                             skill_sha=final_selection.skill_sha, scores=final_selection.scores)
    if with_test and "best" not in tests and skill_hash(state.best_skill) in tested:
        tests["best"] = tested[skill_hash(state.best_skill)]
    best_selection, *best_test = evaluate_many(
        run,
        [(state.best_skill, "val", run.selection_ids("val"))]
        + (
            [(state.best_skill, "test", run.selection_ids("test"))]
            if with_test and "best" not in tests
            else []
        ),
    )
    tests.update(zip(["best"], best_test, strict=False))
    for name, evaluation in tests.items():
        run.dir.write_evaluation(
            f"{name}_test",
            evaluation.rows,
            split="test",
            skill_sha=evaluation.skill_sha,
            scores=evaluation.scores,
        )
    summary = build_summary(
        run_name=run.run_name, benchmark=run.benchmark.id, baseline_selection=state.baseline,
        baseline_test=tests["baseline"].scores if tests else None, best_selection=best_selection.scores,
        best_test=tests["best"].scores if tests else None, final_selection=final_selection.scores,
        history=state.history, usage=run.clients.ledger.summary(), wall_s=wall_s, stopped_by=state.stopped_by,
        stopped_message=state.stopped_message, best_skill_sha=skill_hash(state.best_skill),
        config=run.recorded_config,
        context_windows=run.clients.windows.learned(),
        answer_formats=answer_format_counts(
            [*final_selection.rows, *(row for evaluation in tests.values() for row in evaluation.rows)]),
    )
    if not state.stopped_by:  # a budget-stopped run resumed with a higher cap, and now finished
        (run.dir.path / "STOPPED").unlink(missing_ok=True)
    run.dir.write_summary(summary)
    publish_progress(run, state.step, state.total_steps, state.history[-1].epoch if state.history else 0,
                     cfg.train.epochs, gate_value(run, final_selection.scores),
                     gate_value(run, best_selection.scores), finished=True, stopped=state.stopped_message,
                     last_step=next((r for r in reversed(state.history) if r.kind == "step"), None),
                     totals=signal_counts(state.history))
    return end_of_run(run, summary)


def end_of_run(run: Run, summary: RunSummary) -> dict[str, Any]:
    """The end of every run, finished or stopped, once its summary is written: the summary line in the story,
    the cost and the report published; the flow's result."""
    from skillopt.run.report import write_report
    from skillopt.run.runs import summary_dict, summary_line

    story.info("%s", summary_line(summary_dict(summary)))
    progress.info("wrote %s", run.dir.summary_path)
    publish_cost(run)
    report = write_report(run.dir.path)
    publish_report_link(run, report)
    progress.info("report: %s", report)
    return {**summary_dict(summary), "run_dir": str(run.dir.path)}
