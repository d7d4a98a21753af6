"""The benchmark plug-in contract (BENCHMARKS.md §1.1) and the registry of plug-ins.

A benchmark is one small package that implements ``Benchmark``. It supplies only what differs
between benchmarks — how to load items, how to prompt, how to score — and the shared runner
(``skillopt.benchmarks.runner``) does everything rollouts share. Plug-ins register under the
entry-point group ``skillopt.benchmarks``; the entry-point name is the benchmark id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from skillopt.data import Item
from skillopt.errors import ConfigError, SkillOptError
from skillopt.llm.chat import ChatRequest, ChatResponse, Message

ENTRY_POINT_GROUP = "skillopt.benchmarks"


class BenchmarkSetupError(SkillOptError):
    """A benchmark's external requirement is missing (data, images, a judge, a tool); the message says how to fix it."""


class RolloutInfrastructureError(SkillOptError):
    """A whole rollout produced no model answer at all: an outage, not a score of zero (DESIGN.md §8)."""


class Score(BaseModel):
    """What ``Benchmark.score`` returns for one item."""

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


#: ``judge(item, prediction) -> (correct, reason)``; backed by the judge role. Raises on failure.
Judge = Callable[[Item, str], tuple[bool, str]]


class TargetClient(Protocol):
    """The ``target`` role as an episode uses it (``skillopt.llm.clients.RoleClient`` satisfies it)."""

    def chat(self, request: ChatRequest) -> ChatResponse: ...


@dataclass(frozen=True)
class EpisodeContext:
    """What an optional ``Benchmark.run_episode(item, skill, ctx)`` gets from the shared runner.

    ``messages`` is the prompt the runner built (the skill as the target sees it, plus any training
    readout) and has already recorded as turn-0 events; ``record`` appends one trajectory event;
    ``deadline`` is a ``time.monotonic()`` value past which no call, tool use or fetch starts.
    """

    target: TargetClient
    messages: Sequence[Message]
    cfg: BaseModel
    record: Callable[[dict[str, Any]], None]
    deadline: float
    tags: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeResult:
    """What ``score`` needs (``response_text``) and what the result row reports."""

    response_text: str
    n_turns: int
    answered: bool
    fetched_urls: tuple[str, ...] = ()


@runtime_checkable
class Benchmark(Protocol):
    """One benchmark.

    - ``load_split(cfg, split, *, run_dir)`` returns the items of ``train``, ``val`` or ``test`` using the
      shared split machinery (``skillopt.data``); bad data raises ``DataError`` naming file and row.
    - ``build_messages(item, skill, cfg)`` returns ``[system, user]``. The skill goes into the system
      message as ``## Skill`` (omitted when blank); nothing else changes between candidates, and no
      field in ``GOLD_FIELDS`` is ever read.
    - ``score(item, response_text, judge)`` is pure apart from the injected judge: it never raises for
      a bad answer (that is a scored row); it raises only for a broken judge or a bug.
    - ``task_types(items)`` lists the task types; ``preflight(cfg)`` raises ``BenchmarkSetupError``.
    - ``scripted_rules`` are the target rules the ``scripted`` backend uses for this benchmark.
    - ``needs_judge(cfg)`` says whether scoring calls the judge role.
    - Optional ``run_episode(item, skill, ctx: EpisodeContext) -> EpisodeResult``: multi-step items
      (tools, fetches, environments) drive the target themselves; the runner still records, scores
      and builds the row.
    - ``version`` changes whenever scoring or prompting changes (it is part of every cache key).
    - Optional ``extras: tuple[str, ...]``: the pip extras of skillopt the plug-in needs (e.g.
      ``("alfworld",)``); ``skillopt benchmarks`` shows them. Read it with :func:`plugin_extras`
      (absent means none), so plug-ins written before it existed still satisfy the protocol.
    - Optional ``bind_target(cfg, *, backend, kind) -> (cfg, notes)``: called before ``preflight``
      with the target role's backend name and kind (``chat`` | ``exec``). It settles choices that
      depend on the target (``auto`` env managers, agent runners, harnesses → the fakes under
      ``scripted``), raises ``BenchmarkSetupError`` for a target it cannot serve, and returns notes
      for the run header (e.g. that the environment is simulated).
    """

    id: str
    version: str
    GOLD_FIELDS: tuple[str, ...]
    Config: type[BaseModel]
    prompts_dir: Path
    scripted_rules: Sequence[Mapping[str, Any]]
    default_split_mode: str

    def load_split(self, cfg: BaseModel, split: str, *, run_dir: Path) -> list[Item]: ...

    def build_messages(self, item: Item, skill: str, cfg: BaseModel) -> list[Message]: ...

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score: ...

    def task_types(self, items: Sequence[Item]) -> list[str]: ...

    def preflight(self, cfg: BaseModel) -> None: ...

    def needs_judge(self, cfg: BaseModel) -> bool: ...


#: What a plug-in that declares no ``extras`` needs: no optional pip extra.
NO_EXTRAS: tuple[str, ...] = ()


def plugin_extras(benchmark: object) -> tuple[str, ...]:
    """The pip extras a plug-in declares in its optional ``extras`` class attribute (``()`` when absent)."""
    declared = getattr(benchmark, "extras", NO_EXTRAS)
    if isinstance(declared, str):
        return (declared,)
    return tuple(str(extra) for extra in declared or ())


#: An analyst-only hidden reference is cut to this many characters (BENCHMARKS.md §1.10).
HIDDEN_REFERENCE_CHARS = 4000


def hidden_reference_block(lines: Sequence[str], *, use: str = "never teach its content") -> str:
    """The "Hidden reference" block a score's ``detail`` carries to the analyst (never to the target):
    a heading saying how it may be used, then ``lines``; at most 4000 characters, empty without lines."""
    if not lines:
        return ""
    block = f"Hidden reference (analyst only; {use}):\n" + "\n".join(lines)
    return block if len(block) <= HIDDEN_REFERENCE_CHARS else block[: HIDDEN_REFERENCE_CHARS - 3] + "..."


#: The reply format every judge rubric ends with (the structured verdict, BENCHMARKS.md §1.11).
VERDICT_FORMAT = 'Reply with JSON {"verdict": "correct"|"incorrect", "reason": str}; keep the reason to one sentence.'


def verdict_request(rubric: str, body: str, *, item_id: str, prediction: str, golds: Sequence[str]) -> ChatRequest:
    """A judge call (stage ``judge``): the rubric as system text, the case as user text.

    The tags ``prediction`` and ``gold_answers`` let the scripted judge grade offline.
    """
    from skillopt.llm.chat import system, user

    return ChatRequest(
        messages=[system(f"{rubric}\n\n{VERDICT_FORMAT}"), user(body)],
        stage="judge",
        tags={"item_id": item_id, "prediction": prediction, "gold_answers": [str(g) for g in golds]},
    )


def split_items(cfg: BaseModel, split: str, *, run_dir: Path, benchmark: str, default_split_mode: str,
                **loader: Any) -> list[Item]:
    """The items of one split through the shared machinery (``skillopt.data.load_splits``).

    ``loader`` passes the benchmark's own ``reader``, ``normalise``, ``default_task_type`` and
    ``native_extensions``; ratio output goes to ``split_output_dir`` under the run directory.
    """
    from skillopt.data import SplitSpec, load_splits, split_output_dir

    spec = SplitSpec.from_benchmark_config(cfg, default_split_mode=default_split_mode)
    out_dir = split_output_dir(spec, run_dir=run_dir, benchmark=benchmark)
    return load_splits(spec, benchmark=benchmark, out_dir=out_dir, **loader).get(split)


def check_split_folder(cfg: Any, *, benchmark: str, default_split_mode: str, fix: str) -> None:
    """Preflight: in ``split_dir`` mode a missing split folder is a ``BenchmarkSetupError`` saying ``fix``."""
    if (cfg.split_mode or default_split_mode) == "split_dir" and cfg.split_dir and not Path(cfg.split_dir).is_dir():
        raise BenchmarkSetupError(f"{benchmark}: no split folder at {cfg.split_dir}; {fix}")


def shipped_prompts_dir(benchmark: str) -> Path:
    """Where a built-in benchmark's three prompt files ship: ``prompts/benchmarks/<id>/``."""
    from skillopt.resources import shipped_dir

    return shipped_dir("prompts") / "benchmarks" / benchmark


def skill_section(skill: str) -> str:
    """The system-prompt slot of the skill: ``## Skill`` and the skill, or nothing for a blank skill."""
    text = skill.strip()
    return f"## Skill\n{text}\n\n" if text else ""


def load_benchmark(name: str) -> Benchmark:
    """The plug-in registered as ``name``; an unknown name lists the registered ones."""
    found = {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in found:
        known = ", ".join(sorted(found)) or "none (is skillopt installed?)"
        raise ConfigError(f"unknown benchmark {name!r}; registered benchmarks: {known}")
    plugin = found[name].load()
    benchmark = plugin() if callable(plugin) and not isinstance(plugin, Benchmark) else plugin
    if not isinstance(benchmark, Benchmark):
        raise ConfigError(f"entry point {ENTRY_POINT_GROUP}:{name} does not implement the Benchmark protocol")
    return benchmark


def benchmark_config(benchmark: Benchmark, section: BaseModel) -> BaseModel:
    """Validate the ``benchmark:`` section (common keys plus extras) with the plug-in's own model."""
    from pydantic import ValidationError

    data = section.model_dump()
    try:
        return benchmark.Config.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_input=False, include_url=False):
            loc = ".".join(str(p) for p in error["loc"])
            message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
            problems.append(f"benchmark.{loc}: {message} (benchmark {benchmark.id})")
        raise ConfigError("\n".join(problems)) from None
