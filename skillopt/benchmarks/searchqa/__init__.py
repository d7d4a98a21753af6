"""SearchQA (``searchqa``): Jeopardy-style clues answered from retrieved web snippets (BENCHMARKS.md §2.2).

Items are ``{id, question, context, answers, task_type?}``; ``context`` is a run of
``[DOC] [TLE] <title> [PAR] <text>`` passages, cut to ``max_context_chars`` at passage boundaries
for the prompt. The target reasons briefly and puts the shortest answer inside
``<answer>…</answer>``; the answer is scored by SQuAD exact match (hard) and token F1 (soft).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from skillopt.benchmarks.answers import (
    best_f1,
    exact_match,
    last_tag,
    normalise_squad,
    quote_answer,
    sub_exact_match,
    tag_or_last_line,
)
from skillopt.benchmarks.base import (
    Judge,
    Score,
    check_split_folder,
    shipped_prompts_dir,
    skill_section,
    split_items,
)
from skillopt.benchmarks.scripted_target import question_rules
from skillopt.config import BenchmarkSection
from skillopt.data import Item
from skillopt.llm.chat import Message, system, user

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


class SearchQAConfig(BenchmarkSection):
    """The ``benchmark:`` section for ``searchqa``: the common keys plus the context budget."""

    model_config = ConfigDict(extra="forbid")

    #: The context shown to the target is cut to this many characters, keeping whole passages.
    max_context_chars: int = Field(default=6000, ge=1)
    #: The target's output cap for this benchmark (a per-call override of model.target.max_tokens).
    max_tokens: int = Field(default=512, ge=1)
    #: Set by ``--data DIR``; ``searchqa`` reads no assets beside its rows, so it is accepted and unused.
    data_root: str | None = None


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


def read_answer(response_text: str) -> str:
    """The answer the scorer reads: the last ``<answer>`` tag, else the last non-empty line, else the
    whole reply (stripped)."""
    return tag_or_last_line(response_text, "answer")


#: The scripted target's replies to the fixture clues (tests/fixtures/searchqa): the novel and the
#: element are solved, the river clue gets an over-long answer (EM 0, F1 0.67).
_SCRIPTED_REPLIES = (
    (
        re.compile(r"## Question\nThis 1926 novel"),
        "The snippet names Hemingway's first novel.\n<answer>Sun Also Rises</answer>",
    ),
    (
        re.compile(r"## Question\nCapital city that sits on the Vltava"),
        "The Vltava flows through the Czech capital.\n<answer>Prague, Czechia</answer>",
    ),
    (
        re.compile(r"## Question\nElement with atomic number 79"),
        "Atomic number 79 is Au.\n<answer>Gold</answer>",
    ),
)



class SearchQABenchmark:
    """The ``searchqa`` plug-in (the ``Benchmark`` protocol in ``skillopt.benchmarks.base``)."""

    id = BENCHMARK_ID
    version = "1"
    GOLD_FIELDS: tuple[str, ...] = ("answers",)
    Config = SearchQAConfig
    default_split_mode = "split_dir"
    scripted_rules: Sequence[Mapping[str, Any]] = (
        *question_rules(BENCHMARK_ID, _SCRIPTED_REPLIES),
        {
            "name": "searchqa other",
            "stage": "rollout",
            "text": "The snippets do not say.\n<answer>unknown</answer>",
        },
    )

    @property
    def prompts_dir(self) -> Path:
        return shipped_prompts_dir(BENCHMARK_ID)

    def load_split(self, cfg: BaseModel, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split`` (``train``, ``val``, ``test`` or an alias); bad rows raise ``DataError``."""
        return split_items(
            _config(cfg), split, run_dir=run_dir, benchmark=BENCHMARK_ID, default_split_mode=self.default_split_mode,
            normalise=normalise_row,
            default_task_type=DEFAULT_TASK_TYPE,
            native_extensions=(".json", ".jsonl"),
        )

    def build_messages(self, item: Item, skill: str, cfg: BaseModel) -> list[Message]:
        """System: task, skill, answer format. User: the cut context, then the clue. Never reads gold."""
        context = cut_context(str(item["context"]), _config(cfg).max_context_chars)
        return [
            system(f"{_SYSTEM_INTRO}\n\n{skill_section(skill)}{_ANSWER_FORMAT}"),
            user(f"## Context\n{context}\n\n## Question\n{item['question']}"),
        ]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """hard = SQuAD exact match with any gold, soft = the best token F1; ``sub_em`` is reported only."""
        golds = [str(gold) for gold in item["answers"]]
        answer = read_answer(response_text)
        em = exact_match(answer, golds)
        f1 = 1.0 if em else best_f1(answer, golds)
        sub_em = sub_exact_match(answer, golds)
        if em:
            fail = ""
        elif not answer:
            fail = "no-answer: empty reply"
        else:
            fail = f"wrong: EM=0, predicted '{quote_answer(answer)}', expected {golds}"
        return Score(
            hard=float(em),
            soft=f1,
            predicted_answer=answer,
            fail_reason=fail,
            extras={"em": float(em), "f1": round(f1, 4), "sub_em": float(sub_em), "gold_answers": golds},
            expected=str(golds),
            detail=f"EM={int(em)} F1={f1:.2f} sub_EM={int(sub_em)}",
        )

    def extract_answer(self, response_text: str) -> str | None:
        """The last ``<answer>`` tag, SQuAD-normalised, or None: self-check turns ask for the tag until
        there is one (the scorer's line fallback is a leniency, not the format)."""
        answer = last_tag(response_text, "answer")
        return None if answer is None else normalise_squad(answer)

    def task_types(self, items: Sequence[Item]) -> list[str]:
        """``["qa"]`` unless items name other task types (then those, sorted)."""
        return sorted({item.task_type for item in items}) or [DEFAULT_TASK_TYPE]

    def preflight(self, cfg: BaseModel) -> None:
        """SearchQA needs only the target model; a missing split folder gets a fix-it message here."""
        check_split_folder(_config(cfg), benchmark=BENCHMARK_ID, default_split_mode=self.default_split_mode,
                           fix="pass --data DIR (a folder holding train/, val/ and test/ items.json, as "
                               "scripts/materialize_searchqa.py writes them) or set benchmark.split_dir")

    def needs_judge(self, cfg: BaseModel) -> bool:
        return False


def _config(cfg: BaseModel) -> SearchQAConfig:
    return cfg if isinstance(cfg, SearchQAConfig) else SearchQAConfig.model_validate(cfg.model_dump())


plugin = SearchQABenchmark()

__all__ = [
    "BENCHMARK_ID",
    "SearchQABenchmark",
    "SearchQAConfig",
    "cut_context",
    "normalise_row",
    "plugin",
    "read_answer",
]
