"""Bring-your-own QA (``qa``): train a skill on your own question/answer file.

``skillopt train qa --data my_items.jsonl`` splits one JSONL, JSON or CSV file at 2:1:7. Each row
needs a question and an answer (a string or a list of strings); ``id``, ``context``, ``choices``
and ``task_type`` are optional, and ``benchmark.fields`` renames any of them. Rows are normalized
to ``{id, question, answers, context, choices, task_type}``.

The target answers inside ``<answer>…</answer>`` (the option label for choice items).
``benchmark.scoring`` picks one scorer, with no fallback: ``exact`` (SQuAD exact match, token F1
as partial credit), ``choice`` (the option label), ``numeric`` (the last number, within a relative
``tolerance``) or ``judge`` (the ``judge`` role's verdict; the only scorer that calls a model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from skillopt.benchmarks.answers import (
    Fallback,
    best_f1,
    choice_label,
    exact_match,
    label_contradicts,
    last_number,
    last_number_text,
    leading_choice,
    quote_answer,
    read_answer,
    resolve_choice,
)
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score, with_reading
from skillopt.benchmarks.choices import labelled, options_block, options_of
from skillopt.benchmarks.rows import hashed_id, read_table
from skillopt.core.data import Item, read_records
from skillopt.core.errors import BenchmarkSetupError, DataError
from skillopt.llm.chat import ChatRequest, Message, system, user

BENCHMARK_ID = "qa"
DEFAULT_TASK_TYPE = "qa"
#: The keys of a normalized row (``source_id`` is added by the loader when sanitising changed an id).
NORMALIZED_KEYS = frozenset({"id", "question", "answers", "context", "choices", "task_type", "source_id"})
#: Data files read in split_dir mode when a split has no ``items.json`` (the first sorted match).
NATIVE_EXTENSIONS = (".jsonl", ".json", ".csv")
Scoring = Literal["exact", "choice", "numeric", "judge"]

_SYSTEM_INTRO = "Answer the question accurately. When a context is given, base your answer on it."
_ANSWER_FORMAT = (
    "Give your final answer inside <answer>…</answer> at the end of your reply. For a question with "
    "labelled choices, put only the option label inside the tag."
)
_REMINDER = "Put your final answer inside <answer>…</answer>."
_CHOICE_REMINDER = "Put the label of the option you choose inside <answer>…</answer>."
_JUDGE_INSTRUCTIONS = (
    "You grade an answer to a question. The answer is correct when it states the same thing as at least "
    "one of the gold answers: wording, casing and formatting may differ, but the content may not, and an "
    "answer that adds a conflicting or hedging alternative is incorrect. Judge only against the gold "
    'answers. Reply with JSON {"verdict": "correct"|"incorrect", "reason": str}; keep the reason to one '
    "sentence."
)


class QAFields(BaseModel):
    """``benchmark.fields``: the name of each field in your rows (each defaults to its own name)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = "id"
    question: str = "question"
    answer: str = "answer"
    context: str = "context"
    choices: str = "choices"
    task_type: str = "task_type"


class QAConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``qa``: the common keys, the field names and the scorer."""

    fields: QAFields = Field(default_factory=QAFields)
    scoring: Scoring = "exact"
    #: Relative tolerance of ``scoring: numeric``: ``abs(p - g) <= tolerance * abs(g)``.
    tolerance: float = Field(default=1e-6, ge=0)
    #: A reply without an ``<answer>`` tag is read by the fallback (a choice item's leading label or
    #: option text; under ``numeric`` the last number) and its row is marked ``format: untagged``.
    answer_fallback: bool = True


# ----------------------------------------------------------------------------------------- loading



def read_rows(path: Path, fields: QAFields) -> list[dict[str, Any]]:
    """The raw reader: a CSV file (by extension) or any shape :func:`read_records` accepts.

    A folder must hold exactly one ``.json``, ``.jsonl`` or ``.csv`` file. In a CSV, empty cells
    count as absent and an ``answer`` or ``choices`` cell that holds a JSON list is that list.
    """
    path = Path(path)
    if path.is_dir() and not any((path / split).is_dir() for split in ("train", "val", "test")):
        found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in NATIVE_EXTENSIONS)
        if len(found) != 1:
            names = ", ".join(p.name for p in found) or "none"
            raise DataError(
                f"{path}: expected exactly one .jsonl, .json or .csv file in the folder; found {names}"
            )
        path = found[0]
    if path.suffix.lower() == ".csv":
        return read_table(path, list_columns=(fields.answer, fields.choices))
    return read_records(path)


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


def _text(value: Any, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"field {field!r} must be a string, got {type(value).__name__}")
    return str(value)


def _text_list(value: Any, field: str) -> list[str]:
    values = value if isinstance(value, list) else [value]
    return [_text(v, field) for v in values]


def normalise_row(row: Mapping[str, Any], cfg: QAConfig) -> dict[str, Any]:
    """One normalized item from a raw or already normalized row (idempotent).

    Raises ``KeyError(field)`` for a missing question or answer and ``ValueError`` for a bad value;
    the split loader turns both into a ``DataError`` naming the file and the row. Under
    ``scoring: choice`` every item needs choices and a gold that names an option; under
    ``scoring: numeric`` every item needs a gold holding a number.
    """
    keys = set(row)
    if {"question", "answers"} <= keys <= NORMALIZED_KEYS and isinstance(row["answers"], list):
        names = QAFields(answer="answers")  # already normalized, whatever benchmark.fields says
    else:
        names = cfg.fields
    for field in (names.question, names.answer):
        if not _present(row.get(field)):
            raise KeyError(field)
    question = _text(row[names.question], names.question)
    answers = [a for a in _text_list(row[names.answer], names.answer) if a.strip()]
    if not answers:
        raise ValueError(f"field {names.answer!r} holds no non-empty answer")
    context = _text(row[names.context], names.context) if _present(row.get(names.context)) else ""
    raw_choices = row.get(names.choices)
    if not _present(raw_choices):
        choices: list[str] = []
    elif isinstance(raw_choices, list):
        choices = _text_list(raw_choices, names.choices)
    else:
        raise ValueError(f"field {names.choices!r} must be a list of strings (in a CSV, a JSON list)")
    task_type = _text(row[names.task_type], names.task_type) if _present(row.get(names.task_type)) else ""
    raw_id = row.get(names.id)
    item_id = raw_id if _present(raw_id) else hashed_id("qa-", question)
    item = {
        "id": item_id,
        "question": question,
        "answers": answers,
        "context": context,
        "choices": choices,
        "task_type": task_type or DEFAULT_TASK_TYPE,
    }
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    _check_scorable(item, cfg.scoring, names)
    return item


def _check_scorable(item: Mapping[str, Any], scoring: Scoring, names: QAFields) -> None:
    if scoring == "choice":
        if not item["choices"]:
            raise ValueError(f"scoring 'choice' needs choices; field {names.choices!r} is missing or empty")
        if not any(resolve_label(gold, item["choices"]) for gold in item["answers"]):
            raise ValueError(
                f"field {names.answer!r}: no answer names an option (a label such as 'A' or an option's text)"
            )
    if scoring == "numeric" and all(last_number(gold) is None for gold in gold_texts(item)):
        raise ValueError(f"scoring 'numeric' needs a number in field {names.answer!r}")


# ----------------------------------------------------------------------------------------- choices


def as_label(text: str, choices: Sequence[str]) -> str | None:
    """``text`` as an option label (``B``, ``b``, ``(B)``, ``B.``, ``B:``), or None when it is not one."""
    candidate = text.strip().upper().removeprefix("(").rstrip(".):").strip()
    labels = {choice_label(i) for i in range(len(choices))}
    return candidate if candidate in labels else None


def resolve_label(text: str, choices: Sequence[str]) -> str | None:
    """The label ``text`` names (``B``, ``(B)``, ``B. <its text>``, or an option's text), or None —
    also for a label whose text contradicts it (:func:`skillopt.benchmarks.answers.resolve_choice`)."""
    return resolve_choice(text, _options(choices))


def option_text(text: str, choices: Sequence[str]) -> str:
    """An answer that names an option replaced by that option's text; anything else unchanged."""
    label = resolve_label(text, choices)
    return text if label is None else _options(choices)[label]


def _options(choices: Sequence[str]) -> dict[str, str]:
    return options_of(labelled(choices))


def gold_texts(item: Mapping[str, Any]) -> list[str]:
    """The gold answers with any label replaced by its option's text."""
    return [option_text(gold, item.get("choices") or []) for gold in item["answers"]]


def _expected(item: Mapping[str, Any]) -> list[str]:
    """The golds as the evaluation event shows them: ``B. Jupiter`` for a label, else as written."""
    choices = item.get("choices") or []
    shown = []
    for gold in item["answers"]:
        label = as_label(gold, choices)
        shown.append(f"{label}. {option_text(gold, choices)}" if label else gold)
    return shown


# ----------------------------------------------------------------------------------------- scorers


@dataclass(frozen=True)
class _ScoreParts:
    """What every scorer's ``Score`` shares: the scorer's name and the golds as shown."""

    scoring: Scoring
    gold_answers: list[str]
    expected: list[str]

    def score(
        self, value: float, soft: float, answer: str, fail_reason: str, *, detail: str = "", **extras: Any
    ) -> Score:
        return Score(
            hard=value,
            soft=soft,
            predicted_answer=answer,
            fail_reason=fail_reason,
            extras={"scoring": self.scoring, "gold_answers": self.gold_answers, **extras},
            expected=str(self.expected),
            detail=detail,
        )


def _score_exact(item: Mapping[str, Any], answer: str, parts: _ScoreParts) -> Score:
    """hard = SQuAD exact match with any gold, soft = the best token F1 (labels read as option text).

    A label whose text names another option (``A. implausible`` when A is *plausible*) is wrong: no
    normalisation strips a label to let its text match."""
    choices = item.get("choices") or []
    if choices and label_contradicts(answer, _options(choices)):
        return parts.score(
            0.0,
            0.0,
            answer,
            f"wrong: the label contradicts its text in '{quote_answer(answer)}', expected {parts.expected}",
            detail="label and option text disagree",
            f1=0.0,
        )
    prediction = option_text(answer, choices)
    golds = gold_texts(item)
    em = exact_match(prediction, golds)
    f1 = 1.0 if em else best_f1(prediction, golds)
    fail = "" if em else f"wrong: EM=0, predicted '{quote_answer(answer)}', expected {parts.expected}"
    return parts.score(float(em), f1, answer, fail, detail=f"EM={int(em)} F1={f1:.2f}", f1=round(f1, 4))


def _score_choice(item: Mapping[str, Any], answer: str, parts: _ScoreParts) -> Score:
    """hard = soft = the predicted option is a gold option (by label or by option text)."""
    choices = item.get("choices") or []
    label = resolve_label(answer, choices)
    gold_labels = sorted({g for g in (resolve_label(gold, choices) for gold in item["answers"]) if g})
    if label is None:
        why = (
            "its label contradicts its text"
            if label_contradicts(answer, _options(choices))
            else "not a valid option"
        )
        return parts.score(0.0, 0.0, answer, f"no-answer: {why}",
                           detail=f"options {', '.join(choice_label(i) for i in range(len(choices)))}")
    correct = label in gold_labels
    fail = "" if correct else f"wrong: predicted option {label}, expected {parts.expected}"
    value = float(correct)
    return parts.score(
        value, value, answer, fail, detail=f"label: predicted {label}, gold {'/'.join(gold_labels)}"
    )


def _score_numeric(item: Mapping[str, Any], answer: str, tolerance: float, parts: _ScoreParts) -> Score:
    """hard = soft = the last number of the answer is within ``tolerance`` (relative) of a gold's."""
    predicted = last_number(option_text(answer, item.get("choices") or []))
    golds = [g for g in (last_number(gold) for gold in gold_texts(item)) if g is not None]
    if predicted is None:
        return parts.score(0.0, 0.0, answer, "no-answer: no number")
    correct = any(abs(predicted - gold) <= tolerance * abs(gold) for gold in golds)
    fail = "" if correct else f"wrong: predicted {predicted:g}, expected {parts.expected}"
    value = float(correct)
    detail = f"numeric: predicted {predicted:g}, golds {[f'{g:g}' for g in golds]}, tolerance {tolerance:g}"
    return parts.score(value, value, answer, fail, detail=detail)


def _score_judge(item: Item, answer: str, judge: Judge | None, parts: _ScoreParts) -> Score:
    """hard = soft = the judge role's verdict on the answer (a label read as its option text)."""
    if judge is None:
        raise BenchmarkSetupError("qa: scoring 'judge' needs the judge role, but the runner gave no judge")
    correct, reason = judge(item, option_text(answer, item.get("choices") or []))
    fail = "" if correct else f"wrong: judge: {quote_answer(reason) or 'incorrect'}"
    value = float(correct)
    return parts.score(value, value, answer, fail, detail=f"Judge: {reason}")


def _score_with(scoring: Scoring, item: Item, answer: str, judge: Judge | None, parts: _ScoreParts) -> Score:
    if scoring == "choice":
        return _score_choice(item, answer, parts)
    if scoring == "numeric":
        return _score_numeric(item, answer, float(item.get("tolerance", 1e-6)), parts)
    if scoring == "judge":
        return _score_judge(item, answer, judge, parts)
    return _score_exact(item, answer, parts)


def _fallback(item: Mapping[str, Any]) -> Fallback | None:
    """How an answer is read from a reply without an ``<answer>`` tag: a choice item's leading label
    or option text; under ``scoring: numeric`` the last number (digits or words); else none."""
    if item.get("choices"):
        return leading_choice(_options(item["choices"]))
    if item.get("scoring") == "numeric":
        return last_number_text
    return None


# ------------------------------------------------------------------------------------------ plugin


class QABenchmark(Benchmark[QAConfig]):
    """The ``qa`` plug-in."""

    id = BENCHMARK_ID
    version = "2"  # 2: the shared answer reader (untagged answers marked, contradicting labels rejected)
    GOLD_FIELDS = ("answers",)
    Config = QAConfig
    default_split_mode = "ratio"
    default_task_type = DEFAULT_TASK_TYPE
    native_extensions = NATIVE_EXTENSIONS

    def read_rows(self, path: Path, cfg: QAConfig) -> list[dict[str, Any]]:
        return read_rows(path, cfg.fields)

    def normalise_row(self, row: Mapping[str, Any], cfg: QAConfig) -> dict[str, Any]:
        return normalise_row(row, cfg)

    def load_split(self, cfg: QAConfig, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split`` (``train``, ``val``, ``test`` or an alias); bad rows raise ``DataError``."""
        config = self.config(cfg)
        items = super().load_split(config, split, run_dir=run_dir)
        # ``score`` gets no config, so each loaded item carries how it is scored (never written to disk).
        return [
            Item({**item, "scoring": config.scoring, "tolerance": config.tolerance,
                  "answer_fallback": config.answer_fallback})
            for item in items
        ]

    def build_messages(self, item: Item, skill: str, cfg: QAConfig) -> list[Message]:
        """System: task, skill, answer format. User: context, question, choices, reminder.

        Never reads gold."""
        sections = []
        if str(item.get("context") or "").strip():
            sections.append(f"## Context\n{item['context']}")
        sections.append(f"## Question\n{item['question']}")
        choices = item.get("choices") or []
        if choices:
            sections.append(f"## Choices\n{options_block(labelled(choices))}")
        sections.append(_CHOICE_REMINDER if choices else _REMINDER)
        return [
            self.system_message(_SYSTEM_INTRO, skill, _ANSWER_FORMAT),
            user("\n\n".join(sections)),
        ]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """Score the last ``<answer>`` tag with the scorer the item was loaded under (``scoring``).

        A missing tag or a wrong answer is a scored row; only ``scoring: judge`` without a judge
        raises, since that is a setup error rather than a score.
        """
        scoring: Scoring = item.get("scoring", "exact")
        expected = _expected(item)
        parts = _ScoreParts(scoring=scoring, gold_answers=list(item["answers"]), expected=expected)
        reading = read_answer(response_text, _fallback(item) if item.get("answer_fallback", True) else None)
        if reading.ambiguous:
            return with_reading(parts.score(0.0, 0.0, "", "ambiguous: the reply names more than one option"),
                                reading)
        if reading.text is None:
            return parts.score(0.0, 0.0, "", "no-answer: no <answer> tag")
        return with_reading(_score_with(scoring, item, reading.text, judge, parts), reading)

    def judge_request(self, item: Item, prediction: str) -> ChatRequest:
        """The judge's request: the question (with its choices), the golds and the prediction.

        The tags ``prediction`` and ``gold_answers`` let the scripted judge grade offline.
        """
        golds = gold_texts(item)
        choices = item.get("choices") or []
        question = item["question"]
        if choices:
            question += "\n" + options_block(labelled(choices))
        golds_block = "\n".join(f"- {gold}" for gold in golds)
        return ChatRequest(
            messages=[
                system(_JUDGE_INSTRUCTIONS),
                user(
                    f"## Question\n{question}\n\n## Gold answers\n{golds_block}\n\n"
                    f"## Answer to grade\n{prediction}"
                ),
            ],
            stage="judge",
            tags={"item_id": item.id, "prediction": prediction, "gold_answers": golds},
        )


    def preflight(self, cfg: QAConfig) -> None:
        """Nothing external: the flow checks the judge role when ``scoring: judge`` needs it."""
        self.config(cfg)

    def needs_judge(self, cfg: QAConfig) -> bool:
        """Only ``scoring: judge`` calls the judge role."""
        return self.config(cfg).scoring == "judge"


plugin = QABenchmark()

__all__ = [
    "BENCHMARK_ID",
    "QABenchmark",
    "QAConfig",
    "QAFields",
    "as_label",
    "choice_label",
    "gold_texts",
    "normalise_row",
    "option_text",
    "plugin",
    "read_rows",
    "resolve_label",
]
