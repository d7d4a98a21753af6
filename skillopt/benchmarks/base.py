"""The benchmark plug-in contract and the registry of plug-ins.

A benchmark is one small package that implements ``Benchmark``. It supplies only what differs
between benchmarks — how to load items, how to prompt, how to score — and the shared runner
(``skillopt.benchmarks.runner``) does everything rollouts share. Plug-ins register under the
entry-point group ``skillopt.benchmarks``; the entry-point name is the benchmark id.
"""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skillopt.benchmarks.answers import AnswerReading, last_tag, normalise_squad
from skillopt.benchmarks.episode import EpisodeContext, EpisodeResult
from skillopt.benchmarks.grading import GENERIC_RUBRIC, verdict_request
from skillopt.benchmarks.rows import check_item_size, roots_of
from skillopt.core.config import BenchmarkSection
from skillopt.core.data import (
    Item,
    SplitSpec,
    identity_normaliser,
    load_splits,
    read_records,
    split_output_dir,
)
from skillopt.core.errors import BenchmarkPluginError, BenchmarkSetupError, ConfigError, SkillOptError
from skillopt.llm.chat import ChatRequest, Message, system

ENTRY_POINT_GROUP = "skillopt.benchmarks"


class RolloutInfrastructureError(SkillOptError):
    """A whole rollout produced no model answer at all: an outage, not a score of zero."""


class Score(BaseModel):
    """What ``Benchmark.score`` returns for one item; ``hard`` and ``soft`` lie in [0, 1] (the runner stops
    the run on any other value: the gate averages them over the items)."""

    model_config = ConfigDict(extra="forbid")

    hard: float
    soft: float
    predicted_answer: str = ""
    fail_reason: str = ""
    extras: dict[str, Any] = Field(default_factory=dict)
    #: The gold answer(s) as the evaluation event shows them to the optimizer.
    expected: str = ""
    #: Benchmark detail for the evaluation event (judge reason, per-cell table ...).
    detail: str = ""


#: The evaluation detail of a row whose answer a fallback read (no ``<answer>`` tag).
UNTAGGED_NOTE = "format: untagged (no <answer> tag; the answer was read by the fallback)"


#: The evaluation detail of a row whose untagged reply named more than one option.
AMBIGUOUS_NOTE = ("format: ambiguous (no <answer> tag, and the reply names more than one option; nothing is "
                  "credited)")


def with_reading(score: Score, reading: AnswerReading) -> Score:
    """``score`` marked ``format: untagged`` — in its extras (so the row shows the format lapse)
    and in its evaluation detail (so the analyst does) — when a fallback read its answer; marked
    ``format: ambiguous`` (and scored 0) when the untagged reply named several options."""
    if reading.ambiguous:
        return score.model_copy(update={
            "hard": 0.0, "soft": 0.0, "extras": {**score.extras, "format": "ambiguous"},
            "fail_reason": score.fail_reason or "ambiguous: the reply names more than one option",
            "detail": f"{score.detail}\n{AMBIGUOUS_NOTE}".strip()})
    if reading.tagged or reading.text is None:
        return score
    return score.model_copy(update={"extras": {**score.extras, "format": reading.format},
                                    "detail": f"{score.detail}\n{UNTAGGED_NOTE}".strip()})


#: ``judge(item, prediction) -> (correct, reason)``; backed by the judge role. Raises on failure.
Judge = Callable[[Item, str], tuple[bool, str]]


class BenchmarkConfig(BenchmarkSection):
    """The ``benchmark:`` section as a plug-in validates it: the keys every benchmark shares plus
    its own (a plug-in's ``Config`` subclasses this and gives every key a default). Unknown keys
    are errors."""

    model_config = ConfigDict(extra="forbid")

    #: The folder a row's relative paths resolve against, and that every path must stay inside;
    #: ``--data DIR`` sets it to DIR.
    data_root: str | None = None
    #: An item larger than this many characters (as JSON) is a load error, not a huge prompt.
    max_item_chars: int = Field(default=200_000, ge=1)
    #: The target's output cap for this benchmark (a per-call override of model.target.max_tokens).
    max_tokens: int | None = Field(default=None, ge=1)
    #: The cap of self-check turns (``max_turns`` > 1), turn 2 onwards; None means ``max_tokens``.
    self_check_max_tokens: int | None = Field(default=None, ge=1)


ConfigT = TypeVar("ConfigT", bound=BenchmarkConfig)


class Benchmark(ABC, Generic[ConfigT]):
    """One benchmark: subclass it, set the class attributes, and implement ``normalise_row``,
    ``build_messages`` and ``score``. Every other hook has a default that a plug-in overrides only
    when it needs to. This docstring is the contract.

    **Failures.** A problem with one item's answer (no answer, a wrong one, a tool error, a sandbox
    failure) is a *scored row*, never an exception. A systemic problem raises: bad data raises
    ``DataError`` naming the file, the row and the field; a missing requirement raises
    ``BenchmarkSetupError`` with a fix; a model-call error propagates unchanged (the rollout task
    then fails and nothing is cached). Anything else a method raises at rollout time, a result of the
    wrong type, and a score outside [0, 1] stop the run as a ``BenchmarkPluginError`` naming the
    method and the item (``skillopt.benchmarks.runner.plugin_call``); they are never error rows.

    **Class attributes.** ``id`` (the entry-point name); ``Config`` (the pydantic model of the
    ``benchmark:`` section, a ``BenchmarkConfig`` subclass with a default for every key);
    ``GOLD_FIELDS`` (the item keys that hold gold: prompt builders never read them); ``version``
    (bump it when scoring changes; prompts are hashed from the rendered request);
    ``default_split_mode``; ``default_task_type``; ``native_extensions`` (the data files a split
    folder is read from when it has no ``items.json``); ``extras`` (the pip extras of skillopt the
    plug-in needs, shown by ``skillopt benchmarks``); ``uses_images`` (prompts carry images, so the
    target must accept them); ``data_hint`` (how to point the benchmark at its data, for errors).

    **Loading.** ``load_split(cfg, split, *, run_dir)`` returns the items of one split through the
    shared split machinery; by default it reads rows with ``read_rows`` and normalises each with
    ``normalise_row`` (idempotent; ``KeyError(field)`` / ``ValueError`` for a bad row, ``DropRow``
    only under a drop rule of the benchmark; any other exception is a ``DataError`` naming the row and
    the exception). Paths a row names are resolved with
    ``skillopt.benchmarks.rows.confined_path`` so they stay inside the data root.

    **Prompting.** ``build_messages(item, skill, cfg)`` returns ``[system, user]`` and is pure and
    deterministic: the rendered request is what the rollout cache hashes. The skill goes into the
    system message via ``skill_section`` (nothing when blank); nothing else changes between
    candidates; ``system_message(intro, skill, rules)`` builds that system message.
    ``batch_view(item, cfg, seed=, training=)`` returns the item as one batch shows it
    (e.g. shuffled choices); the default is the item itself.

    **Episodes.** ``run_episode(item, skill, ctx)`` lets a multi-step benchmark (tools, fetches,
    environments) drive the target itself and return an ``EpisodeResult``; the default returns
    None, and the shared runner makes up to ``max_turns`` single-answer calls, stopping when
    ``extract_answer`` reads the same answer twice.

    **Scoring.** ``score(item, response_text, judge)`` is pure apart from the injected ``judge``;
    it never raises for a bad answer. ``extract_answer(text)`` is the answer as the scorer compares
    it (None when the reply has none in the required format); the default is the last
    ``<answer>`` tag, SQuAD-normalised. ``needs_judge(cfg)`` says whether ``score`` calls the judge
    role (default False); ``judge_request(item, prediction)`` is the judge call (default: a generic
    equivalence rubric over the item's question and golds). A benchmark that reads untagged replies
    uses ``skillopt.benchmarks.answers.read_answer`` and marks such rows with ``with_reading``.

    **Setup.** ``bind_target(cfg, *, backend, kind) -> (cfg, notes)`` runs before ``preflight``
    with the target role's backend and kind (``chat`` | ``exec``): it settles target-dependent
    choices (fakes under ``scripted``), raises ``BenchmarkSetupError`` for a target it cannot serve
    and returns notes for the run header; the default changes nothing. ``preflight(cfg)`` checks
    every external requirement before the first rollout (default: the split folder exists).
    ``task_types(items)`` lists the task types (default: the sorted distinct ones).
    """

    id: ClassVar[str]
    Config: type[ConfigT]
    GOLD_FIELDS: ClassVar[tuple[str, ...]] = ()
    version: ClassVar[str] = "1"
    default_split_mode: ClassVar[str] = "split_dir"
    default_task_type: ClassVar[str] = "default"
    native_extensions: ClassVar[tuple[str, ...]] = (".json", ".jsonl")
    extras: ClassVar[tuple[str, ...]] = ()
    uses_images: ClassVar[bool] = False
    data_hint: ClassVar[str] = ("pass --data DIR (a folder holding train/, val/ and test/) "
                                "or set benchmark.split_dir")

    @property
    def prompts_dir(self) -> Path:
        """The folder of ``analyst_error.md``, ``analyst_success.md`` and ``initial_skill.md``
        (built-in benchmarks: ``prompts/benchmarks/<id>/``; a third-party plug-in overrides it)."""
        return shipped_prompts_dir(self.id)

    def config(self, cfg: BaseModel) -> ConfigT:
        """``cfg`` as this benchmark's ``Config`` (validated again when it is a bare section)."""
        return cfg if isinstance(cfg, self.Config) else self.Config.model_validate(cfg.model_dump())

    # ------------------------------------------------------------------------------------ loading

    def data_roots(self, cfg: ConfigT) -> list[Path]:
        """The folders a row's paths (images, documents, workbooks, game files) must resolve inside:
        ``data_root`` (the ``--data`` folder), the split folder, the folder of ``data_path``."""
        config = self.config(cfg)
        data_path = Path(config.data_path) if config.data_path else None
        source = data_path if data_path is None or data_path.is_dir() else data_path.parent
        return roots_of(config.data_root, config.split_dir, source)

    def load_split(self, cfg: ConfigT, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``train``, ``val`` or ``test`` (or an alias); bad data raises ``DataError``."""
        config = self.config(cfg)
        return split_items(config, split, run_dir=run_dir, benchmark=self.id,
                           default_split_mode=self.default_split_mode,
                           reader=lambda path: self.read_rows(Path(path), config),
                           normalise=lambda row: self.normalise_row(row, config),
                           default_task_type=self.default_task_type, native_extensions=self.native_extensions)

    def read_rows(self, path: Path, cfg: ConfigT) -> list[dict[str, Any]]:
        """The raw reader of one data file or folder (default: JSON array, ``{"data": [...]}``,
        a dict of items, JSONL, or a folder holding one such file)."""
        return read_records(path)

    @abstractmethod
    def normalise_row(self, row: Mapping[str, Any], cfg: ConfigT) -> dict[str, Any]:
        """One normalized item from a raw or already normalized row (idempotent)."""

    # ---------------------------------------------------------------------------------- prompting

    @abstractmethod
    def build_messages(self, item: Item, skill: str, cfg: ConfigT) -> list[Message]:
        """``[system, user]`` for ``item`` with ``skill``; pure, deterministic, never reads gold."""

    @staticmethod
    def system_message(intro: str, skill: str, rules: str) -> Message:
        """The system message most benchmarks send: ``intro``, the skill's slot (``## Skill`` and
        the skill, nothing when it is blank), then the answer format or ``rules``."""
        return system(f"{intro}\n\n{skill_section(skill)}{rules}")

    def batch_view(self, item: Item, cfg: ConfigT, *, seed: int, training: bool) -> Item:
        """The item as a batch seeded with ``seed`` shows it (default: unchanged). Evaluation
        batches must stay stable across candidates; training batches may vary with the seed."""
        return item

    def run_episode(self, item: Item, skill: str, ctx: EpisodeContext) -> EpisodeResult | None:
        """Drive a multi-step item; None (the default) leaves the turns to the shared runner."""
        return None

    # ------------------------------------------------------------------------------------ scoring

    @abstractmethod
    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """Score one reply; a bad answer is a scored row, only a broken judge or a bug raises."""

    def extract_answer(self, response_text: str) -> str | None:
        """The answer as the scorer compares it, or None when the reply has none in the required
        format; self-check turns (``max_turns``) stop when it repeats."""
        answer = last_tag(response_text, "answer")
        return None if answer is None else normalise_squad(answer)

    def needs_judge(self, cfg: ConfigT) -> bool:
        """Whether ``score`` calls the judge role under ``cfg`` (default: never)."""
        return False

    def max_target_calls(self, cfg: ConfigT) -> int:
        """The most target calls one item's rollout makes under ``cfg`` (default: ``max_turns``); a plug-in
        whose items are episodes or tool loops says its own, for the dry run's estimate."""
        return int(getattr(cfg, "max_turns", 1) or 1)

    def judge_request(self, item: Item, prediction: str) -> ChatRequest:
        """The judge call for ``prediction`` (default: semantic equivalence with the item's golds)."""
        golds = [str(g) for g in as_list(item.get("answers", item.get("answer")))]
        body = (f"## Question\n{item.get('question', '')}\n\n## Gold answers\n{golds}\n\n"
                f"## Answer\n{prediction}")
        return verdict_request(GENERIC_RUBRIC, body, item_id=item.id, prediction=prediction, golds=golds)

    # -------------------------------------------------------------------------------------- setup

    def bind_target(self, cfg: ConfigT, *, backend: str, kind: str) -> tuple[ConfigT, list[str]]:
        """Settle choices that depend on the target backend; returns the config and run-header notes."""
        return cfg, []

    def preflight(self, cfg: ConfigT) -> None:
        """Check every external requirement before the first rollout; raise ``BenchmarkSetupError``
        (default: the split folder of ``split_dir`` mode, the ``data_path`` of ``ratio`` mode)."""
        config = self.config(cfg)
        check_split_folder(config, benchmark=self.id, default_split_mode=self.default_split_mode,
                           fix=self.data_hint)
        if (config.split_mode or self.default_split_mode) == "ratio" and config.data_path \
                and not Path(config.data_path).exists():
            raise BenchmarkSetupError(f"{self.id}: no data at {config.data_path}; {self.data_hint}")

    def task_types(self, items: Sequence[Item]) -> list[str]:
        """The task types of ``items``, sorted (``[default_task_type]`` for none)."""
        return sorted({item.task_type for item in items}) or [self.default_task_type]


def as_list(value: Any) -> list[Any]:
    """``value`` as a list: a list as is, None as ``[]``, anything else as a one-element list."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def split_items(cfg: BaseModel, split: str, *, run_dir: Path, benchmark: str, default_split_mode: str,
                **loader: Any) -> list[Item]:
    """The items of one split through the shared machinery (``skillopt.core.data.load_splits``).

    ``loader`` passes the benchmark's own ``reader``, ``normalise``, ``default_task_type`` and
    ``native_extensions``; ratio output goes to ``split_output_dir`` under the run directory. An
    item larger than ``benchmark.max_item_chars`` is an error naming its file and row.
    """
    spec = SplitSpec.from_benchmark_config(cfg, default_split_mode=default_split_mode)
    out_dir = split_output_dir(spec, run_dir=run_dir, benchmark=benchmark)
    normalise = loader.pop("normalise", identity_normaliser)
    limit = int(getattr(cfg, "max_item_chars", BenchmarkConfig.model_fields["max_item_chars"].default))

    def normalise_within_limit(row: dict[str, Any]) -> dict[str, Any]:
        item = normalise(row)
        check_item_size(item, limit)
        return item

    return load_splits(spec, benchmark=benchmark, out_dir=out_dir, normalise=normalise_within_limit,
                       **loader).get(split)


def check_split_folder(cfg: Any, *, benchmark: str, default_split_mode: str, fix: str) -> None:
    """Preflight: in ``split_dir`` mode a missing split folder, or none given, is a ``BenchmarkSetupError``
    saying ``fix``."""
    split_dir_mode = (cfg.split_mode or default_split_mode) == "split_dir"
    if split_dir_mode and not cfg.split_dir:
        raise BenchmarkSetupError(f"{benchmark}: no data given (benchmark.split_dir is not set); {fix}")
    if split_dir_mode and not Path(cfg.split_dir).is_dir():
        raise BenchmarkSetupError(f"{benchmark}: no split folder at {cfg.split_dir}; {fix}")


def shipped_prompts_dir(benchmark: str) -> Path:
    """Where a built-in benchmark's three prompt files ship: ``prompts/benchmarks/<id>/``."""
    from skillopt.core.resources import shipped_dir

    return shipped_dir("prompts") / "benchmarks" / benchmark


def skill_section(skill: str) -> str:
    """The system-prompt slot of the skill: ``## Skill`` and the skill, or nothing for a blank skill."""
    text = skill.strip()
    return f"## Skill\n{text}\n\n" if text else ""


def load_benchmark(name: str) -> Benchmark[Any]:
    """The plug-in registered as ``name``; an unknown name lists the registered ones. A plug-in that cannot
    be imported or instantiated, or that lacks what every benchmark declares (an ``id`` equal to its
    entry-point name, a ``Config`` subclassing ``BenchmarkConfig``), is a ``BenchmarkPluginError`` naming its
    entry point and the cause."""
    found = {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in found:
        known = ", ".join(sorted(found)) or "none (is skillopt installed?)"
        raise ConfigError(f"unknown benchmark {name!r}; registered benchmarks: {known}")
    entry = found[name]

    def broken(cause: str) -> BenchmarkPluginError:
        return BenchmarkPluginError(f"benchmark {name} (entry point {entry.value}) cannot be loaded: {cause}")

    try:
        plugin = entry.load()
    except ImportError as error:
        raise broken(f"{type(error).__name__}: {error}; install the package that provides it (and what it "
                     "imports), or correct the entry point in that package's pyproject.toml") from error
    except Exception as error:
        raise broken(f"importing it raised {type(error).__name__}: {error} (a bug in the plug-in)") from error
    if isinstance(plugin, type):
        if missing := sorted(getattr(plugin, "__abstractmethods__", ())):
            raise broken(f"{plugin.__name__} does not implement {', '.join(missing)}; a benchmark defines "
                         "normalise_row, build_messages and score")
        try:
            benchmark = plugin()
        except Exception as error:
            raise broken(f"{plugin.__name__}() raised {type(error).__name__}: {error}") from error
    else:
        benchmark = plugin
    if not isinstance(benchmark, Benchmark):
        raise broken(f"it is a {type(benchmark).__name__}, not a skillopt.benchmarks.base.Benchmark")
    kind = type(benchmark).__name__
    if not isinstance(getattr(benchmark, "id", None), str) or not benchmark.id:
        raise broken(f"{kind} has no id; set the class attribute id = {name!r} (its entry-point name)")
    if benchmark.id != name:  # the id names its prompts, artifacts and run rows: two names would disagree
        raise broken(f"{kind}.id is {benchmark.id!r} but it is registered as {name!r}; set id = {name!r} "
                     "or register the entry point under the id")
    config = getattr(benchmark, "Config", None)
    if not (isinstance(config, type) and issubclass(config, BenchmarkConfig)):
        what = f"{kind} has no Config" if config is None else (
            f"its Config ({getattr(config, '__name__', repr(config))}) does not subclass "
            "skillopt.benchmarks.base.BenchmarkConfig")
        raise broken(f"{what}; declare the benchmark's keys in a subclass of BenchmarkConfig and set "
                     f"{kind}.Config to it")
    return benchmark


def keys_without_default(benchmark: Benchmark[Any]) -> list[str]:
    """The keys of ``benchmark.Config`` that have no default (the contract wants one on every key)."""
    return [key for key, field in benchmark.Config.model_fields.items() if field.is_required()]


def benchmark_config(benchmark: Benchmark[Any], section: BaseModel,
                     source_of: Callable[[str], str] | None = None) -> BaseModel:
    """Validate the ``benchmark:`` section (common keys plus extras) with the plug-in's own model.
    ``source_of`` names where a dotted key was set (``LoadedConfig.source_of``), for the message."""
    data = section.model_dump()
    try:
        return benchmark.Config.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            loc = ".".join(str(p) for p in error["loc"])
            message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
            if error["type"] == "extra_forbidden":
                fields = list(benchmark.Config.model_fields)
                close = difflib.get_close_matches(str(error["loc"][-1]), fields, n=1)
                message += f"; did you mean {close[0]!r}?" if close else ""
            where = f", from {source_of(f'benchmark.{loc}')}" if source_of is not None else ""
            problems.append(f"benchmark.{loc}: {message} (benchmark {benchmark.id}{where})")
        raise ConfigError("\n".join(problems)) from None
