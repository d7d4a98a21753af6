"""The ``skill-eval`` flow: score any skill (a file, a folder, a run, a registry version) on a split."""

from __future__ import annotations

import os
from typing import Any

from prefect import flow
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from skillopt.core.config import load_config
from skillopt.core.data import resolve_split
from skillopt.flows.naming import eval_run_name
from skillopt.run.assembly import RunSpec
from skillopt.run.runs import per_task_type
from skillopt.skill.document import skill_hash
from skillopt.tasks.rollout import evaluate
from skillopt.tasks.run import started_run


# Prefect types flow(task_runner=) as TaskRunner[PrefectFuture], which its own thread-pool runner
# (a TaskRunner[PrefectConcurrentFuture]) does not match under an invariant type parameter.
@flow(name="skill-eval", flow_run_name=eval_run_name,
      task_runner=ThreadPoolTaskRunner(max_workers=16))  # type: ignore[arg-type]
def skill_eval(benchmark: str, skill_file: str = "registry:", split: str = "test",
               config_file: str | None = None, overrides: list[str] | None = None,
               run_name: str | None = None, cli_roles: dict[str, Any] | None = None,
               data: str | None = None) -> dict[str, Any]:
    """Evaluate a skill on ``split``; writes ``eval/<split>/`` in the run directory and returns the scores.

    Args:
        benchmark: The benchmark to evaluate on, e.g. searchqa (one of `skillopt benchmarks`).
        skill_file: The skill: a markdown file, a folder with SKILL.md, a run directory (its best_skill.md),
            initial (the benchmark's starting skill) or registry:<bench>@<version> (registry: alone: this
            benchmark's promoted skill).
        split: train, val (selection) or test.
        config_file: A YAML config file on the machine that runs the flow, merged over the benchmark's config.
        overrides: Config overrides applied in order, each `section.key=value`.
        run_name: Name of the run directory under run.runs_dir. Empty: a fresh name.
        cli_roles: Backend and model for every role without its own setting, e.g. {"backend": "openai",
            "model": "gpt-4.1-mini"}.
        data: The benchmark's data on the machine that runs the flow (a folder with train/ val/ test/ or one
            data file). Empty: the data named in the benchmark's config.
    """
    from skillopt.flows.naming import config_overrides
    from skillopt.shell.decision_cli import read_skills

    split = resolve_split(split)
    loaded = load_config(benchmark, config_file=config_file, overrides=config_overrides(data, overrides),
                         env=os.environ, cli_roles=cli_roles)
    skill = read_skills(loaded, [skill_file])[0].text
    spec = RunSpec.create(loaded, cli_roles=cli_roles, run_name=run_name or flow_run.name, prefix="eval")
    with started_run(spec, loaded=loaded) as run:
        evaluation = evaluate(run, skill, split, run.split_ids[split])
    run.dir.write_evaluation(split, evaluation.rows, split=split, skill_sha=evaluation.skill_sha,
                             scores=evaluation.scores)
    return {"run_dir": str(run.dir.path), "split": split, "skill_sha": skill_hash(skill),
            "hard": evaluation.scores.hard, "soft": evaluation.scores.soft, "n": evaluation.scores.n,
            "per_task_type": per_task_type(evaluation.rows)}
