"""SearchQA (``searchqa``): Jeopardy-style clues answered from retrieved web snippets.

Items are ``{id, question, context, answers, task_type?}``; ``context`` is a run of
``[DOC] [TLE] <title> [PAR] <text>`` passages, cut to ``max_context_chars`` at passage boundaries
for the prompt. The target reasons briefly and puts the shortest answer inside
``<answer>…</answer>``; the answer is scored by SQuAD exact match (hard) and token F1 (soft).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from skillopt.benchmarks.answers import (
    best_f1,
    exact_match,
    last_line,
    quote_answer,
    read_answer,
    sub_exact_match,
)
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score, with_reading
from skillopt.core.data import Item
from skillopt.llm.chat import Message, user

BENCHMARK_ID = "searchqa"
DEFAULT_TASK_TYPE = "qa"
TRUNCATED = "...[truncated]"

_SYSTEM_INTRO = (
    "You answer Jeopardy-style trivia clues using the search snippets you are given. Each snippet starts "
    "with [DOC]; [TLE] marks its title and [PAR] its text."
)
_ANSWER_FORMAT = (
    "Reason briefly, then give the shortest possible final answer (just the entity, name or number) "
    "inside <answer>…</answer> at the end of your reply."
)
_PASSAGE_START = re.compile(r"(?=\[DOC\])")


class SearchQAConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``searchqa``: the common keys plus the context budget."""

    #: The context shown to the target is cut to this many characters, keeping whole passages.
    max_context_chars: int = Field(default=6000, ge=1)
    max_tokens: int = Field(default=512, ge=1)


def normalise_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A SearchQA item (idempotent): ``id``, ``question``, ``context`` and non-empty ``answers`` are required.

    A single answer string is read as a one-answer list. Raises ``KeyError(field)`` for a missing
    field and ``ValueError`` for a bad one; the loader names the file and the row.
    """
    for field in ("id", "question", "context", "answers"):
        if row.get(field) is None:
            raise KeyError(field)
    for field in ("question", "context"):
        if not isinstance(row[field], str):
            raise ValueError(f"field {field!r} must be a string, got {type(row[field]).__name__}")
    if not row["question"].strip():
        raise ValueError("field 'question' is empty")
    raw_answers = row["answers"] if isinstance(row["answers"], list) else [row["answers"]]
    if not all(isinstance(answer, str) for answer in raw_answers):
        raise ValueError("field 'answers' must be a list of strings")
    answers = [answer for answer in raw_answers if answer.strip()]
    if not answers:
        raise ValueError("field 'answers' holds no non-empty answer")
    item = {
        "id": row["id"],
        "question": row["question"],
        "context": row["context"],
        "answers": answers,
        "task_type": row.get("task_type") or DEFAULT_TASK_TYPE,
    }
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    return item


def cut_context(context: str, max_chars: int) -> str:
    """``context`` cut to at most ``max_chars`` characters at ``[DOC]`` boundaries, whole passages only.

    When the first passage alone is longer, it is hard-cut and ends in ``...[truncated]`` (the
    marker counts toward ``max_chars``). Text before the first ``[DOC]`` belongs to the first passage.
    """
    if len(context) <= max_chars:
        return context
    passages = [part for part in _PASSAGE_START.split(context) if part]
    if len(passages) > 1 and not passages[0].startswith("[DOC]"):
        passages[:2] = [passages[0] + passages[1]]
    kept = ""
    for passage in passages:
        if len(kept) + len(passage) > max_chars:
            break
        kept += passage
    if kept:
        return kept.rstrip()
    return context[: max(max_chars - len(TRUNCATED), 0)] + TRUNCATED


class SearchQABenchmark(Benchmark[SearchQAConfig]):
    """The ``searchqa`` plug-in."""

    id = BENCHMARK_ID
    version = "2"  # 2: the shared answer reader (untagged answers marked, contradicting labels rejected)
    GOLD_FIELDS = ("answers",)
    Config = SearchQAConfig
    default_task_type = DEFAULT_TASK_TYPE
    data_hint = ("pass --data DIR (a folder holding train/, val/ and test/ items.json, as "
                 "scripts/materialize_searchqa.py writes them) or set benchmark.split_dir")

    def normalise_row(self, row: Mapping[str, Any], cfg: SearchQAConfig) -> dict[str, Any]:
        return normalise_row(row)

    def build_messages(self, item: Item, skill: str, cfg: SearchQAConfig) -> list[Message]:
        """System: task, skill, answer format. User: the cut context, then the clue. Never reads gold."""
        context = cut_context(str(item["context"]), self.config(cfg).max_context_chars)
        return [
            self.system_message(_SYSTEM_INTRO, skill, _ANSWER_FORMAT),
            user(f"## Context\n{context}\n\n## Question\n{item['question']}"),
        ]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """hard = SQuAD exact match with any gold, soft = the best token F1; ``sub_em`` is reported only."""
        golds = [str(gold) for gold in item["answers"]]
        reading = read_answer(response_text, last_line)  # untagged: the last non-empty line
        answer = reading.text or ""
        em = exact_match(answer, golds)
        f1 = 1.0 if em else best_f1(answer, golds)
        sub_em = sub_exact_match(answer, golds)
        if em:
            fail = ""
        elif not answer:
            fail = "no-answer: empty reply"
        else:
            fail = f"wrong: EM=0, predicted '{quote_answer(answer)}', expected {golds}"
        return with_reading(Score(
            hard=float(em),
            soft=f1,
            predicted_answer=answer,
            fail_reason=fail,
            extras={"em": float(em), "f1": round(f1, 4), "sub_em": float(sub_em), "gold_answers": golds},
            expected=str(golds),
            detail=f"EM={int(em)} F1={f1:.2f} sub_EM={int(sub_em)}",
        ), reading)



plugin = SearchQABenchmark()

__all__ = [
    "BENCHMARK_ID",
    "SearchQABenchmark",
    "SearchQAConfig",
    "cut_context",
    "normalise_row",
    "plugin",
]
