"""The ``skill-eval`` flow: score any skill file on any split of a benchmark."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from skillopt.assembly import RunSpec
from skillopt.config import load_config
from skillopt.data import resolve_split
from skillopt.errors import ConfigError
from skillopt.flows.naming import eval_run_name
from skillopt.runs import per_task_type
from skillopt.skill import skill_hash
from skillopt.skill_folder import load_skill
from skillopt.tasks.rollout import evaluate
from skillopt.tasks.run import started_run


# Prefect types flow(task_runner=) as TaskRunner[PrefectFuture], which its own thread-pool runner
# (a TaskRunner[PrefectConcurrentFuture]) does not match under an invariant type parameter.
@flow(name="skill-eval", flow_run_name=eval_run_name,
      task_runner=ThreadPoolTaskRunner(max_workers=16))  # type: ignore[arg-type]
def skill_eval(benchmark: str, skill_file: str, split: str = "test", config_file: str | None = None,
               overrides: list[str] | None = None, run_name: str | None = None,
               cli_roles: dict[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate ``skill_file`` on ``split``; writes ``eval/<split>/`` in the run directory and returns the
    scores."""
    path = Path(skill_file)
    if not path.exists():
        raise ConfigError(f"--skill: no skill folder or file at {skill_file}")
    split = resolve_split(split)
    loaded = load_config(benchmark, config_file=config_file, overrides=overrides or [], env=os.environ)
    skill = load_skill(path, max_file_bytes=loaded.config.skill.max_file_bytes,
                       train_scripts=loaded.config.skill.train_scripts).text  # a folder or a .md
    spec = RunSpec.create(loaded, cli_roles=cli_roles, run_name=run_name or flow_run.name, prefix="eval")
    with started_run(spec, loaded=loaded) as run:
        evaluation = evaluate(run, skill, split, run.split_ids[split])
    run.dir.write_evaluation(split, evaluation.rows, split=split, skill_sha=evaluation.skill_sha,
                             scores=evaluation.scores)
    return {"run_dir": str(run.dir.path), "split": split, "skill_sha": skill_hash(skill),
            "hard": evaluation.scores.hard, "soft": evaluation.scores.soft, "n": evaluation.scores.n,
            "per_task_type": per_task_type(evaluation.rows)}
