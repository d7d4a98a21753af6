"""The dry run: model calls, tokens and USD a training config implies, without calling a model.

Call counts follow from the config and the split sizes the way ``flows/train.py`` spends them:

- baseline: one rollout per selection item;
- each step: one rollout per train item of its batches, one analyst call per minibatch of
  failures and of successes, merge calls of ``merge_batch_size`` fan-in level by level plus the
  final merge, a ranking call when the pool holds more edits than the budget, the rewrite and
  autonomous-budget calls of those modes, a deep probe per batch, and the gate's rollouts of the
  candidate on the selection split (the current skill's are cached);
- each epoch boundary from epoch 2: the longitudinal pairs' rollouts, one meta-skill and one
  slow-update call, and the re-score of the updated skill on the selection split;
- the end: the initial and best skill on the test split.

A rollout is one call per turn (at most the benchmark's ``max_target_calls``: ``benchmark.max_turns``,
the steps of an episode, the turns of a tool loop) and, with a judge, one verdict.

Which branches run depends on what the models answer, so each count has three values: ``low``
(no conditional branch runs: nothing reaches the gate, every pair is cached), ``high`` (every
branch runs, nothing is cached) and ``expected``, with each conditional branch running on
``EXPECTED_SHARE`` of the steps. Tokens per call come from the real rendered rollout prompts of
the benchmark's items with the initial skill, the optimizer templates, and the length of the
scripted ``estimate`` rule set's stub replies for each stage's output schema.
Prices come from the price table (``model.pricing_file`` over the shipped one).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from skillopt.core.config import LoadedConfig, SkillOptConfig
from skillopt.core.data import Item, plan_epoch
from skillopt.core.errors import ConfigError
from skillopt.core.prompts import optimizer_prompt
from skillopt.llm.chat import ROLE_OF_STAGE, STAGES, ChatRequest, Stage, Usage, user
from skillopt.llm.pricing import PriceTable
from skillopt.llm.scripted import Answer, EstimateRules
from skillopt.llm.usage import BudgetVerdict, RoleSpend, Totals, check_budget, check_startable
from skillopt.optimizer.update_modes import update_mode_for

#: The share of steps on which a branch that depends on the models' answers is expected to run
#: (a candidate reaching the gate, a ranking call, a final merge, a rewrite ...).
EXPECTED_SHARE = 0.5
#: Characters an accepted edit adds to the skill, for the mean skill length over the run.
EDIT_CHARS = 80
#: How many items' rendered rollout prompts are measured (the mean stands for every item).
PROMPT_SAMPLE = 20

_OPTIMIZER_TEMPLATE = {
    "analyst": "analyst_failure",
    "merge": "merge",
    "ranking": "ranking",
    "lr": "autonomous_budget",
    "rewrite": "rewrite",
    "slow_update": "slow_update",
    "meta_skill": "meta_skill",
    "deep_probe": "deep_probe",
}


class Calls(BaseModel):
    """Calls of one stage over the whole run: lowest, expected and highest count."""

    low: float = 0.0
    expected: float = 0.0
    high: float = 0.0

    def add(self, low: float, expected: float, high: float, times: float = 1.0) -> None:
        self.low += low * times
        self.expected += expected * times
        self.high += high * times


class StageEstimate(BaseModel):
    stage: str
    role: str
    calls_low: int
    calls: int
    calls_high: int
    prompt_tokens_per_call: int
    completion_tokens_per_call: int
    tokens: int
    usd_low: float | None
    usd: float | None
    usd_high: float | None


class RunEstimate(BaseModel):
    """What ``skillopt train --dry-run`` prints, and the budget guard's projection before step 1."""

    benchmark: str
    split_sizes: dict[str, int]
    epochs: int
    steps: int
    stages: list[StageEstimate]
    calls_low: int
    calls: int
    calls_high: int
    tokens: int
    usd_low: float | None
    usd: float | None
    usd_high: float | None
    #: The expected spend of one training step (rollout, reflect, merge, select, gate), for the budget guard.
    per_step: Totals
    budget: BudgetVerdict | None = None
    #: The step the budget guard is expected to stop before (1 = the first), None when every step fits.
    stops_before_step: int | None = None
    unpriced_roles: list[str] = []
    #: Why training would refuse to start with this config (``budget.max_usd`` and a model with no price).
    refused: str | None = None


# --------------------------------------------------------------------------------------------
# Call counts


def merge_calls(patches: int, fan_in: int) -> int:
    """Merge calls of one tree of ``patches`` merged ``fan_in`` at a time, level by level (a group
    of one passes through without a call), as ``skillopt.flows.stages.merge_trees`` does."""
    calls = 0
    while patches > 1:
        groups = math.ceil(patches / fan_in)
        calls += groups - (1 if patches % fan_in == 1 else 0)
        patches = groups
    return calls


def call_counts(config: SkillOptConfig, split_sizes: Mapping[str, int], train_ids: Sequence[str], *,
                needs_judge: bool, max_target_calls: int | None = None
                ) -> tuple[dict[str, Calls], dict[str, Calls], int]:
    """Calls per stage over the run and over one step, and the number of steps. ``max_target_calls``: the
    most target calls of one rollout (the benchmark's; default ``benchmark.max_turns``)."""
    cfg = config
    share = EXPECTED_SHARE
    n_sel = _first(split_sizes["val"], cfg.evaluation.sel_size)
    n_test = _first(split_sizes["test"], cfg.evaluation.test_size) if cfg.evaluation.eval_test else 0
    plan = plan_epoch(train_ids, seed=cfg.train.seed, epoch=1, batch_size=cfg.train.batch_size,
                      accumulation=cfg.train.accumulation)
    steps = len(plan.steps) * cfg.train.epochs
    mode = update_mode_for(cfg.optimizer)
    m = cfg.gradient.minibatch_size

    step = {stage: Calls() for stage in STAGES}
    for batch in plan.steps[0].batches if plan.steps else []:
        b = len(batch.item_ids)
        step["rollout"].add(b, b, b)
        analysts = _analyst_calls(b, m, cfg.gradient.failure_only)
        if cfg.gradient.deep_probe:
            probed = cfg.gradient.deep_probe_failures + cfg.gradient.deep_probe_successes
            step["deep_probe"].add(1, 1, 1)
            step["rollout"].add(0, probed, probed)
            extra = _analyst_calls(probed, m, cfg.gradient.failure_only)
            analysts = Calls(low=analysts.low, expected=analysts.expected + extra.expected,
                             high=analysts.high + extra.high)
        step["analyst"].add(analysts.low, analysts.expected, analysts.high)
    patches = step["analyst"]
    fan_in = cfg.gradient.merge_batch_size
    if cfg.gradient.failure_only:
        step["merge"].add(0, merge_calls(math.ceil(patches.expected), fan_in),
                          merge_calls(math.ceil(patches.high), fan_in))
    else:  # a failure tree and a success tree, then the final merge of the two when both hold patches
        expected = math.ceil(patches.expected)
        high = math.ceil(patches.high)
        step["merge"].add(0, merge_calls(math.ceil(expected / 2), fan_in) + merge_calls(expected // 2, fan_in)
                          + share,
                          max(merge_calls(a, fan_in) + merge_calls(high - a, fan_in) + (0 < a < high)
                              for a in range(high + 1)))
    if mode.budgeted:
        step["ranking"].add(0, share, 1)
        if cfg.optimizer.lr_control_mode == "autonomous":
            step["lr"].add(0, 1, 1)
    if mode.rewrites:
        step["rewrite"].add(0, share, 1)
    step["rollout"].add(0, share * n_sel, n_sel)  # the candidate on the selection split
    if cfg.optimizer.use_appendix:
        step["rollout"].add(0, share * n_sel, n_sel)  # the re-score after execution notes

    run = {stage: Calls() for stage in STAGES}
    for stage, calls in step.items():
        run[stage].add(calls.low, calls.expected, calls.high, times=steps)
    run["rollout"].add(n_sel, n_sel, n_sel)  # baseline
    boundaries = max(cfg.train.epochs - 1, 0)
    if boundaries and (cfg.optimizer.use_slow_update or cfg.optimizer.use_meta_skill):
        samples = min(cfg.optimizer.slow_update_samples, len(train_ids))
        topped_up = 2 * len(train_ids) if cfg.optimizer.longitudinal_pair_policy != "mixed" else 2 * samples
        run["rollout"].add(0, samples, topped_up, times=boundaries)
        if cfg.optimizer.use_meta_skill:
            run["meta_skill"].add(1, 1, 1, times=boundaries)
        if cfg.optimizer.use_slow_update:
            run["slow_update"].add(1, 1, 1, times=boundaries)
            run["rollout"].add(0, n_sel, n_sel, times=boundaries)
    run["rollout"].add(0, 0, n_sel)  # the final selection check of a last skill never scored
    run["rollout"].add(n_test, 2 * n_test, 2 * n_test)  # initial and best skill on test
    turns = max_target_calls or cfg.benchmark.max_turns
    for table in (run, step):
        rollouts = table["rollout"]
        if needs_judge:  # one verdict per rollout
            table["judge"].add(rollouts.low, rollouts.expected, rollouts.high)
        if turns > 1:  # a rollout takes one call per turn: at least one, at most ``turns``
            rollouts.expected *= (1 + turns) / 2
            rollouts.high *= turns
    return run, step, steps


def _first(size: int, limit: int) -> int:
    return min(size, limit) if limit else size


def _analyst_calls(batch: int, minibatch: int, failure_only: bool) -> Calls:
    """One call per minibatch of failures and of successes; how many fail is not known yet."""
    if batch == 0:
        return Calls()
    if failure_only:
        return Calls(low=0, expected=math.ceil(batch / 2 / minibatch), high=math.ceil(batch / minibatch))
    both = min(math.ceil(batch / minibatch) + 1, batch)
    return Calls(
        low=math.ceil(batch / minibatch), expected=(math.ceil(batch / minibatch) + both) / 2, high=both
    )


# --------------------------------------------------------------------------------------------
# Tokens per call


def _stub_tokens(stage: Stage, schema: type[BaseModel] | None) -> int:
    """Completion tokens of the ``estimate`` rule set's stub reply for ``stage`` (characters / 4)."""
    request = ChatRequest(messages=[user("estimate")], stage=stage, response_schema=schema)
    answer = EstimateRules().reply(request, role=ROLE_OF_STAGE.get(stage, "optimizer"), seed=0)
    text = answer.text if isinstance(answer, Answer) else ""
    return math.ceil(len(text) / 4)


def _schemas() -> dict[Stage, type[BaseModel] | None]:
    from skillopt.optimizer.autonomous import BudgetReply
    from skillopt.optimizer.merge import MergeReply
    from skillopt.optimizer.meta_skill import MetaSkillReply
    from skillopt.optimizer.probe import ProbeReply
    from skillopt.optimizer.reflect import AnalystReply
    from skillopt.optimizer.rewrite import RewriteReply
    from skillopt.optimizer.select import RankingReply
    from skillopt.optimizer.slow_update import SlowUpdateReply

    return {
        "rollout": None,
        "judge": None,
        "analyst": AnalystReply,
        "merge": MergeReply,
        "ranking": RankingReply,
        "lr": BudgetReply,
        "rewrite": RewriteReply,
        "slow_update": SlowUpdateReply,
        "meta_skill": MetaSkillReply,
        "deep_probe": ProbeReply,
    }


def tokens_per_call(config: SkillOptConfig, *, rollout_prompt: int, skill_tokens: int,
                    train_size: int | None = None) -> dict[str, tuple[int, int]]:
    """``(prompt, completion)`` tokens of one call per stage.

    ``rollout_prompt`` is the mean rendered rollout prompt (skill included), ``skill_tokens`` the
    mean skill length over the run. A trajectory shown to the optimizer is counted as the rollout
    prompt without the skill plus the rollout's answer.
    """
    completion = {stage: _stub_tokens(stage, schema) for stage, schema in _schemas().items()}
    answer = completion["rollout"]
    trajectory = max(rollout_prompt - skill_tokens, 0) + answer
    template = {
        stage: math.ceil(len(optimizer_prompt(name)) / 4) for stage, name in _OPTIMIZER_TEMPLATE.items()
    }
    g = config.gradient
    limit = train_size if train_size else config.train.batch_size
    minibatch = min(g.minibatch_size, config.train.batch_size, limit)  # trajectories one analyst reads
    samples = min(config.optimizer.slow_update_samples, limit)
    # A merge reads at most merge_batch_size patches, and a tree holds about half the step's analysts'.
    analysts = math.ceil(min(config.train.batch_size, limit) / max(1, g.minibatch_size)) + 1
    merge_inputs = min(g.merge_batch_size, max(2, math.ceil(analysts / 2)))
    pool = 2 * config.optimizer.learning_rate * completion["analyst"] // 3
    prompt: dict[Stage, int] = {
        "rollout": rollout_prompt,
        "judge": trajectory,
        "analyst": template["analyst"] + skill_tokens + minibatch * trajectory,
        "merge": template["merge"] + skill_tokens + merge_inputs * completion["analyst"],
        "ranking": template["ranking"] + skill_tokens + pool,
        "lr": template["lr"] + skill_tokens + pool,
        "rewrite": template["rewrite"] + skill_tokens + pool,
        "slow_update": template["slow_update"] + 2 * skill_tokens + samples * trajectory,
        "meta_skill": template["meta_skill"] + 2 * skill_tokens + samples * trajectory,
        "deep_probe": template["deep_probe"] + skill_tokens + minibatch * trajectory,
    }
    return {stage: (prompt[stage], completion[stage]) for stage in prompt}


# --------------------------------------------------------------------------------------------
# The estimate


def estimate_run(
    config: SkillOptConfig,
    *,
    items: Mapping[str, Sequence[Item]],
    rollout_prompt_chars: Sequence[int],
    initial_skill: str,
    roles: Mapping[str, tuple[str, str | None]],
    prices: PriceTable,
    needs_judge: bool,
    max_tokens: Mapping[str, int | None] | None = None,
    max_target_calls: int | None = None,
) -> RunEstimate:
    """The dry-run estimate of a config. Pure: reads nothing but its arguments.

    ``items`` maps each split to its items; ``rollout_prompt_chars`` are the characters of some
    rendered rollout prompts with the initial skill; ``roles`` maps each role to its
    ``(backend, price_model)`` and ``max_tokens`` each role's reply cap (None: the provider's).
    """
    sizes = {split: len(items.get(split, ())) for split in ("train", "val", "test")}
    train_ids = [item.id for item in items["train"]]
    run_calls, step_calls, steps = call_counts(config, sizes, train_ids, needs_judge=needs_judge,
                                               max_target_calls=max_target_calls)
    edits_per_step = config.optimizer.learning_rate * EXPECTED_SHARE
    skill_tokens = math.ceil((len(initial_skill) + steps * edits_per_step * EDIT_CHARS / 2) / 4)
    initial_tokens = math.ceil(len(initial_skill) / 4)
    mean_prompt = sum(rollout_prompt_chars) / len(rollout_prompt_chars) if rollout_prompt_chars else 0
    rollout_prompt = math.ceil(mean_prompt / 4) + (skill_tokens - initial_tokens)
    per_call = tokens_per_call(config, rollout_prompt=rollout_prompt, skill_tokens=skill_tokens,
                               train_size=len(train_ids))
    for stage, (prompt, completion) in per_call.items():  # a reply never outgrows its role's max_tokens
        cap = (max_tokens or {}).get(ROLE_OF_STAGE[stage])
        per_call[stage] = (prompt, min(completion, cap) if cap else completion)

    def usd(stage: str, calls: float) -> float | None:
        backend, price_model = roles.get(ROLE_OF_STAGE[stage], ("scripted", None))
        prompt, completion = per_call[stage]
        one = prices.cost(backend, price_model, Usage(prompt_tokens=prompt, completion_tokens=completion))
        return None if one is None else one * calls

    stages = []
    for stage in STAGES:
        calls = run_calls.get(stage)
        if calls is None or calls.high <= 0:
            continue
        prompt, completion = per_call[stage]
        expected = round(calls.expected)
        stages.append(
            StageEstimate(
                stage=stage,
                role=ROLE_OF_STAGE[stage],
                calls_low=round(calls.low),
                calls=expected,
                calls_high=round(calls.high),
                prompt_tokens_per_call=prompt,
                completion_tokens_per_call=completion,
                tokens=expected * (prompt + completion),
                usd_low=usd(stage, round(calls.low)),
                usd=usd(stage, expected),
                usd_high=usd(stage, round(calls.high)),
            )
        )

    per_step = Totals()
    for stage, calls in step_calls.items():
        if calls.expected <= 0:
            continue
        n = math.ceil(calls.expected)
        prompt, completion = per_call[stage]
        cost = usd(stage, n) or 0.0
        per_step.calls += n
        per_step.prompt_tokens += n * prompt
        per_step.completion_tokens += n * completion
        per_step.usd += cost
        spend = per_step.by_role.setdefault(ROLE_OF_STAGE[stage], RoleSpend())
        spend.calls += n
        spend.tokens += n * (prompt + completion)
        spend.usd += cost

    unpriced = sorted({s.role for s in stages if s.usd is None})
    estimate = RunEstimate(
        benchmark=config.benchmark.name or "", split_sizes=sizes, epochs=config.train.epochs, steps=steps,
        stages=stages, calls_low=sum(s.calls_low for s in stages), calls=sum(s.calls for s in stages),
        calls_high=sum(s.calls_high for s in stages), tokens=sum(s.tokens for s in stages),
        usd_low=_sum_usd(s.usd_low for s in stages), usd=_sum_usd(s.usd for s in stages),
        usd_high=_sum_usd(s.usd_high for s in stages), per_step=per_step, unpriced_roles=unpriced,
    )
    budget = config.budget
    try:  # the check training makes before it starts, over the roles it would use
        check_startable(budget, prices, {role: model for role, model in roles.items()
                                         if role != "judge" or needs_judge})
    except ConfigError as error:
        estimate.refused = str(error)
    if budget.max_usd is not None or budget.max_tokens is not None or budget.max_calls is not None:
        whole = Totals(
            calls=estimate.calls,
            prompt_tokens=sum(s.calls * s.prompt_tokens_per_call for s in stages),
            completion_tokens=sum(s.calls * s.completion_tokens_per_call for s in stages),
            usd=estimate.usd or 0.0,
        )
        estimate.budget = check_budget(budget, whole, None, "the end of the run")
        if estimate.budget.stop:  # where the guard would stop: the baseline, then step after step
            n_sel = _first(sizes["val"], config.evaluation.sel_size)
            prompt, completion = per_call["rollout"]
            spent = Totals(calls=n_sel, prompt_tokens=n_sel * prompt, completion_tokens=n_sel * completion,
                           usd=usd("rollout", n_sel) or 0.0)
            for step in range(1, steps + 1):
                if check_budget(budget, spent, per_step, "").stop:
                    estimate.stops_before_step = step
                    break
                spent = Totals(calls=spent.calls + per_step.calls, usd=spent.usd + per_step.usd,
                               prompt_tokens=spent.prompt_tokens + per_step.prompt_tokens,
                               completion_tokens=spent.completion_tokens + per_step.completion_tokens)
    return estimate


def _sum_usd(values: Any) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def format_estimate(estimate: RunEstimate) -> list[str]:
    """The dry run's printout: one line per stage, the total, and the budget verdict."""
    sizes = estimate.split_sizes
    row = "{:<12} {:<10} {:>7} {:>7} {:>7} {:>9} {:>9} {:>12}  {}"
    lines = [
        f"dry run of {estimate.benchmark}: {estimate.epochs} epochs, {estimate.steps} steps; "
        f"train {sizes['train']}, selection {sizes['val']}, test {sizes['test']} items; no model was called",
        row.format("stage", "role", "calls", "low", "high", "in/call", "out/call", "tokens",
                   "USD low / expected / high"),
    ]
    for s in estimate.stages:
        lines.append(
            row.format(
                s.stage,
                s.role,
                s.calls,
                s.calls_low,
                s.calls_high,
                s.prompt_tokens_per_call,
                s.completion_tokens_per_call,
                f"{s.tokens:,}",
                _usd_range(s.usd_low, s.usd, s.usd_high),
            )
        )
    lines.append(
        row.format(
            "total",
            "",
            estimate.calls,
            estimate.calls_low,
            estimate.calls_high,
            "",
            "",
            f"{estimate.tokens:,}",
            _usd_range(estimate.usd_low, estimate.usd, estimate.usd_high),
        )
    )
    if estimate.unpriced_roles:
        lines.append(f"no price known for the model of: {', '.join(estimate.unpriced_roles)}; its cost is "
                     "unknown (add it to a pricing file, model.pricing_file)")
    verdict = estimate.budget
    if estimate.refused:
        lines.append(f"budget: training would not start: {estimate.refused}")
    elif verdict is not None:
        stop = estimate.stops_before_step
        if not verdict.stop:
            lines.append("budget: the expected run fits within the caps")
        elif stop is None:
            lines.append(f"budget: the expected run passes budget.{verdict.cap}; every step fits, then the "
                         "run would stop before its test evaluation")
        else:
            where = "its first step" if stop == 1 else f"step {stop} of {estimate.steps}"
            one_step = _spend_text(estimate.per_step, verdict.cap)
            lines.append(f"budget: the expected run passes budget.{verdict.cap}; training would stop cleanly "
                         f"before {where} (one step is expected to take {one_step})")
    lines.append("expected = branches that depend on model answers (gate, ranking, final merge) on "
                 f"{EXPECTED_SHARE:.0%} of steps; low = none of them and every pair cached; high = all, "
                 "nothing cached")
    return lines


def _spend_text(totals: Totals, cap: str | None) -> str:
    if cap == "max_usd":
        return f"${totals.usd:,.2f}"
    if cap == "max_calls":
        return f"{totals.calls:,} calls"
    return f"{totals.tokens:,} tokens"


def _usd_range(low: float | None, expected: float | None, high: float | None) -> str:
    if expected is None:
        return "unpriced"
    return f"${low or 0:.4f} / ${expected:.4f} / ${high or 0:.4f}"


# --------------------------------------------------------------------------------------------
# From a loaded config (what the CLI calls)


def dry_run(loaded: LoadedConfig, *, cli: Any = None, env: Mapping[str, str]) -> RunEstimate:
    """Estimate a training run of ``loaded`` without calling a model or starting Prefect.

    Loads the benchmark and its splits (split manifests go to a temporary folder, so nothing is
    written under ``runs/``) and resolves the roles for their price models.
    """
    from skillopt.benchmarks.resolve import initial_skill, resolve_benchmark  # the same readings as training
    from skillopt.llm.base import BackendRegistry

    config = loaded.config
    benchmark, bench_cfg, roles = resolve_benchmark(
        loaded,
        cli=cli,
        env=env,
        registry=BackendRegistry.default(),
        command="skillopt train BENCHMARK --dry-run",
    )
    with tempfile.TemporaryDirectory(prefix="skillopt-dry-run-") as scratch:
        items = {split: benchmark.load_split(bench_cfg, split, run_dir=Path(scratch))
                 for split in ("train", "val", "test")}
    start = initial_skill(config, benchmark.prompts_dir, benchmark.id).text
    return estimate_benchmark_run(config, benchmark=benchmark, bench_cfg=bench_cfg, items=items,
                                  initial_skill=start, roles=roles,
                                  prices=PriceTable.load(config.model.pricing_file or None))


def estimate_benchmark_run(config: SkillOptConfig, *, benchmark: Any, bench_cfg: BaseModel,
                           items: Mapping[str, Sequence[Item]], initial_skill: str, roles: Any,
                           prices: PriceTable) -> RunEstimate:
    """``estimate_run`` for a loaded benchmark: renders the rollout prompts of the first
    ``PROMPT_SAMPLE`` items with the initial skill; ``roles`` are the ``ResolvedRoles``. Used by the
    dry run and, for the budget guard's projection before the first step, by the training flow."""
    sample = [*items["train"], *items["val"], *items["test"]][:PROMPT_SAMPLE]
    chars = [ChatRequest(messages=benchmark.build_messages(item, initial_skill, bench_cfg), stage="rollout")
             .prompt_chars() for item in sample]
    used = {"target": roles.target, "optimizer": roles.optimizer}
    if roles.judge is not None:
        used["judge"] = roles.judge
    return estimate_run(config, items=items, rollout_prompt_chars=chars, initial_skill=initial_skill,
                        roles={role: (r.backend, r.price_model) for role, r in used.items()}, prices=prices,
                        needs_judge=benchmark.needs_judge(bench_cfg),
                        max_tokens={role: r.max_tokens for role, r in used.items()},
                        max_target_calls=benchmark.max_target_calls(bench_cfg))
