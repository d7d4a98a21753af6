"""The ``skill-compare`` flow: two skills on the same items of one benchmark, with a paired test.

Both skills are scored on every item of the same split (as ``skill-eval`` scores a skill) through the cached
``evaluate_skill`` task, at once; the comparison (``skillopt.core.paired``) goes to
``compare.json`` and ``compare.html`` in the run directory and to a Prefect markdown artifact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from skillopt.core.atomic import atomic_write_bytes
from skillopt.core.config import load_config
from skillopt.core.data import resolve_split
from skillopt.core.paired import PairedComparison, compare_rows, per_item_cost
from skillopt.flows.naming import config_overrides, run_directory_of
from skillopt.run.artifacts import artifact_key
from skillopt.run.assembly import Run, RunSpec
from skillopt.run.decision_pages import compare_page
from skillopt.run.skill_source import SkillSource, read_skill, skill_tokens
from skillopt.run.targets import with_target
from skillopt.tasks.rollout import Evaluation, evaluate_many
from skillopt.tasks.run import started_run

COMPARE_JSON = "compare.json"
COMPARE_HTML = "compare.html"


def compare_run_name() -> str:
    """``flow_run_name`` of ``skill-compare``."""
    return run_directory_of(flow_run.parameters, prefix="compare")


# Prefect types flow(task_runner=) as TaskRunner[PrefectFuture], which its own thread-pool runner
# (a TaskRunner[PrefectConcurrentFuture]) does not match under an invariant type parameter.
@flow(name="skill-compare", flow_run_name=compare_run_name,
      task_runner=ThreadPoolTaskRunner(max_workers=16))  # type: ignore[arg-type]
def skill_compare(benchmark: str, skill_a: str = "initial", skill_b: str = "registry:", split: str = "test",
                  target: str | None = None, data: str | None = None, config_file: str | None = None,
                  overrides: list[str] | None = None, run_name: str | None = None,
                  cli_roles: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compare ``skill_b`` with ``skill_a`` on ``split`` of ``benchmark``.

    A skill is a markdown file, a folder with ``SKILL.md``, a run directory (its ``best_skill.md``),
    ``initial`` (the benchmark's starting skill) or ``registry:<bench>[@<version>]`` (``registry:`` alone:
    this benchmark's promoted skill). ``target`` names a ``model.targets`` entry to evaluate with instead of
    ``model.target``. Returns ``compare.json``'s content with ``run_dir``.

    Args:
        benchmark: The benchmark to compare on, e.g. searchqa (one of `skillopt benchmarks`).
        skill_a: The first skill (A): a markdown file, a folder with SKILL.md, a run directory (its
            best_skill.md), initial, or registry:<bench>@<version> (registry: alone: the promoted skill).
        skill_b: The second skill (B), compared with A (the difference is B - A); as skill_a.
        split: train, val (selection) or test.
        target: A named target model (model.targets.NAME) to evaluate with. Empty: model.target.
        data: The benchmark's data on the machine that runs the flow (a folder with train/ val/ test/ or one
            data file). Empty: the data named in the benchmark's config.
        config_file: A YAML config file on the machine that runs the flow, merged over the benchmark's config.
        overrides: Config overrides applied in order, each `section.key=value`.
        run_name: Name of the run directory under run.runs_dir. Empty: a fresh name.
        cli_roles: Backend and model for every role without its own setting, e.g. {"backend": "openai",
            "model": "gpt-4.1-mini"}.
    """
    split = resolve_split(split)
    loaded = load_config(benchmark, config_file=config_file, overrides=config_overrides(data, overrides),
                         env=os.environ, cli_roles=cli_roles)
    roles = dict(cli_roles or {})
    if target:
        loaded, roles = with_target(loaded, roles, target)
    spec = RunSpec.create(loaded, cli_roles=roles, run_name=run_name or flow_run.name, prefix="compare")
    with started_run(spec, loaded=loaded) as run:
        sources = [_read(run, reference) for reference in (skill_a, skill_b)]
        ids = run.split_ids[split]  # the whole split, as skill-eval scores it
        # A skill compared with itself is evaluated once. Results are matched to the skills by position: an
        # evaluation served from the cache carries the hash of the text it was first made for, which may be
        # another text the target sees the same way (the skill without its front matter, say).
        distinct = {source.sha: source for source in sources}
        jobs: list[tuple[str, str, list[str]]] = [(source.text, split, ids) for source in distinct.values()]
        done = dict(zip(distinct, evaluate_many(run, jobs), strict=True))
        a_eval, b_eval = (done[source.sha] for source in sources)
    for name, evaluation in (("compare_a", a_eval), ("compare_b", b_eval)):
        run.dir.write_evaluation(name, evaluation.rows, split=split, skill_sha=evaluation.skill_sha,
                                 scores=evaluation.scores)
    evaluation_config = loaded.config.evaluation
    comparison = compare_rows(a_eval.rows, b_eval.rows, benchmark=benchmark, split=split,
                              a=_side(sources[0], a_eval), b=_side(sources[1], b_eval),
                              metric=evaluation_config.gate_metric,
                              mixed_weight=evaluation_config.gate_mixed_weight, seed=loaded.config.train.seed)
    write_comparison(run.dir.path, comparison)
    create_markdown_artifact(key=artifact_key(benchmark, run.run_name, "compare"),
                             markdown=comparison_markdown(comparison),
                             description=f"{skill_b} against {skill_a} on {benchmark} {split}")
    return {**comparison.model_dump(mode="json"), "run_dir": str(run.dir.path), "target": target}


def _read(run: Run, reference: str) -> SkillSource:
    return read_skill(reference, initial=run.initial_skill, benchmark=run.benchmark.id,
                      skills_dir=run.spec.path(run.config.run.skills_dir), settings=run.config.skill)


def _side(source: SkillSource, evaluation: Evaluation) -> dict[str, Any]:
    return {"label": source.reference, "origin": source.origin, "sha": source.sha,
            "skill_tokens": skill_tokens(source.text), "per_item": per_item_cost(evaluation.rows)}


def write_comparison(folder: Path, comparison: PairedComparison) -> tuple[Path, Path]:
    """``compare.json`` and ``compare.html`` in ``folder``."""
    data = comparison.model_dump_json(indent=2).encode("utf-8") + b"\n"
    atomic_write_bytes(folder / COMPARE_JSON, data)
    atomic_write_bytes(folder / COMPARE_HTML, compare_page(comparison).encode("utf-8"))
    return folder / COMPARE_JSON, folder / COMPARE_HTML


def comparison_markdown(comparison: PairedComparison) -> str:
    """The Prefect artifact: the two skills, the difference with its interval, the test and the flips."""
    c = comparison
    lines = [f"# {c.benchmark} {c.split}: B against A", "", f"**{c.verdict()}**", "",
             "| | skill | sha | score | skill tokens | target tokens/item | USD/item |",
             "|---|---|---|---|---|---|---|"]
    for name, side in (("A", c.a), ("B", c.b)):
        usd = "unknown" if side.per_item.usd is None else f"{side.per_item.usd:.5f}"
        lines.append(f"| {name} | {side.label} | {side.sha[:12]} | {side.gate:.3f} | {side.skill_tokens} | "
                     f"{side.per_item.tokens:.0f} | {usd} |")
    lines += ["", f"- difference B − A: {c.difference:+.4f}, {c.confidence:.0%} interval [{c.ci_low:+.4f}, "
                  f"{c.ci_high:+.4f}]",
              f"- {c.method} test: p = {c.p_value:.4f} (two-sided), one-sided p for B better = "
              f"{c.p_b_better:.4f}",
              f"- flips: +{len(c.flips.improved)} / -{len(c.flips.regressed)} "
              f"({c.flips.unchanged} unchanged)"]
    return "\n".join(lines)
