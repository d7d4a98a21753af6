"""Everything one training or evaluation run shares, built once at the start of a flow.

``RunContext`` is passed to every task explicitly (and left out of every cache key): the resolved
config, the benchmark plug-in and its validated config, the model clients, the run directory, the
items of all splits, the content hashes that go into cache keys, and the result storage.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from skillopt.atomic import check_writable
from skillopt.benchmarks.base import Benchmark, BenchmarkSetupError
from skillopt.benchmarks.images import image_digests, item_image_paths
from skillopt.benchmarks.resolve import initial_skill as read_initial_skill
from skillopt.benchmarks.resolve import read_prompt, resolve_benchmark
from skillopt.benchmarks.scripted_target import target_rules
from skillopt.config import LoadedConfig, SkillOptConfig
from skillopt.data import Item, check_train_size, small_split_warning
from skillopt.llm.base import BackendContext, BackendRegistry, EnvSecrets
from skillopt.llm.clients import ModelClients
from skillopt.llm.reply_store import ReplyStore
from skillopt.llm.roles import CliRoleOptions
from skillopt.llm.usage import check_startable
from skillopt.run_checks import check_image_support
from skillopt.runs import RunDir, config_hash, default_run_name
from tasks.cache import digest, result_storage
from tasks.cache_hits import cache_hit_hook

SPLITS = ("train", "val", "test")
progress = logging.getLogger("skillopt.progress")


class RunContext:
    """The run's shared state, passed to every task.

    A plain class on purpose, not a dataclass or a pydantic model: Prefect walks every task parameter that is a
    collection, dataclass or model in search of futures (when it submits the task and again when it resolves the
    inputs). Walking the items of every split, the config and the clients cost ~0.1 s per task on a 400-item
    split (measured with ``bench/run.py``); a plain object is a single leaf.
    """

    def __init__(self, *, loaded: LoadedConfig, benchmark: Benchmark, bench_cfg: BaseModel, clients: ModelClients,
                 run: RunDir, run_name: str, items: dict[str, Item], split_ids: dict[str, list[str]],
                 data_hash: str, bench_prompt_hash: str, storage: Any, initial_skill: str,
                 benchmark_guidance: dict[str, str] | None = None) -> None:
        self.loaded = loaded
        self.benchmark = benchmark
        self.bench_cfg = bench_cfg
        self.clients = clients
        self.run = run
        self.run_name = run_name
        self.items = items
        self.split_ids = split_ids
        self.data_hash = data_hash
        self.bench_prompt_hash = bench_prompt_hash
        self.storage = storage
        self.initial_skill = initial_skill
        self.benchmark_guidance: dict[str, str] = benchmark_guidance or {}

    def __repr__(self) -> str:
        return f"RunContext(run_name={self.run_name!r}, benchmark={self.benchmark.id!r})"

    @property
    def config(self) -> SkillOptConfig:
        return self.loaded.config

    def rows_of(self, ids: Sequence[str]) -> list[Item]:
        return [self.items[i] for i in ids]

    def bind(self, task: Any, **options: Any) -> Any:
        """``task`` with this run's result storage, cache refresh setting and cache-hit accounting.

        The ``llm:<role>`` tags of the model-calling tasks are kept only with ``model.rate_limit_mode: prefect``.
        Prefect asks the server for tag concurrency slots before every tagged task run and remembers "no limit
        for these tags" for only 5 s; with a busy server that round trip held each stage's first tasks for
        2-2.5 s (``bench/run.py``: batch 40, concurrency 16, latency 0.5 s, SQLite). In ``prefect`` mode the
        user has chosen Prefect-side limits, and the tags let them add tag limits per role too.
        """
        if self.config.model.rate_limit_mode != "prefect" and "tags" not in options:
            options["tags"] = set()
        return task.with_options(result_storage=self.storage, refresh_cache=self.config.run.refresh_cache,
                                 on_completion=[cache_hit_hook(self)], **options)


def build_run_context(
    loaded: LoadedConfig,
    *,
    env: Mapping[str, str] | None = None,
    cli: CliRoleOptions | None = None,
    run_name: str | None = None,
    registry: BackendRegistry | None = None,
    prefix: str | None = None,
    initial_skill: str | None = None,
) -> RunContext:
    """Resolve roles, load the benchmark and its splits, open the run directory, prepare the cache.

    ``initial_skill`` replaces ``train.skill_init`` (a nightly run's warm start from the registry).
    """
    env = os.environ if env is None else env
    config = loaded.config
    registry = registry or BackendRegistry.default()
    benchmark, bench_cfg, roles = resolve_benchmark(loaded, cli=cli, env=env, registry=registry,
                                                    command="skillopt train BENCHMARK")
    name = config.benchmark.name
    if benchmark.needs_judge(bench_cfg) and roles.judge_problem:
        raise BenchmarkSetupError(f"benchmark {name} needs the judge role: {roles.judge_problem}")
    check_image_support(name, benchmark, roles, registry, analyst_images=config.optimizer.analyst_images)

    digest_of_config = config_hash(config)
    run_name = run_name or config.run.run_name or default_run_name(
        f"{name}-{prefix}" if prefix else name, digest_of_config, datetime.now())
    check_writable(Path(config.run.cache_dir), "run.cache_dir")  # before any call is paid for
    run = RunDir.open(Path(config.run.runs_dir), run_name, config, config_hash=digest_of_config,
                      provenance=loaded.sources)

    items: dict[str, Item] = {}
    split_ids: dict[str, list[str]] = {}
    for split in SPLITS:
        rows = benchmark.load_split(bench_cfg, split, run_dir=run.path)
        split_ids[split] = [row.id for row in rows]
        items.update({row.id: row for row in rows})
    check_train_size(config.train.train_size, len(split_ids["train"]))
    small = small_split_warning({s: len(ids) for s, ids in split_ids.items()},
                                min_items=config.evaluation.min_split_items, split_ratio=config.benchmark.split_ratio,
                                split_mode=getattr(bench_cfg, "split_mode", None) or benchmark.default_split_mode)
    if small:
        progress.warning("%s", small)

    context = BackendContext(
        run_id=run_name,
        protected_paths=tuple(p for p in (Path.cwd(), run.path) if p.exists()),
        scripted_target_rules=target_rules(benchmark.id, bench_cfg),
    )
    clients = ModelClients.build(roles, loaded=loaded, registry=registry, secrets=EnvSecrets(env), context=context,
                                 usage_path=run.path / "usage.jsonl", limiter=_limiter(config),
                                 replies=ReplyStore(Path(config.run.cache_dir) / "replies",
                                                    refresh=config.run.refresh_cache))
    used = {"target": roles.target, "optimizer": roles.optimizer}
    if benchmark.needs_judge(bench_cfg) and roles.judge is not None:
        used["judge"] = roles.judge
    check_startable(config.budget, clients.ledger.prices,
                    {name: (role.backend, role.price_model) for name, role in used.items()})
    prompts = benchmark.prompts_dir
    guidance = {kind: read_prompt(prompts / f"analyst_{kind}.md") for kind in ("error", "success")}
    initial = read_initial_skill(config, prompts) if initial_skill is None else initial_skill
    return RunContext(
        loaded=loaded, benchmark=benchmark, bench_cfg=bench_cfg, clients=clients, run=run, run_name=run_name,
        items=items, split_ids=split_ids,
        data_hash=_data_hash(items, split_ids),
        bench_prompt_hash=digest([guidance, read_prompt(prompts / "initial_skill.md"), benchmark.version]),
        storage=result_storage(Path(config.run.cache_dir)), initial_skill=initial, benchmark_guidance=guidance,
    )


def _data_hash(items: Mapping[str, Item], split_ids: Mapping[str, Sequence[str]]) -> str:
    """The items of every split plus the content hash of each image they name (paths alone are not enough)."""
    images = {item_id: image_digests(item_image_paths(item)) for item_id, item in items.items()
              if item_image_paths(item)}
    return digest({"splits": {s: [items[i] for i in split_ids[s]] for s in SPLITS}, "images": images})


def _limiter(config: SkillOptConfig) -> Any:
    if config.model.rate_limit_mode != "prefect":
        return None
    from tasks.limits import PrefectRateLimiter

    return PrefectRateLimiter(config.model.providers)
