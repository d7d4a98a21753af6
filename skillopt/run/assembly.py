"""Assembling a run from its config: everything a training or evaluation run shares, built once.

``RunSpec`` is the small, picklable description of a run (the resolved config, the CLI's model choice,
the run name, the working directory its relative paths start from, a warm-start skill). ``Run.build``
turns it into the live ``Run``: the benchmark plug-in and its validated config, the resolved roles and
model clients, the run directory, the items of every split and the update mode. A process
that only has the spec (a task on another worker) calls ``open_run(spec)``, which builds the run once per
process and returns the same object afterwards.

Nothing here knows about Prefect: the task layer wraps a ``Run`` in its tasks and chooses their caching.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from skillopt.benchmarks.base import Benchmark, BenchmarkSetupError
from skillopt.benchmarks.resolve import initial_skill as read_initial_skill
from skillopt.benchmarks.resolve import read_prompt, resolve_benchmark
from skillopt.benchmarks.scripted_target import target_rules
from skillopt.core.atomic import check_writable
from skillopt.core.config import LoadedConfig, SkillOptConfig
from skillopt.core.data import EpochPlan, Item, check_train_size, plan_epoch, small_split_warning
from skillopt.core.error_rows import ErrorStreak
from skillopt.llm.base import BackendContext, BackendRegistry, EnvSecrets
from skillopt.llm.clients import ModelClients
from skillopt.llm.context_windows import WINDOWS_FILE, ContextWindows
from skillopt.llm.limiter import RateLimiter
from skillopt.llm.reply_store import ReplyStore
from skillopt.llm.roles import CliRoleOptions, recorded_config
from skillopt.llm.usage import check_startable
from skillopt.optimizer.update_modes import UpdateMode, update_mode_for
from skillopt.run.prefetch import Prefetcher
from skillopt.run.rollouts import RolloutSlots, Slots
from skillopt.run.run_checks import check_image_support
from skillopt.run.runs import RunDir, config_hash, run_directory_name
from skillopt.skill.document import SLOW_UPDATE, inject_block
from skillopt.skill.folder import LoadedSkill, skill_from_text
from skillopt.skill.spec import SkillSpec, skill_name_from

SPLITS = ("train", "val", "test")
#: How a process picks the clients' provider limiter when it builds a run (None from it: the clients' own).
LimiterFor = Callable[[SkillOptConfig], RateLimiter | None]

progress = logging.getLogger("skillopt.progress")


class RunSpec(BaseModel):
    """What any process needs to rebuild a run: small, picklable, JSON-able, and free of secrets.

    ``config`` is the resolved config (``SkillOptConfig.model_dump(mode="json")``), so a worker never re-reads
    config files; credentials still come from the rebuilding process's environment. Relative paths in the
    config (``run.runs_dir``, ``run.cache_dir``, data paths) are relative to ``workdir``.
    """

    model_config = ConfigDict(frozen=True)

    config: dict[str, Any]
    sources: dict[str, str] = Field(default_factory=dict)
    cli_roles: dict[str, Any] = Field(default_factory=dict)
    run_name: str
    workdir: str
    #: A nightly run's warm start from the registry; None = ``train.skill_init``.
    initial_skill: str | None = None

    @classmethod
    def create(cls, loaded: LoadedConfig, *, cli_roles: Mapping[str, Any] | None = None,
               run_name: str | None = None, prefix: str | None = None, initial_skill: str | None = None,
               now: datetime | None = None) -> RunSpec:
        """The spec of a new or resumed run; without a ``run_name`` (argument or ``run.run_name``) a fresh
        one ``<bench>[-<prefix>]-<yyyymmdd-hhmmss>-<config hash>`` is chosen here, once, for every process."""
        config = loaded.config
        name = run_name or run_directory_name(config.benchmark.name or "run", config, prefix=prefix, now=now)
        return cls(config=config.model_dump(mode="json"), sources=dict(loaded.sources),
                   cli_roles=dict(cli_roles or {}), run_name=name, workdir=str(Path.cwd().resolve()),
                   initial_skill=initial_skill)

    def key(self) -> str:
        """The spec's content hash: two specs with the same key build the same run."""
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def loaded(self) -> LoadedConfig:
        return LoadedConfig(config=SkillOptConfig.model_validate(self.config), sources=dict(self.sources))

    def path(self, value: str | Path) -> Path:
        """A config path, resolved against the run's working directory (left as written in that directory, so
        the paths a user sees are the ones they configured)."""
        if Path.cwd().resolve() == Path(self.workdir):
            return Path(value)
        return Path(self.workdir) / value


class Run:
    """The run's shared state: passed to every stage, left out of every cache key.

    A plain class on purpose, not a dataclass or a pydantic model: Prefect walks every task parameter that
    is a collection, dataclass or model in search of futures (when it submits the task and again when it
    resolves the inputs). Walking the items of every split, the config and the clients would cost every task
    time in proportion to the run's size; a plain object is a single leaf.
    """

    def __init__(self, *, spec: RunSpec, loaded: LoadedConfig, benchmark: Benchmark, bench_cfg: BaseModel,
                 clients: ModelClients, dir: RunDir, items: dict[str, Item], split_ids: dict[str, list[str]],
                 initial_skill: str, benchmark_guidance: dict[str, str]) -> None:
        self.spec = spec
        self.loaded = loaded
        self.benchmark = benchmark
        self.bench_cfg = bench_cfg
        self.clients = clients
        self.dir = dir
        self.items = items
        self.split_ids = split_ids
        self.initial_skill = initial_skill
        #: The starting skill as read from disk: its name, front matter and carried (untrained) files.
        self.skill_source = LoadedSkill(text=initial_skill, name=skill_name_from(benchmark.id),
                                        front_matter=False)
        #: The plug-in's analyst guidance, by kind (``error`` for failure analysts, ``success``).
        self.benchmark_guidance = benchmark_guidance
        self.update_mode: UpdateMode = update_mode_for(loaded.config.optimizer)
        #: The config with the models the run calls, as ``config.yaml`` and ``summary.json`` record it
        #: (``skillopt.llm.roles.recorded_config``: the command line's model choices written in).
        self.recorded_config: SkillOptConfig = loaded.config
        #: Error rows in a row across the run's rollouts; ``model.failfast_n`` of them stop the run.
        self.error_streak = ErrorStreak(loaded.config.model.failfast_n)
        #: How another process picks the clients' provider limiter when it rebuilds this run (a module-level
        #: function of the task layer, pickled by reference); None: the clients' own.
        self.limiter_for: LimiterFor | None = None
        #: Rollouts in flight in this process at most, whoever makes them
        #: (``skillopt.run.rollouts.roll_out``):
        #: the flow's tasks, several evaluations at once and the prefetch layer share ``benchmark.workers``.
        self.rollout_slots: Slots = RolloutSlots(int(getattr(bench_cfg, "workers", 4)))
        #: The run's prefetch layer (``skillopt.run.prefetch``), fed hints by the flow and the task layer.
        self.prefetch = Prefetcher(self)

    def __reduce__(self) -> tuple[Any, ...]:
        """A run travels as its spec: a task sent to another process (a Dask worker) carries the small spec,
        and that process rebuilds the run once (``join_run``) instead of receiving clients, locks and
        items."""
        return (join_run, (self.spec, self.limiter_for))

    def __repr__(self) -> str:
        return f"Run(run_name={self.run_name!r}, benchmark={self.benchmark.id!r})"

    @property
    def run_name(self) -> str:
        return self.spec.run_name

    @property
    def config(self) -> SkillOptConfig:
        return self.loaded.config

    @property
    def cache_dir(self) -> Path:
        """Where task results and stored replies live (``run.cache_dir``)."""
        return self.spec.path(self.config.run.cache_dir)

    def served_from_cache(self, key: str) -> bool:
        """Whether the task keyed ``key`` will be served from the result cache: a result is stored under its
        key in ``cache_dir`` (Prefect's local file system there) and the run does not refresh the cache."""
        return not self.config.run.refresh_cache and (self.cache_dir / key).exists()

    @property
    def skill_spec(self) -> SkillSpec:
        """What every candidate must keep of the Agent Skills specification (checked before the gate)."""
        return SkillSpec(name=self.skill_source.name, front_matter=self.skill_source.front_matter)

    def starting_skill(self) -> str:
        """The skill the baseline scores: the initial skill, with the (empty, invisible to the target and to
        the hash) slow-update block when the run uses one."""
        if self.config.optimizer.use_slow_update:
            return inject_block(self.initial_skill, SLOW_UPDATE, "")
        return self.initial_skill

    def epoch_plan(self, epoch: int) -> EpochPlan:
        """The seeded batches of ``epoch`` of the run's train split."""
        train = self.config.train
        return plan_epoch(self.split_ids["train"], seed=train.seed, epoch=epoch, batch_size=train.batch_size,
                          accumulation=train.accumulation)

    def baseline_test_ids(self) -> list[str]:
        """The test items whose rollouts with the starting skill are prefetched at the run's start
        (``skillopt.run.prefetch``): the final stage's test evaluation of that skill needs nothing of the
        training, so its calls need not wait for the end (nor those of the best skill, once the run's last
        step leaves it final). Empty when the run skips the test split, or has a budget cap (a cap must be
        able to stop the run, and then skips the test split, before anything is spent on it)."""
        if not self.config.evaluation.eval_test or self.config.budget.capped:
            return []
        return self.selection_ids("test")

    def rows_of(self, ids: Sequence[str]) -> list[Item]:
        return [self.items[i] for i in ids]

    def selection_ids(self, split: str) -> list[str]:
        """The ids a whole-split evaluation scores: ``evaluation.sel_size`` / ``test_size`` cut val / test."""
        ids = self.split_ids[split]
        sizes = {"val": self.config.evaluation.sel_size, "test": self.config.evaluation.test_size}
        size = sizes.get(split, 0)
        return list(ids[:size] if size else ids)

    @classmethod
    def from_config(cls, loaded: LoadedConfig, *, env: Mapping[str, str] | None = None,
                    run_name: str | None = None, registry: BackendRegistry | None = None) -> Run:
        """The run of a validated config in this process (no CLI model choice, no warm start)."""
        return cls.build(RunSpec.create(loaded, run_name=run_name), env=env, registry=registry, loaded=loaded)

    @classmethod
    def build(cls, spec: RunSpec, *, env: Mapping[str, str] | None = None,
              registry: BackendRegistry | None = None, limiter: RateLimiter | None = None,
              loaded: LoadedConfig | None = None, joining: bool = False) -> Run:
        """Resolve roles, load the benchmark and its splits, open the run directory, build the clients.

        ``limiter`` is the provider limiter shared by the clients (``model.rate_limit_mode: prefect`` needs
        one from the task layer); ``loaded`` saves re-validating the config when the caller has it already.
        ``joining``: this process is a worker of a run its flow holds, so it joins the run directory
        (``RunDir.join``: no lock, no config written) instead of opening it.
        """
        env = os.environ if env is None else env
        loaded = loaded or spec.loaded()
        config = loaded.config
        registry = registry or BackendRegistry.default()
        benchmark, bench_cfg, roles = resolve_benchmark(loaded, cli=CliRoleOptions(**spec.cli_roles), env=env,
                                                        registry=registry, command="skillopt train BENCHMARK")
        name = benchmark.id
        recorded = recorded_config(loaded, roles)  # the models the run calls, as its directory records them
        if benchmark.needs_judge(bench_cfg) and roles.judge_problem:
            raise BenchmarkSetupError(f"benchmark {name} needs the judge role: {roles.judge_problem}")
        check_image_support(name, benchmark, roles, registry, analyst_images=config.optimizer.analyst_images)

        cache_dir = spec.path(config.run.cache_dir)
        check_writable(cache_dir, "run.cache_dir")  # before any call is paid for
        if joining:
            run_dir = RunDir.join(spec.path(config.run.runs_dir), spec.run_name)
        else:
            run_dir = RunDir.open(spec.path(config.run.runs_dir), spec.run_name, recorded.config,
                                  config_hash=config_hash(recorded.config), provenance=recorded.sources)
        items: dict[str, Item] = {}
        split_ids: dict[str, list[str]] = {}
        for split in SPLITS:
            rows = benchmark.load_split(bench_cfg, split, run_dir=run_dir.path)
            split_ids[split] = [row.id for row in rows]
            items.update({row.id: row for row in rows})
        check_train_size(config.train.train_size, len(split_ids["train"]))
        small = small_split_warning({s: len(ids) for s, ids in split_ids.items()},
                                    min_items=config.evaluation.min_split_items,
                                    split_ratio=config.benchmark.split_ratio,
                                    split_mode=getattr(bench_cfg, "split_mode", None)
                                    or benchmark.default_split_mode)
        if small and not joining:  # the flow said it; its workers would only repeat it
            progress.warning("%s", small)

        context = BackendContext(
            run_id=spec.run_name,
            protected_paths=tuple(p for p in (Path(spec.workdir), run_dir.path) if p.exists()),
            scripted_target_rules=target_rules(benchmark.id, bench_cfg),
        )
        # --no-cache recomputes what earlier runs stored, not what this run's own earlier attempts paid for:
        # config.yaml was written when the run first started, and a resume keeps it.
        started = run_dir.config_path.stat().st_mtime if run_dir.config_path.is_file() else None
        replies = ReplyStore(cache_dir / "replies", refresh=config.run.refresh_cache, since=started)
        clients = ModelClients.build(roles, loaded=loaded, registry=registry, secrets=EnvSecrets(env),
                                     context=context, usage_path=run_dir.path / "usage.jsonl",
                                     limiter=limiter, replies=replies,
                                     windows=ContextWindows(run_dir.path / WINDOWS_FILE))
        used = {"target": roles.target, "optimizer": roles.optimizer}
        if benchmark.needs_judge(bench_cfg) and roles.judge is not None:
            used["judge"] = roles.judge
        priced = {role_name: (role.backend, role.price_model) for role_name, role in used.items()}
        check_startable(config.budget, clients.ledger.prices, priced)
        prompts = benchmark.prompts_dir
        guidance = {kind: read_prompt(prompts / f"analyst_{kind}.md") for kind in ("error", "success")}
        guidance["probe"] = read_prompt(prompts / "deep_probe.md")  # optional: the benchmark's probe guidance
        initial = (read_initial_skill(config, prompts, benchmark.id) if spec.initial_skill is None
                   else skill_from_text(spec.initial_skill, default_name=benchmark.id))
        run = cls(spec=spec, loaded=loaded, benchmark=benchmark, bench_cfg=bench_cfg, clients=clients,
                  dir=run_dir, items=items, split_ids=split_ids, initial_skill=initial.text,
                  benchmark_guidance=guidance)
        run.skill_source = initial
        run.recorded_config = recorded.config
        shared = getattr(limiter, "rollout_slots", None)
        if shared is not None:  # a limiter of several processes (a Dask cluster) bounds their rollouts
            run.rollout_slots = shared(f"{spec.run_name}-{spec.key()[:12]}", run.rollout_slots.size)
        return run


class _OpenRuns:
    """The runs this process has built, by spec key: a worker rebuilds a run once, not once per task."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, Run] = {}

    def get(self, spec: RunSpec, build: Callable[[RunSpec], Run]) -> Run:
        key = spec.key()
        with self._lock:
            if key not in self._runs:
                self._runs[key] = build(spec)
            return self._runs[key]

    def add(self, run: Run) -> Run:
        with self._lock:
            self._runs[run.spec.key()] = run
        return run


_open_runs = _OpenRuns()


def open_run(spec: RunSpec, *, limiter_for: LimiterFor | None = None) -> Run:
    """The run ``spec`` describes, built on first use in this process and shared afterwards.

    ``limiter_for(config)`` supplies the clients' provider limiter when the run is built (the task layer's
    Prefect limiter); None: the clients' own."""
    return _open_runs.get(spec, lambda spec: _build(spec, limiter_for, joining=False))


def join_run(spec: RunSpec, limiter_for: LimiterFor | None = None) -> Run:
    """The run ``spec`` describes, in a process that received it from the run's flow (how a ``Run``
    unpickles): the flow's own run in the flow's process, else built once per process as a worker that joins
    the run."""
    return _open_runs.get(spec, lambda spec: _build(spec, limiter_for, joining=True))


def _build(spec: RunSpec, limiter_for: LimiterFor | None, *, joining: bool) -> Run:
    loaded = spec.loaded()
    run = Run.build(spec, loaded=loaded, limiter=limiter_for(loaded.config) if limiter_for else None,
                    joining=joining)
    run.limiter_for = limiter_for
    return run


def remember_run(run: Run) -> Run:
    """Make ``open_run(run.spec)`` in this process return ``run`` (the flow's own, already built run)."""
    return _open_runs.add(run)
