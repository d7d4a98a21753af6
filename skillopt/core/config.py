"""The configuration tree: pydantic models, YAML files with ``_base_`` inheritance, overrides.

Layers, lowest first:

1. defaults — the pydantic models below;
2. environment — ``SKILLOPT_<ROLE>_<KEY>`` for the model roles, used only where no YAML file
   gives a non-null value;
3. YAML — the benchmark's config (``configs/<benchmark>.yaml``) and then the user's file
   (``-c FILE``), each merged over its ``_base_`` chain (dicts deep-merge, lists and scalars
   replace);
4. overrides — ``-o section.key=value``, applied in order, each value converted by the type of
   the field it targets.

``load_config`` returns a ``LoadedConfig``: the validated ``SkillOptConfig`` plus the source of
every value. Errors are ``ConfigError`` messages that name the key and the file or override it
came from, suggest the closest valid key for a typo, and never echo a value (it might be a
secret). Credentials are references only: a literal key anywhere in YAML or ``-o`` is refused.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from skillopt.core.errors import ConfigError
from skillopt.core.redact import (
    Redactor,
    is_free_form,
    looks_like_secret,
    names_credential,
    redact_tree,
    url_has_credentials,
)
from skillopt.core.resources import shipped_config_names, shipped_dir

# --------------------------------------------------------------------------------------------
# Field types


def _parse_bool(value: Any) -> Any:
    """Booleans accept only true/false/yes/no/1/0, in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("true", "yes", "1"):
            return True
        if word in ("false", "no", "0"):
            return False
    raise ValueError("expected a boolean: one of true, false, yes, no, 1, 0")


Bool = Annotated[bool, BeforeValidator(_parse_bool)]

BackendName = Literal[
    "openai",
    "azure_openai",
    "anthropic",
    "openai_compatible",
    "codex_exec",
    "claude_code_exec",
    "local",
    "scripted",
]
#: Short names users may write for a backend; normalised before validation.
BACKEND_ALIASES = {"azure": "azure_openai", "claude": "anthropic", "compat": "openai_compatible"}
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "max"]
ROLES = ("target", "optimizer", "judge")


def _normalise_backend(value: Any) -> Any:
    if isinstance(value, str):
        return BACKEND_ALIASES.get(value.strip().lower(), value.strip().lower())
    return value


class KeyConflict(ValueError):
    """A rule across keys, broken. ``text`` has ``{0}``, ``{1}``… for the keys it names; each of ``keys`` is
    (dotted key, how to show it, such as ``optimizer.learning_rate 1``). The error report puts where each
    value came from after it: the error is about the pair, not about the one key it is raised on."""

    def __init__(self, text: str, *keys: tuple[str, str]) -> None:
        self.text, self.keys = text, keys
        super().__init__(text.format(*(shown for _, shown in keys)))

    def with_sources(self, source_of: Callable[[str], str]) -> str:
        return self.text.format(*(f"{shown} (from {source_of(key)})" for key, shown in self.keys))


def _placeholders(first: int, count: int) -> str:
    """``{1}, {2}`` … : the placeholders of ``count`` keys of a ``KeyConflict``, from key ``first`` on."""
    return ", ".join(f"{{{i}}}" for i in range(first, first + count))


class _Section(BaseModel):
    """Base of every config model: unknown keys are errors, types are not coerced loosely."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


# --------------------------------------------------------------------------------------------
# model: roles, providers, retries


class RoleSpec(_Section):
    """Settings of one model role. ``None`` means "defer": the backend's own default applies."""

    backend: Annotated[BackendName, BeforeValidator(_normalise_backend)] = "openai"
    model: str | None = None
    price_model: str | None = None
    reasoning_effort: ReasoningEffort | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    seed: int | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_secret: str | None = None
    rate_limit_key: str | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)
    capabilities: dict[str, Any] = Field(default_factory=dict)
    strict_params: Bool = False
    #: The model's context window in tokens; unset: what the backend reports, else the known-models table.
    context_tokens: int | None = Field(default=None, ge=256)
    #: How structured calls ask for their shape: auto | json_schema | json_object | prompt
    #: (see skillopt.llm.structured_output).
    structured_output: Literal["auto", "json_schema", "json_object", "prompt"] = "auto"

    @field_validator("base_url")
    @classmethod
    def _an_http_url(cls, value: str | None) -> str | None:
        """A URL the HTTP clients can call (a typo here once crashed the endpoint probe, or was retried as a
        connection failure for minutes)."""
        if value is not None and (problem := http_url_problem(value)):
            raise ValueError(problem)
        return value


def http_url_problem(url: str) -> str | None:
    """What keeps ``url`` from being one the HTTP clients can call (http or https, a host, a port that
    parses), or None. Also the endpoint probe's check of a URL taken from an environment variable."""
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https"):
        return f"{url!r} is not an http:// or https:// URL"
    if not parsed.hostname:
        return f"{url!r} names no host"
    try:
        parsed.port  # noqa: B018 - reading it validates it
    except ValueError as error:
        return f"{url!r}: {str(error).lower()}"
    return None


class TargetSpec(RoleSpec):
    max_tokens: int | None = Field(default=4096, ge=1)


class OptimizerSpec(RoleSpec):
    max_tokens: int | None = Field(default=16384, ge=1)


class JudgeSpec(RoleSpec):
    """The judge; without its own block it inherits the optimizer's connection."""

    backend: Annotated[BackendName, BeforeValidator(_normalise_backend)] | None = None  # type: ignore[assignment]
    max_tokens: int | None = Field(default=512, ge=1)
    temperature: float | None = Field(default=0.0, ge=0, le=2)


class ProviderLimits(_Section):
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    max_concurrency: int | None = Field(default=None, ge=1)


class RetryPolicy(_Section):
    base: float = Field(default=1.0, gt=0)
    cap: float = Field(default=60.0, gt=0)
    max_attempts: int = Field(default=6, ge=1)
    deadline_s: float = Field(default=600.0, gt=0)
    max_server_wait_s: float = Field(default=300.0, ge=0)
    #: How long one call keeps retrying while the provider answers 429 (rate limited), counted from the
    #: first 429; within it ``max_attempts`` does not apply to 429s. Past it the call fails and says so.
    rate_limit_patience_s: float = Field(default=300.0, ge=0)


class ModelSection(_Section):
    target: TargetSpec = Field(default_factory=TargetSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    # ``model.judge: null`` switches the judge off; benchmarks that need one then fail preflight.
    judge: JudgeSpec | None = Field(default_factory=JudgeSpec)
    providers: dict[str, ProviderLimits] = Field(default_factory=dict)
    rate_limit_mode: Literal["local", "prefect", "off"] = "local"
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    #: This many error rows in a row (model calls that failed after their retries) stop the run.
    failfast_n: int = Field(default=5, ge=1)
    pricing_file: str | None = None
    #: Named target models (``skillopt transfer --targets NAME``, ``skillopt compare --target NAME``): each a
    #: ``model.target`` block of its own, used in place of ``model.target`` for that evaluation.
    targets: dict[str, TargetSpec] = Field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Training sections


class TrainSection(_Section):
    epochs: int = Field(default=4, ge=1)
    batch_size: int = Field(default=40, ge=1)
    accumulation: int = Field(default=1, ge=1)
    seed: int = 42
    train_size: int = Field(default=0, ge=0)
    skill_init: str | None = None
    #: Training rollouts are new draws each epoch (keyed by epoch and sample index); false replays the
    #: cached rollouts of an unchanged skill in later epochs (enough for a temperature-0 target).
    resample_each_epoch: Bool = True
    #: What the run keeps: ``best`` one current skill; ``pareto`` every accepted candidate that is best on
    #: some selection item or on some objective (``evaluation.objectives``), any of which a later step may
    #: start from (``skillopt.optimizer.pareto``).
    selection: Literal["best", "pareto"] = "best"


class SkillSection(_Section):
    """How a skill folder is trained and shown to the target (docs/skills.md)."""

    #: ``inline``: chat targets get SKILL.md's body with each other text file rendered after it;
    #: ``progressive``: the files listed by name with a tool to read them (needs a benchmark with tools).
    render: Literal["inline", "progressive"] = "inline"
    #: Train the text files under ``scripts/`` too (by default they are carried unchanged, like binaries).
    train_scripts: Bool = False
    #: The largest text file a skill folder may hold, in bytes; a larger one is an input error.
    max_file_bytes: int = Field(default=262_144, ge=1)

    @field_validator("render")
    @classmethod
    def _progressive_unsupported(cls, value: str) -> str:
        if value == "progressive":
            raise ValueError(
                "progressive rendering needs a benchmark whose target has tools to read the reference files; "
                "the built-in benchmarks' chat targets have none, so use skill.render: inline")
        return value


class GradientSection(_Section):
    minibatch_size: int = Field(default=8, ge=1)
    merge_batch_size: int = Field(default=8, ge=2)
    analyst_workers: int = Field(default=16, ge=1)
    failure_only: Bool = False
    deep_probe: Bool = False
    deep_probe_failures: int = Field(default=4, ge=0)
    deep_probe_successes: int = Field(default=2, ge=0)
    #: A cap on each trajectory an optimizer prompt shows, in tokens; unset: a prompt's trajectories share the
    #: room the optimizer's context window leaves after the rest of the prompt and the reply.
    trajectory_tokens: int | None = Field(default=None, ge=64)


class OptimizerSection(_Section):
    learning_rate: int = Field(default=4, ge=0)
    min_learning_rate: int = Field(default=2, ge=0)
    lr_scheduler: Literal["constant", "linear", "cosine"] = "cosine"
    lr_control_mode: Literal["fixed", "autonomous"] = "fixed"
    skill_update_mode: Literal["patch", "rewrite_from_suggestions", "full_rewrite_minibatch"] = "patch"
    #: Steps in a row whose optimizer replies were all unusable before the run stops (exit 2); 0: never.
    max_unusable_steps: int = Field(default=3, ge=0)
    use_slow_update: Bool = True
    slow_update_samples: int = Field(default=20, ge=1)
    longitudinal_pair_policy: Literal["mixed", "changed", "unchanged"] = "mixed"
    slow_update_gate: Bool = False
    use_meta_skill: Bool = True
    use_appendix: Bool = False
    #: Show the analyst the images of the items it reflects on (as image inputs); off, it sees only
    #: ``[image] <name>`` references in the trajectories.
    analyst_images: Bool = False

    @model_validator(mode="after")
    def _min_not_above_max(self) -> OptimizerSection:
        if self.min_learning_rate > self.learning_rate:
            raise KeyConflict(
                "{0} is below {1}: lower optimizer.min_learning_rate or raise optimizer.learning_rate",
                ("optimizer.learning_rate", f"optimizer.learning_rate {self.learning_rate}"),
                ("optimizer.min_learning_rate", f"optimizer.min_learning_rate {self.min_learning_rate}"))
        return self


#: An objective beside the score (``evaluation.objectives``), each one smaller-is-better.
Objective = Literal["skill_tokens", "target_tokens", "cost"]


class EvaluationSection(_Section):
    use_gate: Bool = True
    gate_metric: Literal["hard", "soft", "mixed"] = "hard"
    gate_mixed_weight: float = Field(default=0.5, ge=0, le=1)
    gate_test: Literal["strict", "paired"] = "strict"
    gate_alpha: float = Field(default=0.1, gt=0, lt=1)
    sel_size: int = Field(default=0, ge=0)
    test_size: int = Field(default=0, ge=0)
    eval_test: Bool = True
    #: A split smaller than this gets a warning at the start of a run (0: never).
    min_split_items: int = Field(default=10, ge=0)
    #: A gate where more than this share of the selection items are error rows skips the step instead
    #: of deciding.
    max_error_share: float = Field(default=0.1, ge=0, le=1)
    #: Objectives beside the score, each minimised, for ``train.selection: pareto`` and the report's front:
    #: ``skill_tokens`` (the skill's length), ``target_tokens`` and ``cost`` (the target's per item).
    objectives: list[Objective] = Field(default_factory=lambda: list[Objective](["skill_tokens"]))


class BudgetSection(_Section):
    max_usd: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_calls: int | None = Field(default=None, ge=1)
    allow_unpriced: Bool = False
    hard_factor: float = Field(default=1.2, ge=1)

    @property
    def capped(self) -> bool:
        """Whether any cap (USD, tokens, calls) is set."""
        return not (self.max_usd is None and self.max_tokens is None and self.max_calls is None)


class BenchmarkSection(_Section):
    """Keys every benchmark shares.

    Benchmark-specific keys are kept as extras here and validated by the benchmark plug-in's
    own ``Config`` model when the plug-in is loaded, so a config loads without its code.
    """

    model_config = ConfigDict(extra="allow", strict=True, validate_default=True)

    name: str | None = None
    split_mode: Literal["split_dir", "ratio", "generated"] | None = None
    split_dir: str | None = None
    data_path: str | None = None
    split_ratio: str = "2:1:7"
    split_seed: int = 42
    split_output_dir: str | None = None
    limit: int = Field(default=0, ge=0)
    max_turns: int = Field(default=1, ge=1)
    exec_timeout: float = Field(default=120, gt=0)
    task_timeout: float = Field(default=0, ge=0)
    #: How long one item may take; unset: derived from the role timeouts, turns and retries
    #: (skillopt.benchmarks.item_limit; ``skillopt config show`` prints it). An item past it is an error row.
    item_timeout_s: float | None = Field(default=None, gt=0)
    image_detail: Literal["auto", "low", "high"] = "auto"
    workers: int = Field(default=16, ge=1)
    #: How model-written code runs: ``bwrap`` (bubblewrap OS sandbox; the run stops before its first
    #: rollout when none can be made) or ``none`` (no OS sandbox, at the user's risk; warned every run).
    sandbox: Literal["bwrap", "none"] = "bwrap"

    @field_validator("split_ratio")
    @classmethod
    def _split_ratio_parses(cls, value: str) -> str:
        """A malformed ratio is reported when the config loads, with the message a split would give."""
        from skillopt.core.data import parse_split_ratio

        try:
            parse_split_ratio(value)
        except ConfigError as error:
            raise ValueError(str(error).removeprefix("benchmark.split_ratio ")) from None
        return value


class RunSection(_Section):
    runs_dir: str = "runs"
    run_name: str | None = None
    cache_dir: str = ".skillopt/cache"
    refresh_cache: Bool = False
    #: Base URL under which the run directories are served (e.g. the compose `reports` server); the report
    #: link artifact points at <reports_url>/<run-name>/report.html. Unset: a file:// link to the run
    #: directory.
    reports_url: str | None = None
    #: The skill registry (skillopt.run.registry): promoted skills that nightly runs warm-start from.
    skills_dir: str = "skills"
    #: The Prefect API a command-line run uses when none is configured (``PREFECT_API_URL`` or a profile) and
    #: no local server runs: ``background`` starts the local server of ``skillopt server start`` and leaves it
    #: up for later runs (``skillopt server stop`` stops it); ``temporary`` starts Prefect's throwaway server
    #: for this run only (also ``--ephemeral``, or ``SKILLOPT_PREFECT_SERVER=temporary``).
    prefect_server: Literal["background", "temporary"] = "background"
    #: Where the rollouts run: ``threads`` (a bounded pool in the flow's process, ``benchmark.workers``
    #: wide) or ``dask`` (prefect-dask's DaskTaskRunner on a Dask cluster; the ``dask`` extra).
    task_runner: Literal["threads", "dask"] = "threads"
    #: With ``dask``: the scheduler of a running cluster (``tcp://host:8786``). Unset: a local cluster of
    #: worker processes on this machine, started for the run and stopped after it.
    dask_address: str | None = None
    #: The local cluster's worker processes and threads per worker (unset: Dask's defaults from the CPU
    #: count).
    dask_n_workers: int | None = Field(default=None, ge=1)
    dask_threads_per_worker: int | None = Field(default=None, ge=1)
    #: What goes to the cluster: ``rollouts`` (rollouts and their judge calls; the optimizer's few calls
    #: stay in the flow's process) or ``rollouts_and_analysts`` (the analysts' reflections too).
    dask_scope: Literal["rollouts", "rollouts_and_analysts"] = "rollouts"
    #: With ``dask``: the longest the run waits on the cluster while no task of its finishes (no workers
    #: left, the scheduler gone or frozen, results that cannot be gathered). Then it stops with exit 2 and
    #: a re-run resumes from the cache. Keep it above the longest single rollout.
    dask_timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _dask_keys_fit_the_runner(self) -> RunSection:
        local_cluster = {
            "run.dask_n_workers": self.dask_n_workers,
            "run.dask_threads_per_worker": self.dask_threads_per_worker,
        }
        if self.task_runner != "dask":
            given = [key for key, value in {"run.dask_address": self.dask_address, **local_cluster}.items()
                     if value is not None]
            if given:
                raise KeyConflict("{0}: " + _placeholders(1, len(given)) + " needs run.task_runner: dask",
                                  ("run.task_runner", f"run.task_runner is {self.task_runner}"),
                                  *((key, key) for key in given))
        elif self.dask_address is not None:
            given = [key for key, value in local_cluster.items() if value is not None]
            if given:
                raise KeyConflict("{0}: " + _placeholders(1, len(given)) + " sizes a local cluster, but the "
                                  "cluster is the one at that address",
                                  ("run.dask_address", "run.dask_address is set"),
                                  *((key, key) for key in given))
        return self


class SkillOptConfig(_Section):
    """The whole configuration of one training or evaluation run."""

    model: ModelSection = Field(default_factory=ModelSection)
    train: TrainSection = Field(default_factory=TrainSection)
    skill: SkillSection = Field(default_factory=SkillSection)
    gradient: GradientSection = Field(default_factory=GradientSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    evaluation: EvaluationSection = Field(default_factory=EvaluationSection)
    budget: BudgetSection = Field(default_factory=BudgetSection)
    benchmark: BenchmarkSection = Field(default_factory=BenchmarkSection)
    run: RunSection = Field(default_factory=RunSection)


# --------------------------------------------------------------------------------------------
# YAML 1.2 core loading


class _CoreLoader(yaml.SafeLoader):
    """A safe loader restricted to YAML 1.2 core scalars.

    No sexagesimal numbers (``2:1:7`` stays a string), no ``yes``/``on`` booleans, no
    timestamps, no leading-zero octals; duplicate keys in one mapping are errors.
    """


_CoreLoader.yaml_implicit_resolvers = {}
for _tag, _regexp, _first in (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
):
    _CoreLoader.add_implicit_resolver(_tag, re.compile(_regexp), list(_first))


def _construct_core_int(loader: _CoreLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    assert isinstance(text, str)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


def _construct_mapping_no_duplicates(loader: _CoreLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {mark.line + 1})", mark
            )
        seen[key] = True
    return loader.construct_mapping(node)


_CoreLoader.add_constructor("tag:yaml.org,2002:int", _construct_core_int)
_CoreLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping_no_duplicates)


def parse_yaml_text(text: str, *, source: str) -> Any:
    """Parse YAML 1.2-core text; syntax errors become ``ConfigError`` naming ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_CoreLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or "invalid YAML"
        raise ConfigError(f"{source}:{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML ({type(exc).__name__})") from None


# --------------------------------------------------------------------------------------------
# Layers and provenance

#: Provenance label of values that come from the models' own defaults.
DEFAULT_SOURCE = "default"
#: The provenance of a value from a config file shipped with skillopt (``configs/``).
SHIPPED_SOURCE_PREFIX = "shipped:"
#: The provenance of a value from a file in the working directory's ``configs/`` folder, where a benchmark's
#: own config is looked for before the shipped one (``find_benchmark_config``).
LOCAL_CONFIGS_SOURCE_PREFIX = "yaml:configs/"


def is_benchmark_config_source(source: str) -> bool:
    """Whether ``source`` is a benchmark's own config file or a ``_base_`` of it: a shipped file, or one in
    the working directory's ``configs/`` folder (a copy of the shipped configs that takes their place)."""
    return source.startswith((SHIPPED_SOURCE_PREFIX, LOCAL_CONFIGS_SOURCE_PREFIX))

Path_ = tuple[str, ...]


@dataclass
class _Layered:
    """A raw config dict being built layer by layer, with the source of every leaf."""

    data: dict[str, Any] = field(default_factory=dict)
    sources: dict[Path_, str] = field(default_factory=dict)

    def set(self, path: Path_, value: Any, source: str) -> None:
        node = self.data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
        self._forget_below(path)
        for leaf_path, _ in _leaves(value, path):
            self.sources[leaf_path] = source

    def merge(self, other: Mapping[str, Any], sources: Mapping[Path_, str]) -> None:
        """Deep-merge ``other`` over this: dicts merge, lists and scalars replace."""
        for path, value in _leaves(other, ()):
            if _is_role_field(path) and value is None:
                continue  # a YAML null on a role field defers to lower layers
            self.set(path, value, sources.get(path, "yaml"))

    def _forget_below(self, path: Path_) -> None:
        stale = [p for p in self.sources if len(p) > len(path) and p[: len(path)] == path]
        for p in stale:
            del self.sources[p]
        for i in range(1, len(path)):
            self.sources.pop(path[:i], None)

    def get(self, path: Path_) -> Any:
        node: Any = self.data
        for part in path:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node


def _leaves(value: Any, prefix: Path_) -> Iterable[tuple[Path_, Any]]:
    """The leaves of a nested dict; an empty dict is a leaf of its own (so it can replace)."""
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from _leaves(child, (*prefix, str(key)))
    elif prefix:
        yield prefix, value


def _is_role_field(path: Path_) -> bool:
    return len(path) >= 3 and path[0] == "model" and path[1] in ROLES


def _dotted(path: Sequence[Any]) -> str:
    return ".".join(str(p) for p in path)


# --------------------------------------------------------------------------------------------
# Literal secrets

_SECRET_KEY_NAMES = {
    "api_key", "apikey", "key", "token", "secret", "password", "passwd", "access_token", "auth_token",
    "api_token", "bearer_token", "client_secret", "secret_key", "private_key",
}
#: Names too plain to mean a secret outside the ``model`` section (``evaluation.key`` is a mistyped key).
_PLAIN_SECRET_NAMES = {"key", "token", "secret"}
_CONVENTIONAL_KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "azure_openai": "AZURE_OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "openai_compatible": "OPENAI_COMPATIBLE_API_KEY",
    "claude_code_exec": "ANTHROPIC_API_KEY",
    "codex_exec": "OPENAI_API_KEY",
}


#: Backends that send no key anywhere: a key written for their role is only removed.
_KEYLESS_BACKENDS = frozenset({"scripted", "local"})

_LITERAL_KEY = "literal keys are not accepted"
_URL_CREDENTIALS = "credentials in a URL (user:password@host) are not accepted; remove them from the URL and"
_CREDENTIAL_FIELD = "credentials are not accepted in request bodies or headers; remove the key and"


class _SecretRefused(ConfigError):
    """The refusal of a secret written into config. It names the key, where it was set and the conventional
    variable of the backend ``raw_backends`` (the backends known where it was found) gives its role, never the
    value; ``load_config`` words it again once the backend the role ends up with is known (a later layer or a
    command-line option may name another)."""

    def __init__(self, path: Path_, source: str, raw_backends: Mapping[str, Any],
                 reason: str = _LITERAL_KEY) -> None:
        self.path, self.source, self.reason = path, source, reason
        self.role = path[1] if len(path) >= 2 and path[0] == "model" and path[1] in ROLES else None
        self.backend = raw_backends.get(self.role) if self.role else None
        backend = str(_normalise_backend(self.backend or "openai"))
        if self.role is not None and backend in _KEYLESS_BACKENDS:
            super().__init__(f"{source}: {_dotted(path)}: secrets are not accepted in config, and the "
                             f"{backend} backend needs no key: remove it")
            return
        if self.role is not None:
            variable = _CONVENTIONAL_KEY_ENV.get(backend, "OPENAI_API_KEY")
            fix = f"export {variable} or set model.{self.role}.api_key_env"
        else:
            fix = ("put the secret in an environment variable and reference it by name "
                   "(model.<role>.api_key_env)")
        joiner = "; " if reason == _LITERAL_KEY else " "
        super().__init__(f"{source}: {_dotted(path)}: {reason}{joiner}{fix}")

    def for_backend(self, backend: Any) -> _SecretRefused:
        """The same refusal naming the conventional variable of ``backend``."""
        return _SecretRefused(self.path, self.source, {str(self.role): backend}, self.reason)


def _check_no_literal_secrets(
    tree: Any, sources: Mapping[Path_, str] | str, raw_backends: Mapping[str, Any]
) -> None:
    """Refuse secrets written into config: ``api_key``-like keys, key-shaped values, the userinfo of a
    URL, and credential-named keys (``Authorization``, ``api-key``…) in free-form bodies and headers."""
    for path, value in _leaves(tree, ()):
        source = sources if isinstance(sources, str) else sources.get(path, "yaml")
        name = path[-1].lower().replace("-", "_")
        secret_name = name in _SECRET_KEY_NAMES and (name not in _PLAIN_SECRET_NAMES or path[0] == "model")
        if secret_name and value not in (None, ""):
            raise _SecretRefused(path, source, raw_backends)
        if isinstance(value, str) and looks_like_secret(value):
            raise _SecretRefused(path, source, raw_backends)
        if isinstance(value, list) and any(isinstance(v, str) and looks_like_secret(v) for v in value):
            raise _SecretRefused(path, source, raw_backends)
        strings = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and url_has_credentials(v) for v in strings):
            raise _SecretRefused(path, source, raw_backends, _URL_CREDENTIALS)
        if (
            any(is_free_form(part) for part in path[:-1])
            and names_credential(path[-1])
            and value not in (None, "")
        ):
            raise _SecretRefused(path, source, raw_backends, _CREDENTIAL_FIELD)


def _role_backends(data: Mapping[str, Any]) -> dict[str, Any]:
    model = data.get("model") if isinstance(data, Mapping) else None
    if not isinstance(model, Mapping):
        return {}
    # Only roles that name a backend: a layer that does not must not hide the backend a lower layer named.
    return {r: (model.get(r) or {}).get("backend") for r in ROLES
            if isinstance(model.get(r) or {}, Mapping) and (model.get(r) or {}).get("backend")}


# --------------------------------------------------------------------------------------------
# Files


def source_label(path: Path) -> str:
    """How a config file is named in provenance and errors: shipped files by name, others as given."""
    resolved = path.resolve()
    shipped = shipped_dir("configs").resolve()
    if resolved.is_relative_to(shipped):
        return f"{SHIPPED_SOURCE_PREFIX}configs/{resolved.relative_to(shipped).as_posix()}"
    try:
        return f"yaml:{resolved.relative_to(Path.cwd().resolve()).as_posix()}"
    except ValueError:
        return f"yaml:{resolved.as_posix()}"


def read_config_file(path: Path, *, _stack: tuple[Path, ...] = (), _check_secrets: bool = True,
                     ) -> tuple[dict[str, Any], dict[Path_, str]]:
    """Read one YAML config with its ``_base_`` chain, returning the merged dict and leaf sources.

    ``_base_`` (a path or a list of paths) is resolved relative to the file; a name that does not
    exist there falls back to the shipped config of that name, so a user file may say
    ``_base_: searchqa.yaml``. Cycles, missing files, non-UTF-8 text and non-mapping documents
    are errors naming the file.
    """
    resolved = path.resolve()
    label = source_label(path)
    if resolved in _stack:
        chain = " -> ".join(source_label(p) for p in (*_stack, resolved))
        raise ConfigError(f"{label}: _base_ cycle: {chain}")
    if not resolved.is_file():
        raise ConfigError(f"config file not found: {path}")
    raw = resolved.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: not UTF-8 text (invalid byte at offset {exc.start})") from None
    document = parse_yaml_text(text, source=label)
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(f"{label}: the top level must be a mapping of sections, not "
                          f"{type(document).__name__}")
    for key in document:
        if not isinstance(key, str):
            raise ConfigError(f"{label}: top-level keys must be strings")

    bases = document.pop("_base_", None)
    if bases is None:
        bases = []
    elif isinstance(bases, str):
        bases = [bases]
    elif not (isinstance(bases, list) and all(isinstance(b, str) for b in bases)):
        raise ConfigError(f"{label}: _base_ must be a file name or a list of file names")

    if _check_secrets:
        _check_no_literal_secrets(document, label, _role_backends(document))

    layered = _Layered()
    for base in bases:
        base_path = _resolve_base(resolved, base, label)
        data, sources = read_config_file(base_path, _stack=(*_stack, resolved), _check_secrets=_check_secrets)
        layered.merge(data, sources)
    layered.merge(document, {p: label for p, _ in _leaves(document, ())})
    return layered.data, layered.sources


def _resolve_base(including_file: Path, base: str, label: str) -> Path:
    candidate = (including_file.parent / base).resolve()
    if candidate.is_file():
        return candidate
    shipped = shipped_dir("configs") / Path(base).name
    if not Path(base).is_absolute() and shipped.is_file():
        return shipped
    raise ConfigError(f"{label}: _base_ file not found: {base} (looked next to the file and among shipped "
                      "configs)")


def find_benchmark_config(name: str, *, cwd: Path | None = None) -> Path:
    """The config file of benchmark ``name``: ``./configs/<name>.yaml`` if present, else the shipped one."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ConfigError(f"benchmark name {name!r} may contain only letters, digits, '.', '_' and '-'")
    local = (cwd or Path.cwd()) / "configs" / f"{name}.yaml"
    if local.is_file():
        return local
    shipped = shipped_dir("configs") / f"{name}.yaml"
    if shipped.is_file():
        return shipped
    if name in _registered_benchmarks():
        # A third-party plug-in without a config file of its own starts from the shared defaults.
        return shipped_dir("configs") / "_base_.yaml"
    known = sorted(
        set(shipped_config_names()) | _local_config_names(cwd or Path.cwd()) | _registered_benchmarks()
    )
    hint = difflib.get_close_matches(name, known, n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    raise ConfigError(f"no config for benchmark {name!r}{suggestion or '.'} Known: {', '.join(known)}.")


def _registered_benchmarks() -> set[str]:
    """Names registered under the ``skillopt.benchmarks`` entry points (read without importing them)."""
    from importlib.metadata import entry_points

    return {entry.name for entry in entry_points(group="skillopt.benchmarks")}


def _local_config_names(cwd: Path) -> set[str]:
    folder = cwd / "configs"
    if not folder.is_dir():
        return set()
    return {p.stem for p in folder.glob("*.yaml") if not p.stem.startswith("_")}


# --------------------------------------------------------------------------------------------
# Typed parsing of overrides and environment values


def _field_annotation(path: Path_, root: type[BaseModel] = SkillOptConfig) -> Any:
    """The annotation of the field at ``path`` under ``root``, or ``None`` when it is free-form."""
    model: Any = root
    annotation: Any = None
    for part in path:
        model = _unwrap_model(annotation) if annotation is not None else model
        if model is None or not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        info = model.model_fields.get(part)
        if info is None:
            return None
        annotation = info.annotation
    return annotation


def _unwrap_model(annotation: Any) -> Any:
    for candidate in _union_members(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _union_members(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _union_members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        members: list[Any] = []
        for arg in typing.get_args(annotation):
            members.extend(_union_members(arg))
        return members
    return [annotation]


def _keeps_raw_text(annotation: Any) -> bool:
    """String and enum fields keep the raw text of an override (``on``, ``1:1:1`` stay strings)."""
    members = [m for m in _union_members(annotation) if m is not type(None)]
    return bool(members) and all(m is str or typing.get_origin(m) is Literal for m in members)


def _is_nullable(annotation: Any) -> bool:
    return type(None) in _union_members(annotation)


def convert_text(path: Path_, text: str, *, source: str, benchmark: Any = None) -> Any:
    """Convert the text of ``-o path=text`` (or an environment value) by the target field's type.

    ``null`` gives None for nullable fields; string and enum fields keep the raw text; every
    other field parses the text with YAML 1.2 core rules. The keys of ``benchmark`` itself
    (``benchmark.<key>`` beyond the shared ones) are typed by its plug-in's ``Config``.
    """
    annotation = _field_annotation(path)
    if annotation is None and path[0] == "benchmark":
        plugin_config = _plugin_config(benchmark)
        if plugin_config is not None:
            annotation = _field_annotation(path[1:], root=plugin_config)
    if annotation is not None and _is_nullable(annotation) and text.strip() in ("null", "~", "Null", "NULL"):
        return None
    if annotation is not None and _keeps_raw_text(annotation):
        return text
    return parse_yaml_text(text, source=source)


def _plugin_config(name: Any) -> type[BaseModel] | None:
    """The ``Config`` model of the benchmark plug-in registered as ``name``, read through its entry point
    (core imports no plug-in by name). None when there is none or it does not import here (a missing
    extra): its keys are then read as YAML, and the run reports what the plug-in needs."""
    from importlib.metadata import entry_points

    if not isinstance(name, str):
        return None
    for entry in entry_points(group="skillopt.benchmarks", name=name):
        try:
            model = getattr(entry.load(), "Config", None)
        except Exception:  # noqa: BLE001 - any import failure leaves the keys to YAML, as without a plug-in
            return None
        return model if isinstance(model, type) and issubclass(model, BaseModel) else None
    return None


def parse_override(item: str) -> tuple[Path_, str]:
    """Split ``section.key=value`` into the key path and the raw text."""
    if "=" not in item:
        raise ConfigError(f"override {item.split('=')[0]!r} must look like section.key=value")
    key, text = item.split("=", 1)
    key = key.strip()
    parts = tuple(key.split("."))
    if not key or any(not p or not re.fullmatch(r"[A-Za-z0-9_\-:/]+", p) for p in parts):
        raise ConfigError(f"override key {key!r} must be a dotted path like optimizer.learning_rate")
    return parts, text


def _environment_layer(env: Mapping[str, str]) -> list[tuple[Path_, str, str]]:
    """``SKILLOPT_<ROLE>_<KEY>`` variables as (path, raw text, variable name), sorted by name."""
    found = []
    role_fields = set(RoleSpec.model_fields)
    for name in sorted(env):
        match = re.fullmatch(r"SKILLOPT_(TARGET|OPTIMIZER|JUDGE)_([A-Z0-9_]+)", name)
        if not match:
            continue
        role, key = match.group(1).lower(), match.group(2).lower()
        path: Path_ = ("model", role, key) if key in role_fields else ("model", role, "options", key)
        found.append((path, env[name], name))
    return found


# --------------------------------------------------------------------------------------------
# Validation errors


def _format_validation_error(exc: ValidationError, sources: Mapping[Path_, str]) -> ConfigError:
    def origin(loc: Path_) -> str:
        source = _source_for(loc, sources)
        return "built-in default" if source == DEFAULT_SOURCE else source

    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = tuple(str(p) for p in error["loc"])
        conflict = error.get("ctx", {}).get("error")
        if isinstance(conflict, KeyConflict):
            lines.append(conflict.with_sources(lambda dotted: origin(tuple(dotted.split(".")))))
            continue
        if error["type"] == "extra_forbidden":
            message = f"unknown key{_suggestion(loc)}"
        else:
            message = _clean_message(error["msg"])
        lines.append(f"{_dotted(loc) or '(top level)'}: {message} (from {origin(loc)})")
    header = "invalid configuration" if len(lines) > 1 else lines[0]
    body = "\n".join(f"  - {line}" for line in lines) if len(lines) > 1 else ""
    return ConfigError(f"{header}\n{body}" if body else header)


def _clean_message(msg: str) -> str:
    msg = msg.removeprefix("Value error, ")
    return re.sub(r" or instance of \w+", "", msg)


def _source_for(loc: Path_, sources: Mapping[Path_, str]) -> str:
    for i in range(len(loc), 0, -1):
        if loc[:i] in sources:
            return sources[loc[:i]]
    below = [s for p, s in sources.items() if p[: len(loc)] == loc]
    return below[0] if below else DEFAULT_SOURCE


def _suggestion(loc: Path_) -> str:
    model = _model_at(loc[:-1])
    return did_you_mean(loc[-1], list(model.model_fields)) if model is not None else ""


def _model_at(path: Path_) -> type[BaseModel] | None:
    """The config model at ``path`` (a section, or an entry of a mapping of models such as
    ``model.providers.<key>``), or None when the value there is free-form."""
    if not path:
        return SkillOptConfig
    model = _unwrap_model(_field_annotation(path))
    if model is None:  # a key of a mapping: the mapping's value type
        for member in _union_members(_field_annotation(path[:-1])):
            if typing.get_origin(member) is dict:
                model = _unwrap_model(typing.get_args(member)[1])
    return model


def did_you_mean(name: str, names: Sequence[str], *, what: str = "keys") -> str:
    """``"; did you mean 'x'?"`` for the name in ``names`` closest to a mistyped ``name``, else
    ``"; valid keys: …"`` listing them all: the tail of an "unknown key" error."""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; valid {what}: {', '.join(names)}"


# --------------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and where each of its values came from."""

    config: SkillOptConfig
    sources: dict[str, str]

    def source_of(self, dotted: str) -> str:
        """Where the value at ``dotted`` came from (``default`` when no layer set it)."""
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            key = ".".join(parts[:i])
            if key in self.sources:
                return self.sources[key]
        return DEFAULT_SOURCE


def load_config(
    benchmark: str | None = None,
    *,
    config_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    cli_roles: Mapping[str, Any] | None = None,
) -> LoadedConfig:
    """Build and validate the config for ``benchmark`` (or for ``config_file`` alone).

    ``env`` supplies the ``SKILLOPT_<ROLE>_<KEY>`` layer; pass ``{}`` to ignore the environment.
    ``cli_roles`` are the command line's role options (``CliRoleOptions`` fields as plain data, e.g.
    ``{"role_backend": {"target": "anthropic"}}``): they are applied later, by ``resolve_roles``, but a
    refused secret names the key variable of the backend they give its role.
    Raises ``ConfigError`` for every problem, naming the key and its source.
    """
    env = {} if env is None else env
    try:
        layered = _layers(benchmark, config_file, overrides, env, cwd, check_secrets=True)
    except _SecretRefused as refused:
        if refused.role is None:
            raise
        raise refused.for_backend(_role_backend(refused.role, benchmark, config_file, overrides, env, cwd,
                                                cli_roles) or refused.backend) from None

    if benchmark is not None:
        _name_the_benchmark(layered, benchmark)
    _normalise_judge_block(layered)
    try:
        config = SkillOptConfig.model_validate(layered.data)
    except ValidationError as exc:
        raise _format_validation_error(exc, layered.sources) from None
    return LoadedConfig(config=config, sources={_dotted(p): s for p, s in layered.sources.items()})


def _layers(benchmark: str | None, config_file: str | Path | None, overrides: Sequence[str],
            env: Mapping[str, str], cwd: Path | None, *, check_secrets: bool) -> _Layered:
    """The config files, the environment layer and the overrides merged, lowest first; with
    ``check_secrets``, a secret written into any of them is refused (``_SecretRefused``)."""
    layered = _Layered()
    if benchmark is not None:
        data, sources = read_config_file(find_benchmark_config(benchmark, cwd=cwd),
                                         _check_secrets=check_secrets)
        layered.merge(data, sources)
    if config_file is not None:
        data, sources = read_config_file(Path(config_file), _check_secrets=check_secrets)
        layered.merge(data, sources)

    for path, text, variable in _environment_layer(env):
        if layered.get(path) is None:
            value = convert_text(path, text, source=f"env:{variable}")
            # A variable is the place for a key, but not a base URL with a password or a body with a token:
            # those would be written wherever the config is.
            if check_secrets:
                _check_no_literal_secrets(_nest(path, value), f"env:{variable}", _role_backends(layered.data))
            layered.set(path, value, f"env:{variable}")

    for item in overrides:
        path, text = parse_override(item)
        source = f"-o {_dotted(path)}"
        # Refuse a literal secret on the raw text, before any parsing could quote it back, then on the value
        # (a map given as text, such as an extra_body, is only a map after parsing).
        backends = {**_role_backends(layered.data), **_role_backends(_nest(path, text))}
        if check_secrets:
            _check_no_literal_secrets(_nest(path, text), source, backends)
        named = benchmark or layered.get(("benchmark", "name"))
        value = convert_text(path, text, source=source, benchmark=named)
        if check_secrets:
            _check_no_literal_secrets(_nest(path, value), source, backends)
        layered.set(path, value, source)
    return layered


def _role_backend(role: str, benchmark: str | None, config_file: str | Path | None, overrides: Sequence[str],
                  env: Mapping[str, str], cwd: Path | None, cli_roles: Mapping[str, Any] | None) -> Any:
    """The backend ``role`` ends up with, as ``resolve_roles`` picks it: its own command-line option, else
    the command line's backend for every role unless an override names the role's, else the config's
    layers; None when nothing names one, or when the layers cannot be read without their secret checks."""
    cli_roles = cli_roles or {}
    own = (cli_roles.get("role_backend") or {}).get(role)
    if own:
        return own
    try:
        layered = _layers(benchmark, config_file, overrides, env, cwd, check_secrets=False)
    except ConfigError:
        layered = _Layered()
    path = ("model", role, "backend")
    if cli_roles.get("backend") and not layered.sources.get(path, "").startswith("-o "):
        return cli_roles["backend"]
    return layered.get(path)


def _nest(path: Path_, value: Any) -> dict[str, Any]:
    nested: Any = value
    for part in reversed(path):
        nested = {part: nested}
    return nested


def _name_the_benchmark(layered: _Layered, benchmark: str) -> None:
    """Set ``benchmark.name`` to the benchmark the command names. A file or override may repeat that name
    (a saved ``config show`` reused for the same benchmark); naming another is an error."""
    path = ("benchmark", "name")
    named = layered.get(path)
    if named is not None and named != benchmark:
        source = layered.sources.get(path, "yaml")
        fix = "drop that override" if source.startswith("-o ") else "remove benchmark.name from that file"
        raise ConfigError(f"benchmark.name: {source} names {named!r}, but the command names {benchmark!r}; "
                          f"{fix} or name {named} on the command line")
    if isinstance(layered.data.get("benchmark", {}), dict):  # else the section is an error of its own
        layered.set(path, benchmark, "cli")


def _normalise_judge_block(layered: _Layered) -> None:
    """A judge block whose fields are all null counts as absent."""
    model = layered.data.get("model")
    if not isinstance(model, dict) or "judge" not in model:
        return
    judge = model["judge"]
    if isinstance(judge, dict) and all(v is None for v in judge.values()):
        del model["judge"]


def load_config_file(
    path: str | Path, *, overrides: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> LoadedConfig:
    """Validate a standalone config file (``skillopt config validate``)."""
    return load_config(None, config_file=path, overrides=overrides, env=env)


# --------------------------------------------------------------------------------------------
# Showing a config


def dump_config(loaded: LoadedConfig) -> dict[str, Any]:
    """The resolved config as plain data, section by section: it holds only references to secrets, and
    is redacted all the same (secret-shaped strings, URL passwords, credential-named body keys)."""
    return redact_tree(loaded.config.model_dump(mode="json"), Redactor.from_environment())


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``; empty dicts stay as leaves."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat
