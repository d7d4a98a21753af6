"""Resolving the configured benchmark before anything runs: shared by training (``skillopt/run/assembly.py``)
and the dry run (``skillopt/run/estimate.py``), and free of Prefect so a dry run starts quickly."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from skillopt.benchmarks.base import Benchmark, benchmark_config, load_benchmark
from skillopt.benchmarks.item_limit import item_limit_s
from skillopt.core.config import LoadedConfig, SkillOptConfig
from skillopt.core.errors import BenchmarkSetupError, ConfigError
from skillopt.llm.base import BackendRegistry
from skillopt.llm.roles import CliRoleOptions, resolve_roles
from skillopt.skill.folder import LoadedSkill, load_skill
from skillopt.skill.spec import skill_name_from

progress = logging.getLogger("skillopt.progress")


def resolve_benchmark(loaded: LoadedConfig, *, cli: CliRoleOptions | None, env: Mapping[str, str],
                      registry: BackendRegistry, command: str) -> tuple[Benchmark[Any], BaseModel, Any]:
    """The configured benchmark, its config bound to the target backend, and the resolved roles, after
    the plug-in's preflight. ``command`` is what the "no benchmark named" error tells the user to run."""
    config = loaded.config
    if not config.benchmark.name:
        raise ConfigError(f"benchmark.name is not set: name a benchmark ({command})")
    benchmark = load_benchmark(config.benchmark.name)
    bench_cfg = benchmark_config(benchmark, config.benchmark, loaded.source_of)
    roles = resolve_roles(loaded, cli=cli, env=env, registry=registry)
    kind = registry.get(roles.target.backend).kind
    bench_cfg = bind_target(benchmark, bench_cfg, roles.target.backend, kind)
    limit = item_limit_s(bench_cfg, roles.target, roles.judge if benchmark.needs_judge(bench_cfg) else None,
                         config.model.retry, exec_target=kind == "exec")
    bench_cfg = bench_cfg.model_copy(update={"item_timeout_s": limit})
    benchmark.preflight(bench_cfg)
    check_prompts_dir(benchmark)
    return benchmark, bench_cfg, roles


def check_prompts_dir(benchmark: Benchmark[Any]) -> None:
    """A plug-in's prompt files are each optional, but their folder is not: without it the run would start
    from a blank skill and its analysts would get no guidance, without a word (a package installed without
    its ``prompts/*.md``, or ``prompts_dir`` not overridden)."""
    folder = benchmark.prompts_dir
    if not folder.is_dir():
        raise BenchmarkSetupError(
            f"benchmark {benchmark.id}: its prompts folder {folder} does not exist (Benchmark.prompts_dir). "
            "Ship initial_skill.md, analyst_error.md and analyst_success.md there (declare them as package "
            "data, or a non-editable install leaves them out), or point prompts_dir at an existing folder")


def bind_target(benchmark: Benchmark[Any], bench_cfg: BaseModel, backend: str, kind: str) -> BaseModel:
    """The plug-in's ``bind_target`` hook, with each note (such as "the environment is simulated")
    logged for the run header."""
    bound, notes = benchmark.bind_target(benchmark.config(bench_cfg), backend=backend, kind=kind)
    for note in notes:
        progress.info("%s: %s", benchmark.id, note)
    return bound


def initial_skill(config: SkillOptConfig, prompts_dir: Path, benchmark_id: str) -> LoadedSkill:
    """``train.skill_init``: null = the benchmark's initial skill, "" = blank, else a ``.md`` file or an
    Agent Skills folder (``skill_folder.load_skill``). A skill without front matter is named after its file
    (the benchmark for the built-in and the blank skill)."""
    if config.train.skill_init is None:
        return LoadedSkill(text=read_prompt(prompts_dir / "initial_skill.md"),
                           name=skill_name_from(benchmark_id), front_matter=False)
    if config.train.skill_init == "":
        return LoadedSkill(text="", name=skill_name_from(benchmark_id), front_matter=False)
    path = Path(config.train.skill_init)
    if not path.exists():
        raise ConfigError(f"train.skill_init: no skill folder or file at {path}")
    return load_skill(path, max_file_bytes=config.skill.max_file_bytes,
                      train_scripts=config.skill.train_scripts, default_name=benchmark_id)


def read_prompt(path: Path) -> str:
    """A plug-in prompt file's text; "" when the plug-in ships no such file."""
    return path.read_text(encoding="utf-8") if path.is_file() else ""
