"""Everything a run can be refused for, checked before Prefect is imported.

Importing Prefect costs 2-4 s and its temporary API server 3-8 s more; a typo'd key, a missing data
file, a bad split, an unknown backend or a missing credential found only after that reaches the user
20-30 s late. ``skillopt train|eval|demo`` therefore call ``check_run`` first, cheapest and most fixable
first: the config, the benchmark and its preflight, every split read from the data, then the backends (a
scripted target's replies, the credentials and endpoints: the checks of ``skillopt backends check``
without the model call). A deployment run makes the same checks when its flow starts, before any
rollout. The flow makes the same readings again when it assembles the run (it must stand on its own
when a deployment starts it); the second reading of the data is cheap next to a run.
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skillopt.benchmarks.base import Benchmark, BenchmarkSetupError
from skillopt.benchmarks.resolve import initial_skill, resolve_benchmark
from skillopt.benchmarks.runner import first_messages
from skillopt.core.config import LoadedConfig
from skillopt.core.data import check_train_size, resolve_split
from skillopt.core.errors import ConfigError
from skillopt.llm.base import BackendRegistry, EnvSecrets
from skillopt.llm.chat import Message
from skillopt.llm.clients import ModelClients
from skillopt.llm.roles import CliRoleOptions

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class CheckedRun:
    """What the checks found: the benchmark, and the number of items of each split."""

    benchmark: str
    split_sizes: dict[str, int]


def check_run(loaded: LoadedConfig, *, cli: CliRoleOptions | None, env: Mapping[str, str],
              roles_used: Collection[str] = ("target", "optimizer"), split: str | None = None,
              command: str = "skillopt train BENCHMARK", probe: bool = True,
              run_name: str | None = None) -> CheckedRun:
    """Raise the ``SkillOptError`` a run of ``loaded`` would fail on at set-up; return the split sizes.

    ``roles_used``: the roles the command calls (an evaluation calls only the target); the judge is
    checked when the benchmark needs it. ``split``: the split an evaluation scores, which must not be empty.
    ``probe`` False: the credentials are checked for presence only, with no client built and no endpoint
    reached (the check a deployment run makes inside its flow, next to the run's own clients). ``run_name``:
    the run a training command resumes, if its folder exists, must start from the same skill.
    """
    config = loaded.config
    chosen = resolve_split(split) if split is not None else None
    registry = BackendRegistry.default()
    benchmark, bench_cfg, roles = resolve_benchmark(
        loaded, cli=cli, env=env, registry=registry, command=command
    )
    name = config.benchmark.name
    wanted = list(roles_used)
    # Cheapest and most fixable first: the data (read offline) before the backends (files they need, the
    # credentials, the endpoints), so a malformed data file is not hidden behind a network error.
    with tempfile.TemporaryDirectory(prefix="skillopt-check-") as scratch:  # split manifests: not under runs/
        splits = {s: benchmark.load_split(bench_cfg, s, run_dir=Path(scratch)) for s in SPLITS}
    sizes = {s: len(items) for s, items in splits.items()}
    sample = next((items[0] for items in splits.values() if items), None)
    if sample is not None:
        # One real prompt, built as a rollout builds it: a build_messages that raises or returns no list of
        # messages stops the run here, before Prefect starts.
        first_messages(benchmark, sample, "", bench_cfg)
        check_gold_stays_out(benchmark, bench_cfg, sample)
    if "optimizer" in wanted:
        check_train_size(config.train.train_size, sizes["train"])
        start = initial_skill(config, benchmark.prompts_dir, benchmark.id)  # a bad skill: one line, now
        if run_name:
            _check_same_start(config, run_name, start.text)
    if chosen is not None and sizes[chosen] == 0:
        raise ConfigError(f"--split {split}: the {chosen} split of {name} has no items")
    if benchmark.needs_judge(bench_cfg):
        if roles.judge_problem:
            raise BenchmarkSetupError(f"benchmark {name} needs the judge role: {roles.judge_problem}")
        wanted.append("judge")
    check_image_support(name or "", benchmark, roles, registry,
                        analyst_images=config.optimizer.analyst_images and "optimizer" in wanted)
    check_scripted_target(benchmark.id, bench_cfg, roles.target)
    if probe:
        _check_credentials(loaded, roles, registry, env, wanted)
    else:
        _check_keys(roles, env, wanted)
    return CheckedRun(benchmark=name or "", split_sizes=sizes)


#: What a gold field holds while a prompt is built to see whether the prompt reads it.
GOLD_SENTINEL = "skillopt-gold-sentinel-7d41"


def check_gold_stays_out(benchmark: Benchmark, bench_cfg: Any, item: Any) -> None:
    """The benchmark's prompt for ``item`` must not show its ``GOLD_FIELDS``: built with each one holding a
    sentinel, the prompt must not contain it (the optimizer learns from a gold that only the evaluation
    event shows; a target that reads it scores nothing real). A prompt that cannot be built that way says
    nothing here."""
    if not benchmark.GOLD_FIELDS:
        return
    fields = [field for field in benchmark.GOLD_FIELDS if field in item]
    if not fields:  # a misspelt name would turn the check off without a word
        declared, found = ", ".join(benchmark.GOLD_FIELDS), ", ".join(sorted(item))
        raise BenchmarkSetupError(
            f"benchmark {benchmark.id}: GOLD_FIELDS ({declared}) names no field of its items (item {item.id} "
            f"has {found}); name the fields that hold the gold answer")
    marked = type(item)({**item, **{field: GOLD_SENTINEL for field in fields}})
    try:
        messages = benchmark.build_messages(marked, "", bench_cfg)
    except Exception:  # noqa: BLE001 - a builder that needs the real value fails here; the run finds out
        return
    if not isinstance(messages, list) or not all(isinstance(message, Message) for message in messages):
        return  # the real item's prompt passed first_messages' check; this one is no prompt to search
    # Upper-cased or lower-cased, the gold is still shown.
    if any(GOLD_SENTINEL in message.text().lower() for message in messages):
        raise BenchmarkSetupError(f"benchmark {benchmark.id}: its prompt shows a gold field of the item "
                                  f"({', '.join(fields)}, GOLD_FIELDS): build_messages must not read them")


def check_scripted_target(benchmark_id: str, bench_cfg: Any, target: Any) -> None:
    """A ``scripted`` target on data that ships no scripted replies would fail every item: say so once,
    now."""
    from skillopt.benchmarks.scripted_target import RULES_FILE, target_rules

    if target.backend != "scripted" or target.options.get("rules") is not None:
        return
    if not target_rules(benchmark_id, bench_cfg):
        raise ConfigError(
            f"the scripted target has no replies for this data: its folder holds no {RULES_FILE} (the "
            "scripted backend plays only data that ships its replies, like tests/fixtures/<benchmark>); "
            "give rules with -o model.target.options.rules=FILE.yaml, or use a model backend "
            "(--backend openai, local, ...)")


def _check_same_start(config: Any, run_name: str, start: str) -> None:
    """A resumed run replays its steps from the skill it started from; a skill changed since would only be
    found when the flow writes its first snapshot."""
    from skillopt.skill.document import skill_hash

    snapshot = Path(config.run.runs_dir) / run_name / "skills" / "step_0000.md"
    if snapshot.is_file() and skill_hash(snapshot.read_text(encoding="utf-8")) != skill_hash(start):
        origin = config.train.skill_init or "the benchmark's initial skill"
        raise ConfigError(f"--run-name {run_name}: the run started from another skill ({snapshot}); "
                          f"{origin} has changed since. Restore it to resume, or start a new run with "
                          "another --run-name")


def _check_credentials(loaded: LoadedConfig, roles: Any, registry: BackendRegistry, env: Mapping[str, str],
                       wanted: Collection[str]) -> None:
    """Per role: the credential, the backend's extras, a model file, the endpoint (``check_role`` without a
    call)."""
    from skillopt.llm.preflight import check_role

    clients = ModelClients.build(roles, loaded=loaded, registry=registry, secrets=EnvSecrets(env),
                                 limiter=_no_limits())
    for role in wanted:
        client = clients.get(role)
        result = check_role(client, env, call=False)
        if not result.ok:
            raise ConfigError(f"{role} ({result.label}): {result.problem}")


def _check_keys(roles: Any, env: Mapping[str, str], wanted: Collection[str]) -> None:
    """Per role: its credential is there (the first check of ``_check_credentials``), without building a
    client or reaching the endpoint."""
    for name in wanted:
        role = getattr(roles, name)
        if role is None or not role.key_required:
            continue
        if not role.api_key_secret and not env.get(role.api_key_env or ""):
            raise ConfigError(f"{name} ({role.label()}): no credential: export {role.api_key_env} or set "
                              f"model.{name}.api_key_env")


def _no_limits() -> Any:
    from skillopt.llm.limiter import NoLimits

    return NoLimits()


def check_image_support(name: str, benchmark: Benchmark, roles: Any, registry: BackendRegistry, *,
                        analyst_images: bool) -> None:
    """A benchmark whose prompts carry images needs a target that takes them, and with
    ``optimizer.analyst_images`` an optimizer that does too."""
    if not benchmark.uses_images:
        return
    from skillopt.llm.capabilities import image_support_problem

    for role in (roles.target, roles.optimizer) if analyst_images else (roles.target,):
        problem = image_support_problem(role.backend, registry.get(role.backend).kind,
                                        role.price_model or role.model, role.options, role.capabilities)
        if problem:
            why = "sends images to the target" if role.role == "target" else "shows images to the analyst " \
                "(optimizer.analyst_images)"
            raise BenchmarkSetupError(
                f"benchmark {name} {why}, but [{role.role}] {role.label()} cannot take them: {problem} "
                f"(model.{role.role}.capabilities.vision)"
            )
