"""What ``skillopt compare`` and ``skillopt transfer`` check before Prefect starts, and what they print.

Every bad input is one ``SkillOptError`` line (the CLI exits 2) before any model call: an unknown
benchmark or named target model, a config that does not validate, a benchmark without data or with an
empty split, a skill reference that does not resolve or does not parse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from skillopt.core.errors import ConfigError
from skillopt.core.records import counted

CompareMode = Literal["skills", "runs"]


def registered_benchmarks() -> list[str]:
    from skillopt.deployments.serve import registered_benchmarks as registered

    return registered()


def compare_mode(items: Sequence[str], runs: Sequence[str] | None) -> CompareMode:
    """``skills`` for ``SKILL_A SKILL_B BENCHMARK``; ``runs`` for ``--runs RUN_DIR...`` or run directories
    alone (the command's earlier form); anything else is a ``ConfigError`` saying both forms."""
    usage = "expected SKILL_A SKILL_B BENCHMARK, or --runs RUN_DIR [RUN_DIR ...]"
    if runs:
        if items:
            raise ConfigError(f"skillopt compare: {usage}, not both")
        return "runs"
    benchmarks = registered_benchmarks()
    if len(items) == 3 and items[2] in benchmarks:
        return "skills"
    if items and all(Path(item).is_dir() for item in items):
        return "runs"
    if len(items) == 3:
        raise ConfigError(f"skillopt compare: unknown benchmark {items[2]!r}; registered benchmarks: "
                          f"{', '.join(benchmarks)}")
    raise ConfigError(f"skillopt compare: {usage}; got {len(items)} argument{'s' if len(items) != 1 else ''}")


def _loaded(benchmark: str, *, config_file: str | None, overrides: Sequence[str],
            env: Mapping[str, str], cli_roles: Mapping[str, Any] | None = None) -> Any:
    from skillopt.core.config import load_config

    if benchmark not in registered_benchmarks():
        raise ConfigError(f"unknown benchmark {benchmark!r}; registered benchmarks: "
                          f"{', '.join(registered_benchmarks())}")
    return load_config(benchmark, config_file=config_file, overrides=list(overrides), env=env,
                       cli_roles=cli_roles)


def _check_evaluation(loaded: Any, cli_roles: Mapping[str, Any], *, split: str, env: Mapping[str, str],
                      command: str) -> None:
    from skillopt.llm.roles import CliRoleOptions
    from skillopt.run.run_checks import check_run

    check_run(loaded, cli=CliRoleOptions(**cli_roles), env=env, roles_used=("target",), split=split,
              command=command)


def read_skills(loaded: Any, references: Sequence[str]) -> list[Any]:
    """The skills ``references`` name, read as the flow will read them (``skillopt.run.skill_source``)."""
    from skillopt.benchmarks.base import load_benchmark
    from skillopt.benchmarks.resolve import initial_skill
    from skillopt.run.skill_source import read_skill

    config = loaded.config
    name = config.benchmark.name or ""
    initial = initial_skill(config, load_benchmark(name).prompts_dir, name).text
    return [read_skill(reference, initial=initial, skills_dir=config.run.skills_dir, benchmark=name,
                       settings=config.skill)
            for reference in references]


def check_compare(benchmark: str, skill_a: str, skill_b: str, *, config_file: str | None,
                  overrides: Sequence[str], cli_roles: Mapping[str, Any], split: str, target: str | None,
                  env: Mapping[str, str]) -> None:
    """Raise what ``skillopt compare SKILL_A SKILL_B BENCHMARK`` would stop on before its first call."""
    from skillopt.run.targets import with_target

    loaded = _loaded(benchmark, config_file=config_file, overrides=overrides, env=env, cli_roles=cli_roles)
    roles = dict(cli_roles)
    if target:
        loaded, roles = with_target(loaded, roles, target)
    _check_evaluation(loaded, roles, split=split, env=env,
                      command="skillopt compare SKILL_A SKILL_B BENCHMARK")
    read_skills(loaded, [skill_a, skill_b])


def check_transfer(benchmarks: Sequence[str], skills: Sequence[str], targets: Sequence[str], *,
                   config_file: str | None, overrides: Sequence[str], data: str | None,
                   cli_roles: Mapping[str, Any], split: str, env: Mapping[str, str]) -> None:
    """Raise what ``skillopt transfer`` would stop on before its first call: every benchmark with every
    named target checked as an evaluation, every skill read on every benchmark."""
    from skillopt.run.targets import check_targets, with_target

    if data and len(benchmarks) != 1:
        raise ConfigError("skillopt transfer: --data is one benchmark's data: give exactly one --bench with "
                          "it")
    for name, values in (("--skills", skills), ("--targets", targets), ("--bench", benchmarks)):
        repeated = sorted({value for value in values if list(values).count(value) > 1})
        if repeated:
            raise ConfigError(f"skillopt transfer: {name} names {', '.join(repeated)} more than once")
    for benchmark in benchmarks:
        loaded = _loaded(benchmark, config_file=config_file, overrides=overrides, env=env,
                         cli_roles=cli_roles)
        check_targets(loaded.config, targets, where=f"--targets ({benchmark})")
        for target in targets:
            target_loaded, roles = with_target(loaded, cli_roles, target)
            _check_evaluation(target_loaded, roles, split=split, env=env,
                              command=f"skillopt transfer --bench {benchmark} --targets {target}")
        read_skills(loaded, skills)


def compare_lines(result: Mapping[str, Any]) -> list[str]:
    """What ``skillopt compare`` prints from the flow's result."""
    from skillopt.core.paired import PairedComparison

    comparison = PairedComparison.model_validate({k: v for k, v in result.items()
                                                  if k in PairedComparison.model_fields})
    where = f" with target {result['target']}" if result.get("target") else ""
    folder = Path(result["run_dir"])
    return [f"{comparison.benchmark} {comparison.split}{where}: B against A on {comparison.n} items",
            *(f"  {line}" for line in comparison.lines()),
            f"compare.json: {folder / 'compare.json'}", f"page: {folder / 'compare.html'}"]


def transfer_lines(result: Mapping[str, Any]) -> list[str]:
    """What ``skillopt transfer`` prints: one line per cell, then the files."""
    axes = (("skills", "skill"), ("targets", "target"), ("benchmarks", "benchmark"))
    shape = " x ".join(counted(len(result[key]), noun) for key, noun in axes)
    lines = [f"transfer matrix ({result['split']} split): {shape}"]
    # columns as wide as their longest entry (a run directory names a skill), so the scores line up
    width = {key: max((len(str(cell[key])) for cell in result["cells"]), default=0)
             for key in ("benchmark", "target", "skill")}
    for cell in result["cells"]:
        usd = "cost unknown" if cell.get("usd_per_item") is None else f"${cell['usd_per_item']:.5f}/item"
        diff = (f"  vs initial {cell['difference']:+.3f} [{cell['ci_low']:+.3f}, {cell['ci_high']:+.3f}] "
                f"p={cell['p_value']:.3f}") if cell.get("difference") is not None else ""
        lines.append(f"  {cell['benchmark']:<{width['benchmark']}}  {cell['target']:<{width['target']}}  "
                     f"{cell['skill']:<{width['skill']}}  "
                     f"{cell['score']:.3f} (n={cell['n']}){diff}  {usd}")
    folder = Path(result["run_dir"])
    lines += [f"matrix.json: {folder / 'matrix.json'}", f"heatmap: {folder / 'matrix.html'}"]
    return lines
