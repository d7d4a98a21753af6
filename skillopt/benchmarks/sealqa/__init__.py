"""SealQA (``sealqa``): fact-seeking questions whose web evidence conflicts, misleads or says nothing.

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

import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from skillopt.benchmarks.answers import last_tag, quote_answer
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score
from skillopt.benchmarks.episode import EpisodeContext, EpisodeResult
from skillopt.benchmarks.rows import hashed_id, parse_list, read_table, required_text, text_field
from skillopt.benchmarks.sealqa.fetch import FetchError, UrlFetcher, UrllibFetcher, check_scheme, page_text
from skillopt.core.data import Item
from skillopt.core.errors import BenchmarkSetupError
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
_AFTER_FETCH = (
    "Using this content and the evidence given before, put your final answer inside <answer>…</answer>."
)
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
# The string grader keeps word characters, spaces, '%', '.' and '-'.
_STRING_GRADER_DROP = re.compile(r"[^\w\s%.\-]")


class SealQAConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``sealqa``: the common keys, the grader and the URL fetch."""

    #: ``llm`` asks the judge role (the default); ``string`` is the explicit offline grader.
    grader: Grader = "llm"
    #: Fetch the item's URLs (harness-side) when the first reply has no ``<answer>``.
    fetch_urls: bool = True
    fetch_max_urls: int = Field(default=2, ge=0)
    #: Seconds one GET may take (also bounded by the item's deadline).
    fetch_timeout: float = Field(default=20, gt=0)
    #: The text of one fetched page is cut to this many characters.
    fetch_max_chars: int = Field(default=6000, ge=1)
    max_tokens: int = Field(default=768, ge=1)


# ----------------------------------------------------------------------------------------- loading


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The raw reader: a CSV file (by extension), a folder holding exactly one CSV, or any shape
    :func:`read_records` accepts. Empty CSV cells count as absent."""
    return read_table(path)


def _first_present(row: Mapping[str, Any], names: Sequence[str]) -> Any:
    return next((row[name] for name in names if row.get(name) not in (None, "")), None)


def normalise_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A SealQA item (idempotent): ``question`` and ``answer|ground_truth`` are required.

    The id is ``question_id|id``, else ``"sealqa-" + sha1(question)[:12]`` (``canary`` is never an
    id and is dropped). ``urls`` and ``question_types`` may be lists or stringified lists;
    ``task_type`` is the topic. Raises ``KeyError(field)`` for a missing field and ``ValueError``
    for a bad one; the loader names the file and the row.
    """
    question = required_text(row, "question")
    gold = required_text(row, "answer", "ground_truth")
    raw_id = _first_present(row, ("question_id", "id"))
    if isinstance(raw_id, float) and raw_id.is_integer():
        raw_id = int(raw_id)
    item_id = raw_id if raw_id is not None else hashed_id("sealqa-", question)
    topic = text_field(row, "topic")
    item = {
        "id": item_id,
        "question": question,
        "answer": gold,
        "topic": topic,
        "urls": parse_list(row.get("urls"), "urls"),
        "search_results": text_field(row, "search_results"),
        "freshness": text_field(row, "freshness"),
        "question_types": parse_list(row.get("question_types"), "question_types"),
        "effective_year": text_field(row, "effective_year"),
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


# ------------------------------------------------------------------------------------------ plugin


class SealQABenchmark(Benchmark[SealQAConfig]):
    """The ``sealqa`` plug-in.

    ``fetcher`` is the :class:`UrlFetcher` of :meth:`run_episode`: the real ``urllib`` fetcher by
    default; tests pass a fake.
    """

    id = BENCHMARK_ID
    GOLD_FIELDS = ("answer",)
    Config = SealQAConfig
    default_task_type = DEFAULT_TASK_TYPE
    native_extensions = NATIVE_EXTENSIONS
    data_hint = ("pass --data DIR (a folder holding train/, val/ and test/, each with one SealQA CSV "
                 "or items.json) or set benchmark.split_dir")

    def __init__(self, fetcher: UrlFetcher | None = None) -> None:
        self.fetcher: UrlFetcher = fetcher if fetcher is not None else UrllibFetcher()

    def read_rows(self, path: Path, cfg: SealQAConfig) -> list[dict[str, Any]]:
        return read_rows(path)

    def normalise_row(self, row: Mapping[str, Any], cfg: SealQAConfig) -> dict[str, Any]:
        return normalise_row(row)

    def load_split(self, cfg: SealQAConfig, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split`` (``train``, ``val``, ``test`` or an alias); bad rows raise ``DataError``."""
        config = self.config(cfg)
        items = super().load_split(config, split, run_dir=run_dir)
        # ``score`` gets no config, so each loaded item carries its grader (never written to disk).
        return [Item({**item, "grader": config.grader}) for item in items]

    def build_messages(self, item: Item, skill: str, cfg: SealQAConfig) -> list[Message]:
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
            self.system_message(_SYSTEM_INTRO, skill, _ANSWER_FORMAT),
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
        config = self.config(ctx.cfg)
        messages = list(ctx.messages)
        text = ctx.ask(messages, turn=1, max_tokens=config.max_tokens)
        urls = list(item.get("urls") or [])[: config.fetch_max_urls]
        if last_tag(text, "answer") is not None or not config.fetch_urls or not urls:
            return EpisodeResult(text, n_turns=1, answered=True)
        blocks: list[str] = []
        for url in urls:
            remaining = ctx.deadline - time.monotonic()
            if remaining <= 0:
                return EpisodeResult(text, n_turns=1, answered=True, fetched_urls=tuple(urls[: len(blocks)]))
            block = fetch_block(
                url,
                self.fetcher,
                timeout_s=min(config.fetch_timeout, remaining),
                max_chars=config.fetch_max_chars,
            )
            ctx.record(
                {"type": "tool_call", "turn": 1, "name": FETCH_TOOL, "command": url, "observation": block}
            )
            blocks.append(block)
        follow_up = f"{_FETCHED_HEADING}\n\n" + "\n\n".join(blocks) + f"\n\n{_AFTER_FETCH}"
        ctx.record({"type": "feedback", "role": "user", "turn": 1, "content": follow_up})
        if time.monotonic() >= ctx.deadline:
            return EpisodeResult(text, n_turns=1, answered=True, fetched_urls=tuple(urls))
        text = ctx.ask([*messages, assistant(text), user(follow_up)], turn=2, max_tokens=config.max_tokens)
        return EpisodeResult(text, n_turns=2, answered=True, fetched_urls=tuple(urls))

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
                raise BenchmarkSetupError(
                    "sealqa: grader 'llm' needs the judge role, but the runner gave no judge"
                )
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
                user(f"## Question\n{item['question']}\n\n## Gold answer\n{gold}\n\n## Answer to "
                     f"grade\n{prediction}"),
            ],
            stage="judge",
            tags={"item_id": item.id, "prediction": prediction, "gold_answers": [gold]},
        )

    def needs_judge(self, cfg: SealQAConfig) -> bool:
        """``grader: llm`` (the default) calls the judge role; ``grader: string`` never does."""
        return self.config(cfg).grader == "llm"


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
