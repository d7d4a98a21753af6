"""The ``skill-transfer`` flow: skills x named target models x benchmarks, one cached evaluation per cell.

For each benchmark and each named target (``model.targets.<name>``) the flow opens one evaluation run
(``<transfer run>/cells/<bench>-<target>/``) whose target is that model; every skill is then scored there on
the split as one ``evaluate_skill`` task, named ``cell <skill> | <target> | <bench>`` in the Prefect UI and
cached like any evaluation (its key is its rollouts' keys, the target's identity among them). The initial
skill is scored on every target and benchmark too (a ``baseline`` task, unless it is one of the skills), so
each cell carries its difference to the initial skill, with its 95% interval and p-value
(``skillopt.core.paired``). The matrix goes to ``matrix.json``, a heatmap to ``matrix.html`` and a table
artifact to the flow run.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from skillopt.core.atomic import atomic_write_bytes
from skillopt.core.config import load_config
from skillopt.core.data import resolve_split
from skillopt.core.errors import ConfigError, SkillOptError
from skillopt.core.paired import CONFIDENCE, compare_rows, per_item_cost
from skillopt.flows.naming import config_overrides
from skillopt.run.artifacts import slug
from skillopt.run.assembly import Run, RunSpec
from skillopt.run.decision_pages import matrix_page
from skillopt.run.runs import run_directory_name
from skillopt.run.skill_source import INITIAL, SkillSource, read_skill, skill_tokens
from skillopt.run.targets import check_targets, with_target
from skillopt.tasks.cache import bound
from skillopt.tasks.rollout import Evaluation, PartialEvaluation, evaluate_skill
from skillopt.tasks.run import started_run

MATRIX_JSON = "matrix.json"
MATRIX_HTML = "matrix.html"
progress = logging.getLogger("skillopt.progress")


def transfer_run_name() -> str:
    """``flow_run_name`` of ``skill-transfer``: ``<first bench>-transfer-<time>-<config hash>``."""
    parameters = flow_run.parameters
    if flow_run.run_count > 0 and flow_run.name:
        return str(flow_run.name)
    if parameters.get("run_name"):
        return str(parameters["run_name"])
    benchmark = (parameters.get("benchmarks") or ["skills"])[0]
    try:
        loaded = load_config(benchmark, config_file=parameters.get("config_file"),
                             overrides=config_overrides(parameters.get("data"), parameters.get("overrides")),
                             env=os.environ)
    except SkillOptError:
        return f"{benchmark}-transfer"  # the flow itself reports the config error
    return run_directory_name(benchmark, loaded.config, prefix="transfer")


# Prefect types flow(task_runner=) as TaskRunner[PrefectFuture], which its own thread-pool runner
# (a TaskRunner[PrefectConcurrentFuture]) does not match under an invariant type parameter.
@flow(name="skill-transfer", flow_run_name=transfer_run_name,
      task_runner=ThreadPoolTaskRunner(max_workers=16))  # type: ignore[arg-type]
def skill_transfer(benchmarks: list[str], skills: list[str], targets: list[str], split: str = "test",
                   data: str | None = None, config_file: str | None = None,
                   overrides: list[str] | None = None, run_name: str | None = None,
                   cli_roles: dict[str, Any] | None = None) -> dict[str, Any]:
    """The transfer matrix of ``skills`` (references as ``skillopt compare`` takes them) on ``targets``
    (``model.targets`` names) and ``benchmarks``; returns ``matrix.json``'s content with ``run_dir``.

    Args:
        benchmarks: The benchmarks, e.g. ["demo"] (each one of `skillopt benchmarks`).
        skills: The skills: markdown files, folders with SKILL.md, run directories (their best_skill.md),
            initial, or registry:<bench>@<version> (registry: alone: each benchmark's promoted skill).
        targets: Named target models, each a model.targets.NAME entry of the benchmarks' configs.
        split: train, val (selection) or test.
        data: One benchmark's data on the machine that runs the flow (with exactly one benchmark). Empty: the
            data named in each benchmark's config.
        config_file: A YAML config file on the machine that runs the flow, merged over each benchmark's
            config.
        overrides: Config overrides applied in order, each `section.key=value`.
        run_name: Name of the matrix's run directory under run.runs_dir. Empty: a fresh name.
        cli_roles: Backend and model for the roles without their own setting (a named target keeps its own).
    """
    if not targets or not skills or not benchmarks:
        raise ConfigError("skill-transfer needs at least one skill, one named target (model.targets.NAME) "
                          "and one benchmark")
    if data and len(benchmarks) != 1:
        raise ConfigError("skill-transfer: data is one benchmark's data: give exactly one benchmark with it")
    split = resolve_split(split)
    name = run_name or flow_run.name or "transfer"
    specs: list[tuple[str, str, RunSpec, Any]] = []
    folder: Path | None = None
    for benchmark in benchmarks:
        loaded = load_config(benchmark, config_file=config_file, overrides=config_overrides(data, overrides),
                             env=os.environ)
        check_targets(loaded.config, targets)
        if folder is None:
            folder = Path(loaded.config.run.runs_dir) / name
        cells_dir = (folder / "cells").as_posix()
        for target in targets:
            target_loaded, roles = with_target(
                load_config(benchmark, config_file=config_file, env=os.environ,
                            overrides=[*config_overrides(data, overrides), f"run.runs_dir={cells_dir}"]),
                cli_roles, target)
            spec = RunSpec.create(target_loaded, cli_roles=roles, run_name=f"{benchmark}-{target}")
            specs.append((benchmark, target, spec, target_loaded))
    assert folder is not None, "skill-transfer needs at least one benchmark"

    with ExitStack() as stack:
        runs = {(bench, target): stack.enter_context(started_run(spec, loaded=loaded))
                for bench, target, spec, loaded in specs}
        sources = {bench: [_read(run, reference) for reference in skills]
                   for (bench, _), run in runs.items()}
        jobs: dict[tuple[str, str, str], Any] = {}
        for (bench, target), run in runs.items():
            ids = run.split_ids[split]  # the whole split, as skill-eval scores it
            initial = _read(run, INITIAL)
            wanted = [(source.reference, source) for source in sources[bench]]
            if initial.sha not in {source.sha for source in sources[bench]}:
                wanted.append(("baseline " + INITIAL, initial))
            for label, source in wanted:
                kind = "baseline" if label.startswith("baseline ") else "cell"
                task = bound(run, evaluate_skill,
                             task_run_name=f"{kind} {source.reference} | {target} | {bench}")
                jobs[(bench, target, label)] = task.submit(run, source.text, split, ids)
        done = {key: _result(future) for key, future in jobs.items()}
        for (bench, target), run in runs.items():
            for number, source in enumerate(sources[bench], start=1):
                evaluation = done[(bench, target, source.reference)]
                run.dir.write_evaluation(f"skill{number}_{split}", evaluation.rows, split=split,
                                         skill_sha=evaluation.skill_sha, scores=evaluation.scores)
            baseline = done.get((bench, target, "baseline " + INITIAL))
            if baseline is not None:  # what every cell's difference is taken against, kept to be checked
                run.dir.write_evaluation(f"initial_{split}", baseline.rows, split=split,
                                         skill_sha=baseline.skill_sha, scores=baseline.scores)

    metric_of = {bench: loaded.config.evaluation for bench, _, _, loaded in specs}
    seed = specs[0][3].config.train.seed
    cells = []
    for (bench, target), run in runs.items():
        initial = _read(run, INITIAL)
        base_label = next((s.reference for s in sources[bench] if s.sha == initial.sha),
                          "baseline " + INITIAL)
        baseline = done[(bench, target, base_label)]
        for source in sources[bench]:
            evaluation = done[(bench, target, source.reference)]
            cells.append(_cell(bench, target, source, evaluation, baseline, metric_of[bench], seed, split))
            progress.info("cell %s | %s | %s: %.3f", source.reference, target, bench, cells[-1]["score"])
    matrix = {"split": split, "confidence": CONFIDENCE, "baseline": INITIAL, "benchmarks": list(benchmarks),
              "targets": list(targets), "skills": [{"label": reference} for reference in skills],
              "cells": cells}
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / MATRIX_JSON, (_json(matrix) + "\n").encode("utf-8"))
    atomic_write_bytes(folder / MATRIX_HTML, matrix_page(matrix).encode("utf-8"))
    create_table_artifact(key=f"{slug(name)}-matrix", table=[_table_row(cell) for cell in cells],
                          description=f"transfer matrix on the {split} split: score, difference to the "
                                      "initial skill with its 95% interval, cost per item")
    return {**matrix, "run_dir": str(folder)}


def _read(run: Run, reference: str) -> SkillSource:
    return read_skill(reference, initial=run.initial_skill, benchmark=run.benchmark.id,
                      skills_dir=run.spec.path(run.config.run.skills_dir), settings=run.config.skill)


def _result(future: Any) -> Evaluation:
    try:
        evaluation: Evaluation = future.result()
    except PartialEvaluation as partial:  # error rows: left out of the cell's comparison on both sides
        return partial.evaluation
    return evaluation


def _cell(bench: str, target: str, source: SkillSource, evaluation: Evaluation, baseline: Evaluation,
          settings: Any, seed: int, split: str) -> dict[str, Any]:
    cost = per_item_cost(evaluation.rows)
    sides = {key: {"label": key, "origin": key, "sha": key, "skill_tokens": 0, "per_item": cost}
             for key in ("a", "b")}
    comparison = compare_rows(baseline.rows, evaluation.rows, benchmark=bench, split=split, a=sides["a"],
                              b=sides["b"], metric=settings.gate_metric,
                              mixed_weight=settings.gate_mixed_weight, seed=seed)
    return {"skill": source.reference, "target": target, "benchmark": bench, "sha": source.sha,
            "skill_tokens": skill_tokens(source.text), "metric": comparison.metric,
            "score": comparison.b.gate, "hard": evaluation.scores.hard, "soft": evaluation.scores.soft,
            "n": comparison.n, "initial_score": comparison.a.gate, "difference": comparison.difference,
            "ci_low": comparison.ci_low, "ci_high": comparison.ci_high, "p_value": comparison.p_value,
            "flips": {"improved": len(comparison.flips.improved),
                      "regressed": len(comparison.flips.regressed)},
            "tokens_per_item": cost.tokens, "usd_per_item": cost.usd}


def _table_row(cell: dict[str, Any]) -> dict[str, Any]:
    usd = cell["usd_per_item"]
    return {"benchmark": cell["benchmark"], "target": cell["target"], "skill": cell["skill"],
            "score": round(cell["score"], 4), "vs initial": f"{cell['difference']:+.3f}",
            "95% interval": f"[{cell['ci_low']:+.3f}, {cell['ci_high']:+.3f}]",
            "p": round(cell["p_value"], 4),
            "tokens/item": round(cell["tokens_per_item"], 1),
            "USD/item": "unknown" if usd is None else round(usd, 6)}


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)
