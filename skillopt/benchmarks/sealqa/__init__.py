"""SealQA (``sealqa``): fact-seeking questions whose web evidence conflicts, misleads or says nothing
(BENCHMARKS.md §2.9).

Items come from one CSV per split (``question_id|id, question, answer|ground_truth, topic, urls,
search_results, freshness, question_types, effective_year, canary``) or ``items.json``, normalized to
``{id, question, answer, topic, urls, search_results, freshness, question_types, effective_year}``
with ``task_type`` = topic; ``canary`` is dropped and never shown. The target answers inside
``<answer>…</answer>``. ``grader: llm`` (the default) asks the ``judge`` role with a SimpleQA-style
rubric; ``grader: string`` is the explicit offline grader (normalised equality or containment).

When the first reply has no ``<answer>``, :meth:`SealQABenchmark.run_episode` has the harness fetch
up to ``fetch_max_urls`` of the item's URLs (through a :class:`~skillopt.benchmarks.sealqa.fetch.UrlFetcher`)
and asks the target once more with the fetched text.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from skillopt.benchmarks.answers import last_tag, normalise_squad, quote_answer
from skillopt.benchmarks.base import (
    BenchmarkSetupError,
    EpisodeContext,
    EpisodeResult,
    Judge,
    Score,
    check_split_folder,
    shipped_prompts_dir,
    skill_section,
    split_items,
)
from skillopt.benchmarks.scripted_target import question_rules
from skillopt.benchmarks.sealqa.fetch import FetchError, UrlFetcher, UrllibFetcher, check_scheme, page_text
from skillopt.config import BenchmarkSection
from skillopt.data import Item, read_records
from skillopt.errors import DataError
from skillopt.llm.chat import ChatRequest, Message, assistant, system, user

BENCHMARK_ID = "sealqa"
DEFAULT_TASK_TYPE = "sealqa"
NATIVE_EXTENSIONS = (".csv",)
#: The keys of a normalized row (``source_id`` is added by the loader when sanitising changed an id).
NORMALIZED_KEYS = (
    "id",
    "question",
    "answer",
    "topic",
    "urls",
    "search_results",
    "freshness",
    "question_types",
    "effective_year",
    "task_type",
)
Grader = Literal["llm", "string"]
NO_ANSWER = "no-answer: model gave no final answer"
FETCH_TOOL = "fetch_url"

_SYSTEM_INTRO = (
    "You are a research assistant answering fact-seeking questions whose web evidence may be "
    "conflicting, noisy or unhelpful. Use the evidence supplied with the question first, then any "
    "fetched page content. When sources conflict, prefer those that match the question's entity, "
    "date and scope."
)
_ANSWER_FORMAT = (
    "Give a concise answer grounded in the evidence inside <answer>…</answer> at the end of your reply."
)
_CLOSING = "Rely on the evidence given above; put your final answer inside <answer>…</answer>."
_FETCHED_HEADING = "## Fetched URL Content"
_AFTER_FETCH = "Using this content and the evidence given before, put your final answer inside <answer>…</answer>."
_JUDGE_INSTRUCTIONS = (
    "You grade an answer to a fact-seeking question against its gold answer, in the style of SimpleQA. "
    "Classify the answer as one of: CORRECT (it states the gold answer's content fully, without "
    "contradicting it; wording, casing, order and small formatting differences are fine, and extra "
    "information is fine when it does not contradict the gold), INCORRECT (it contradicts the gold, "
    "names a different entity or value, or hedges between candidates of which one is wrong) or NOT "
    "ATTEMPTED (it does not commit to an answer, e.g. 'I don't know' or 'the evidence is unclear'). "
    'Reply with JSON {"verdict": "correct"|"incorrect", "reason": str}: the verdict is "correct" only '
    'for CORRECT; for NOT ATTEMPTED the verdict is "incorrect" and the reason begins with '
    '"not attempted". Judge only against the gold answer; keep the reason to one sentence.'
)
# The string grader keeps word characters, spaces, '%', '.' and '-' (BENCHMARKS.md §2.9).
_STRING_GRADER_DROP = re.compile(r"[^\w\s%.\-]")


class SealQAConfig(BenchmarkSection):
    """The ``benchmark:`` section for ``sealqa``: the common keys, the grader and the URL fetch."""

    model_config = ConfigDict(extra="forbid")

    #: ``llm`` asks the judge role (the default); ``string`` is the explicit offline grader.
    grader: Grader = "llm"
    #: Fetch the item's URLs (harness-side) when the first reply has no ``<answer>``.
    fetch_urls: bool = True
    fetch_max_urls: int = Field(default=2, ge=0)
    #: Seconds one GET may take (also bounded by the item's deadline).
    fetch_timeout: float = Field(default=20, gt=0)
    #: The text of one fetched page is cut to this many characters.
    fetch_max_chars: int = Field(default=6000, ge=1)
    #: The target's output cap for this benchmark (a per-call override of model.target.max_tokens).
    max_tokens: int = Field(default=768, ge=1)
    #: Set by ``--data DIR``; ``sealqa`` reads no assets beside its rows, so it is accepted and unused.
    data_root: str | None = None


# ----------------------------------------------------------------------------------------- loading


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The raw reader: a CSV file (by extension), a folder holding exactly one CSV, or any shape
    :func:`read_records` accepts. Empty CSV cells count as absent."""
    path = Path(path)
    if path.is_dir() and not any((path / split).is_dir() for split in ("train", "val", "test")):
        found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == ".csv")
        if len(found) == 1:
            path = found[0]
    if path.suffix.lower() != ".csv":
        return read_records(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid UTF-8 at byte offset {exc.start}; data files must be UTF-8") from None
    rows: list[dict[str, Any]] = []
    for index, raw in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=1):
        if None in raw:
            raise DataError(f"{path}: row {index}: more cells than the header has columns")
        rows.append({key: cell for key, cell in raw.items() if cell not in (None, "")})
    return rows


def parse_list(value: Any, field_name: str) -> list[str]:
    """A list cell as a list of non-empty strings.

    Accepts a list, a JSON list (``["a", "b"]``), a Python-literal list (``['a', 'b']``), a single
    plain value (a one-element list) or nothing (``[]``). A bracketed cell that parses as neither
    literal raises ``ValueError`` naming the field.
    """
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if not text.startswith("["):
            return [text]
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise ValueError(f"field {field_name!r} is not a JSON or Python list: {quote_answer(text)}") from None
    if not isinstance(value, list | tuple):
        raise ValueError(f"field {field_name!r} must be a list, got {type(value).__name__}")
    return [str(entry).strip() for entry in value if entry is not None and str(entry).strip()]


def _text(row: Mapping[str, Any], name: str) -> str:
    value = row.get(name)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"field {name!r} must be a string, got {type(value).__name__}")
    return str(value).strip()


def _first_present(row: Mapping[str, Any], names: Sequence[str]) -> Any:
    return next((row[name] for name in names if row.get(name) not in (None, "")), None)


def normalise_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A SealQA item (idempotent): ``question`` and ``answer|ground_truth`` are required.

    The id is ``question_id|id``, else ``"sealqa-" + sha1(question)[:12]`` (``canary`` is never an
    id and is dropped). ``urls`` and ``question_types`` may be lists or stringified lists;
    ``task_type`` is the topic. Raises ``KeyError(field)`` for a missing field and ``ValueError``
    for a bad one; the loader names the file and the row.
    """
    question = _text(row, "question")
    if not question:
        raise KeyError("question")
    gold = _text({"answer": _first_present(row, ("answer", "ground_truth"))}, "answer")
    if not gold:
        raise KeyError("answer")
    raw_id = _first_present(row, ("question_id", "id"))
    if isinstance(raw_id, float) and raw_id.is_integer():
        raw_id = int(raw_id)
    item_id = raw_id if raw_id is not None else "sealqa-" + hashlib.sha1(question.encode("utf-8")).hexdigest()[:12]
    topic = _text(row, "topic")
    item = {
        "id": item_id,
        "question": question,
        "answer": gold,
        "topic": topic,
        "urls": parse_list(row.get("urls"), "urls"),
        "search_results": _text(row, "search_results"),
        "freshness": _text(row, "freshness"),
        "question_types": parse_list(row.get("question_types"), "question_types"),
        "effective_year": _text(row, "effective_year"),
        "task_type": row.get("task_type") or topic or DEFAULT_TASK_TYPE,
    }
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    return item


# ----------------------------------------------------------------------------------------- scoring


def normalise_string_answer(text: str) -> str:
    """The string grader's normalisation: lowercase, keep word chars, spaces, ``%``, ``.`` and ``-``,
    collapse whitespace."""
    return " ".join(_STRING_GRADER_DROP.sub("", str(text).lower()).split())


def string_match(prediction: str, gold: str) -> bool:
    """Normalised equality or containment either way (on characters); an empty side never matches."""
    predicted, expected = normalise_string_answer(prediction), normalise_string_answer(gold)
    return bool(predicted and expected) and (expected in predicted or predicted in expected)


# ------------------------------------------------------------------------------------- the episode


def fetch_block(url: str, fetcher: UrlFetcher, *, timeout_s: float, max_chars: int) -> str:
    """One URL's part of ``## Fetched URL Content``: its text, or a ``[fetch error] …`` line."""
    try:
        check_scheme(url)
        text = page_text(fetcher.fetch(url, timeout_s=timeout_s), max_chars)
    except FetchError as exc:
        return f"### {url}\n[fetch error] {exc}"
    return f"### {url}\n{text or '[fetch error] the page has no readable text'}"


# ------------------------------------------------------------------------------- scripted target

#: The scripted target's replies to the fixture questions (tests/fixtures/sealqa): the lake is
#: solved; the Saturn count is an outdated number and the Fields Medal answer the wrong person
#: (both judged incorrect). Every reply has an answer, so a scripted run never needs a fetch.
_SCRIPTED_REPLIES = (
    (
        re.compile(r"## Question\nWhich lake holds the most unfrozen fresh water"),
        "The evidence points to the Siberian lake.\n<answer>Lake Baikal</answer>",
    ),
    (
        re.compile(r"## Question\nHow many moons of Saturn"),
        "An older count is the one I can support.\n<answer>146</answer>",
    ),
    (
        re.compile(r"## Question\nWho was the most recent Fields Medal winner born in Australia"),
        "The Adelaide-born medallist.\n<answer>Terence Tao</answer>",
    ),
)



# ------------------------------------------------------------------------------------------ plugin


class SealQABenchmark:
    """The ``sealqa`` plug-in (the ``Benchmark`` protocol in ``skillopt.benchmarks.base``).

    ``fetcher`` is the :class:`UrlFetcher` of :meth:`run_episode`: the real ``urllib`` fetcher by
    default; tests pass a fake.
    """

    id = BENCHMARK_ID
    version = "1"
    GOLD_FIELDS: tuple[str, ...] = ("answer",)
    Config = SealQAConfig
    default_split_mode = "split_dir"
    scripted_rules: Sequence[Mapping[str, Any]] = (
        *question_rules(BENCHMARK_ID, _SCRIPTED_REPLIES),
        {
            "name": "sealqa other",
            "stage": "rollout",
            "text": "The evidence does not settle it.\n<answer>unknown</answer>",
        },
    )

    def __init__(self, fetcher: UrlFetcher | None = None) -> None:
        self.fetcher: UrlFetcher = fetcher if fetcher is not None else UrllibFetcher()

    @property
    def prompts_dir(self) -> Path:
        return shipped_prompts_dir(BENCHMARK_ID)

    def load_split(self, cfg: BaseModel, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split`` (``train``, ``val``, ``test`` or an alias); bad rows raise ``DataError``."""
        config = _config(cfg)
        items = split_items(
            config, split, run_dir=run_dir, benchmark=BENCHMARK_ID, default_split_mode=self.default_split_mode,
            reader=read_rows,
            normalise=normalise_row,
            default_task_type=DEFAULT_TASK_TYPE,
            native_extensions=NATIVE_EXTENSIONS,
        )
        # ``score`` gets no config, so each loaded item carries its grader (never written to disk).
        return [Item({**item, "grader": config.grader}) for item in items]

    def build_messages(self, item: Item, skill: str, cfg: BaseModel) -> list[Message]:
        """System: task, conflict rule, skill, answer format. User: the question, then the non-empty
        evidence sections and a closing line. Never reads gold or the canary."""
        sections = [f"## Question\n{item['question']}"]
        if str(item.get("search_results") or "").strip():
            sections.append(f"## Search Results\n{item['search_results']}")
        if item.get("urls"):
            sections.append("## URL Hints\n" + "\n".join(f"- {url}" for url in item["urls"]))
        if str(item.get("freshness") or "").strip():
            sections.append(f"## Freshness\n{item['freshness']}")
        if item.get("question_types"):
            sections.append("## Question Types\n" + ", ".join(item["question_types"]))
        sections.append(_CLOSING)
        return [
            system(f"{_SYSTEM_INTRO}\n\n{skill_section(skill)}{_ANSWER_FORMAT}"),
            user("\n\n".join(sections)),
        ]

    def run_episode(self, item: Item, skill: str, ctx: EpisodeContext) -> EpisodeResult:
        """One target call; when its reply has no ``<answer>`` and ``fetch_urls`` is on, the harness
        fetches up to ``fetch_max_urls`` of the item's URLs (each logged as a ``tool_call``) and asks
        the target once more with ``## Fetched URL Content``.

        ``skill`` is already in ``ctx.messages``. A fetch error is a ``[fetch error]`` block, never
        an exception; a target error propagates. Past ``ctx.deadline`` nothing new starts and the
        episode returns what it has (the runner then records the timeout).
        """
        config = _config(ctx.cfg)
        messages = list(ctx.messages)
        text = self._ask(ctx, messages, config, turn=1)
        urls = list(item.get("urls") or [])[: config.fetch_max_urls]
        if last_tag(text, "answer") is not None or not config.fetch_urls or not urls:
            return EpisodeResult(text, n_turns=1, answered=True)
        blocks = []
        for url in urls:
            remaining = ctx.deadline - time.monotonic()
            if remaining <= 0:
                return EpisodeResult(text, n_turns=1, answered=True, fetched_urls=tuple(urls[: len(blocks)]))
            block = fetch_block(
                url, self.fetcher, timeout_s=min(config.fetch_timeout, remaining), max_chars=config.fetch_max_chars
            )
            ctx.record({"type": "tool_call", "turn": 1, "name": FETCH_TOOL, "command": url, "observation": block})
            blocks.append(block)
        follow_up = f"{_FETCHED_HEADING}\n\n" + "\n\n".join(blocks) + f"\n\n{_AFTER_FETCH}"
        ctx.record({"type": "feedback", "role": "user", "turn": 1, "content": follow_up})
        if time.monotonic() >= ctx.deadline:
            return EpisodeResult(text, n_turns=1, answered=True, fetched_urls=tuple(urls))
        text = self._ask(ctx, [*messages, assistant(text), user(follow_up)], config, turn=2)
        return EpisodeResult(text, n_turns=2, answered=True, fetched_urls=tuple(urls))

    @staticmethod
    def _ask(ctx: EpisodeContext, messages: list[Message], config: SealQAConfig, *, turn: int) -> str:
        request = ChatRequest(
            messages=messages, stage="rollout", max_tokens=config.max_tokens, tags={**ctx.tags, "turn": turn}
        )
        text = ctx.target.chat(request).text
        ctx.record({"type": "message", "role": "assistant", "turn": turn, "content": text})
        return text

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """Score the last ``<answer>`` tag with the item's grader (``grader``, stamped at load).

        ``llm``: the judge's verdict (1.0 for ``correct``, else 0.0); a judge error propagates and
        is never an ``incorrect``. ``string``: normalised equality or containment either way.
        No tag (or an empty one) is a ``no-answer`` row and calls no judge.
        """
        grader: Grader = item.get("grader", "llm")
        gold = str(item["answer"])
        answer = last_tag(response_text, "answer")
        extras: dict[str, Any] = {"grader": grader, "gold_answer": gold}
        if not answer:
            return Score(
                hard=0.0, soft=0.0, predicted_answer=answer or "", fail_reason=NO_ANSWER,
                extras=extras, expected=gold, detail=f"grader: {grader}",
            )
        if grader == "string":
            correct = string_match(answer, gold)
            fail = "" if correct else "wrong: no string match"
            detail = f"grader: string ({'match' if correct else 'no match'} after normalising)"
        else:
            if judge is None:
                raise BenchmarkSetupError("sealqa: grader 'llm' needs the judge role, but the runner gave no judge")
            correct, reason = judge(item, answer)
            fail = "" if correct else f"wrong: judged incorrect: {quote_answer(reason) or 'incorrect'}"
            detail = f"grader: llm. Judge: {reason}"
            extras["judge_reason"] = reason
        value = float(correct)
        return Score(
            hard=float(value >= 1.0), soft=value, predicted_answer=answer, fail_reason=fail,
            extras=extras, expected=gold, detail=detail,
        )

    def judge_request(self, item: Item, prediction: str) -> ChatRequest:
        """The judge's request: the SimpleQA-style rubric, the question, the gold and the prediction.

        The tags ``prediction`` and ``gold_answers`` let the scripted judge grade offline.
        """
        gold = str(item["answer"])
        return ChatRequest(
            messages=[
                system(_JUDGE_INSTRUCTIONS),
                user(f"## Question\n{item['question']}\n\n## Gold answer\n{gold}\n\n## Answer to grade\n{prediction}"),
            ],
            stage="judge",
            tags={"item_id": item.id, "prediction": prediction, "gold_answers": [gold]},
        )

    def extract_answer(self, response_text: str) -> str | None:
        """The last ``<answer>`` tag, SQuAD-normalised, so self-check turns stop on an unchanged answer."""
        answer = last_tag(response_text, "answer")
        return None if answer is None else normalise_squad(answer)

    def task_types(self, items: Sequence[Item]) -> list[str]:
        """The distinct topics, sorted."""
        return sorted({item.task_type for item in items}) or [DEFAULT_TASK_TYPE]

    def preflight(self, cfg: BaseModel) -> None:
        """A missing split folder gets a fix-it message; the flow checks the judge role for ``grader: llm``."""
        check_split_folder(_config(cfg), benchmark=BENCHMARK_ID, default_split_mode=self.default_split_mode,
                           fix="pass --data DIR (a folder holding train/, val/ and test/, each with one SealQA CSV "
                               "or items.json) or set benchmark.split_dir")

    def needs_judge(self, cfg: BaseModel) -> bool:
        """``grader: llm`` (the default) calls the judge role; ``grader: string`` never does."""
        return _config(cfg).grader == "llm"


def _config(cfg: BaseModel) -> SealQAConfig:
    return cfg if isinstance(cfg, SealQAConfig) else SealQAConfig.model_validate(cfg.model_dump())


plugin = SealQABenchmark()

__all__ = [
    "BENCHMARK_ID",
    "EpisodeContext",
    "EpisodeResult",
    "FetchError",
    "SealQABenchmark",
    "SealQAConfig",
    "UrlFetcher",
    "UrllibFetcher",
    "fetch_block",
    "normalise_row",
    "normalise_string_answer",
    "parse_list",
    "plugin",
    "read_rows",
    "string_match",
]
