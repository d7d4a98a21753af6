"""LiveMathematicianBench (``livemathematicianbench``): research-level math multiple choice.

Each item asks which of a few statements a recent arXiv theorem proves. Raw rows are the monthly
``qa_YYYYMM_final.json`` files (``mcq: {question, choices, correct_choice}``, the three keys also
accepted at top level; ``choices`` a list of ``{label, text|content}``, a list of strings or a
dict label → text). They are normalized to ``{id, month, no, paper_link, theorem, sketch,
theorem_type, question, choices: [{label, text}], correct_choice: {label, text}, source_path}``.

With ``shuffle_choices`` (the default) the loaded items are a view whose choices are shuffled per
item with a seeded RNG and relabelled A, B, C…; ``correct_choice`` follows its text. The target
reasons and puts only the option label inside ``<answer>…</answer>``; hard = soft = the label is
the correct one. The theorem and proof sketch are gold unless ``use_theorem`` / ``use_sketch``
put them in the prompt; the evaluation event carries them to the analyst as a hidden reference.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from skillopt.benchmarks.answers import (
    clean_label,
    label_contradicts,
    last_choice_line,
    last_tag,
    quote_answer,
    read_answer,
    resolve_choice,
)
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score, with_reading
from skillopt.benchmarks.choices import labelled, options_block, options_of, parse_options
from skillopt.benchmarks.grading import HIDDEN_REFERENCE_CHARS, hidden_reference_block
from skillopt.core.data import DropRow, Item, read_records
from skillopt.core.errors import DataError
from skillopt.llm.chat import Message, user

BENCHMARK_ID = "livemathematicianbench"
DEFAULT_TASK_TYPE = "math_mcq"
#: The monthly release files a ratio-mode ``data_path`` folder is searched for, recursively.
RAW_FILE_GLOB = "qa_*_final.json"

_MONTH_IN_NAME = re.compile(r"qa_(\d{6})_final\.json$")
_SYSTEM_INTRO = (
    "You are a careful solver of research-level mathematics multiple-choice questions. Each option is a "
    "precise mathematical statement and only one is what was actually proved. Watch quantifiers (for all / "
    "there exists), hypotheses, extremal wording (at most, at least, sharp, optimal) and equality cases."
)
_ANSWER_FORMAT = (
    "Reason step by step, then give only the label of the option you choose inside <answer>…</answer> at "
    "the end of your reply, for example <answer>B</answer>."
)


class LiveMathematicianBenchConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``livemathematicianbench``: the common keys plus the prompt switches."""

    #: Shuffle and relabel each item's choices with a per-item seeded RNG (``correct_choice`` follows).
    shuffle_choices: bool = True
    #: Show the theorem (``## Theorem``) in the prompt; it is then no longer gold.
    use_theorem: bool = False
    #: Show the proof sketch (``## Proof Sketch``) in the prompt; it is then no longer gold.
    use_sketch: bool = False
    max_tokens: int = Field(default=16384, ge=1)


# ----------------------------------------------------------------------------------------- loading


def read_raw(path: Path) -> list[dict[str, Any]]:
    """The raw reader: one JSON/JSONL file (any shape :func:`read_records` accepts), or a folder
    searched recursively for ``qa_*_final.json`` (sorted by path).

    Each row gets ``source_path`` (relative to a folder ``path``, else the file name) and, when it
    has none, the ``month`` of its file name.
    """
    path = Path(path)
    if not path.is_dir():
        return [_with_source(row, path, path.name) for row in read_records(path)]
    files = sorted(path.rglob(RAW_FILE_GLOB))
    if not files:
        read_records(path)  # a split folder or a folder of one other file gets read_records' own message
        raise DataError(f"{path}: no {RAW_FILE_GLOB} file below this folder")
    return [
        _with_source(row, file, file.relative_to(path).as_posix())
        for file in files
        for row in read_records(file)
    ]


def _with_source(row: dict[str, Any], file: Path, shown: str) -> dict[str, Any]:
    row = {**row, "source_path": row.get("source_path") or shown}
    found = _MONTH_IN_NAME.search(file.name)
    if found and not row.get("month"):
        row["month"] = found.group(1)
    return row


def normalise_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A normalized item from a raw or normalized row (idempotent).

    Drops (``DropRow``) a row without a question (``no_question``), without choices
    (``no_choices``) or whose correct label cannot be resolved (``no_correct_label``). A correct
    ``{label, text}`` whose label is not among the choices is inserted. Raises ``KeyError('no')``
    for a row with neither ``no`` nor ``id`` and ``ValueError`` for a malformed value.
    """
    mcq: Mapping[str, Any] = row["mcq"] if isinstance(row.get("mcq"), Mapping) else row
    question = mcq.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DropRow("no_question")
    choices = parse_options(mcq.get("choices"))
    if not choices:
        raise DropRow("no_choices")
    correct = _correct(mcq.get("correct_choice"), choices)
    if correct is None:
        raise DropRow("no_correct_label")
    month = str(row.get("month") or "")
    number = row.get("no")
    if number is None:
        if row.get("id") in (None, ""):
            raise KeyError("no")
        item_id = row["id"]
    else:
        item_id = f"{month}:{number}" if month else str(number)
    theorem_type = row.get("theorem_type") or []
    tags = [theorem_type] if isinstance(theorem_type, str) else [str(tag) for tag in theorem_type]
    tags = [tag.strip() for tag in tags if tag.strip()]
    item = {
        "id": item_id,
        "month": month,
        "no": number,
        "paper_link": str(row.get("paper_link") or ""),
        "theorem": str(row.get("theorem") or ""),
        "sketch": str(row.get("sketch") or ""),
        "theorem_type": tags,
        "question": question,
        "choices": choices,
        "correct_choice": correct,
        "source_path": str(row.get("source_path") or ""),
        "task_type": tags[0] if tags else DEFAULT_TASK_TYPE,
    }
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    return item


def _correct(raw: Any, choices: list[dict[str, str]]) -> dict[str, str] | None:
    """The correct ``{label, text}``; a labelled correct choice missing from ``choices`` is inserted
    there (in label order). None when no label can be resolved."""
    options = {choice["label"]: choice["text"] for choice in choices}
    if isinstance(raw, Mapping):
        label = clean_label(raw.get("label") or "")
        text = raw.get("text", raw.get("content"))
    elif isinstance(raw, str | int) and not isinstance(raw, bool):
        label, text = clean_label(str(raw)), None
    else:
        return None
    if label not in options and isinstance(text, str):
        if not label:
            label = resolve_choice(text, options) or ""
        elif text.strip():
            choices.append({"label": label, "text": text})
            choices.sort(key=lambda choice: (len(choice["label"]), choice["label"]))
            options[label] = text
    if label not in options:
        return None
    return {"label": label, "text": options[label]}


def shuffled_view(item: Item, seed: int) -> Item:
    """A copy of ``item`` whose choices are shuffled with
    ``random.Random(int(sha256(f"{seed}:{id}").hexdigest()[:16], 16))`` and relabelled A, B, C…;
    ``correct_choice`` is remapped to its option's new label. The item itself is not changed."""
    rng = random.Random(int(hashlib.sha256(f"{seed}:{item.id}".encode()).hexdigest()[:16], 16))
    order = list(item["choices"])
    rng.shuffle(order)
    choices = labelled([choice["text"] for choice in order])
    new_label = {old["label"]: new["label"] for old, new in zip(order, choices, strict=True)}
    correct = {"label": new_label[item["correct_choice"]["label"]], "text": item["correct_choice"]["text"]}
    return Item({**item, "choices": choices, "correct_choice": correct})


# ----------------------------------------------------------------------------------------- scoring


def hidden_reference(item: Mapping[str, Any]) -> str:
    """The analyst-only block holding the theorem and the proof sketch, at most 4000 characters
    (empty when the item has neither); the evaluation event carries it after the last target call."""
    parts = []
    if item.get("theorem"):
        parts.append(f"Theorem: {item['theorem']}")
    if item.get("sketch"):
        parts.append(f"Proof sketch: {item['sketch']}")
    return hidden_reference_block(parts)


# ------------------------------------------------------------------------------------------ plugin


class LiveMathematicianBenchBenchmark(Benchmark[LiveMathematicianBenchConfig]):
    """The ``livemathematicianbench`` plug-in."""

    id = BENCHMARK_ID
    version = "2"  # 2: the shared answer reader (untagged answers marked, contradicting labels rejected)
    #: ``theorem`` and ``sketch`` stop being gold when ``use_theorem`` / ``use_sketch`` show them.
    GOLD_FIELDS = ("correct_choice", "theorem", "sketch")
    Config = LiveMathematicianBenchConfig
    default_task_type = DEFAULT_TASK_TYPE
    native_extensions = (".json",)
    data_hint = ("pass --data DIR (a folder holding train/, val/ and test/ items.json), or --data a monthly "
                 "qa_YYYYMM_final.json file (or a folder of them, from HF "
                 "LiveMathematicianBench/LiveMathematicianBench) for ratio mode")

    def read_rows(self, path: Path, cfg: LiveMathematicianBenchConfig) -> list[dict[str, Any]]:
        return read_raw(path)

    def normalise_row(self, row: Mapping[str, Any], cfg: LiveMathematicianBenchConfig) -> dict[str, Any]:
        return normalise_row(row)

    def load_split(self, cfg: LiveMathematicianBenchConfig, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split`` (``train``, ``val``, ``test`` or an alias); bad rows raise ``DataError``.

        With ``shuffle_choices`` each item is :func:`shuffled_view` seeded with ``split_seed``, so
        every candidate sees the same order."""
        config = self.config(cfg)
        items = super().load_split(config, split, run_dir=run_dir)
        if not config.shuffle_choices:
            return items
        return [shuffled_view(item, config.split_seed) for item in items]

    def batch_view(self, item: Item, cfg: LiveMathematicianBenchConfig, *, seed: int, training: bool) -> Item:
        """Training batches shuffle the choices again with the batch seed, so positions move between
        epochs; evaluation batches keep the load order (stable across candidates)."""
        if not training or not self.config(cfg).shuffle_choices:
            return item
        return shuffled_view(item, seed)

    def build_messages(self, item: Item, skill: str, cfg: LiveMathematicianBenchConfig) -> list[Message]:
        """System: solver, skill, answer format. User: question, labelled choices, and the theorem /
        proof sketch only when enabled. Never reads ``correct_choice``."""
        config = self.config(cfg)
        sections = [f"## Question\n{item['question']}", f"## Choices\n{options_block(item['choices'])}"]
        if config.use_theorem:
            sections.append(f"## Theorem\n{item['theorem']}")
        if config.use_sketch:
            sections.append(f"## Proof Sketch\n{item['sketch']}")
        return [
            self.system_message(_SYSTEM_INTRO, skill, _ANSWER_FORMAT),
            user("\n\n".join(sections)),
        ]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """hard = soft = the chosen label is the correct one (no judge).

        The answer is the last ``<answer>`` tag, else the last non-empty line, else the reply; it
        names a label directly, through an option's exact text, or by its first token. An untagged reply
        that restates the option list names nothing (``format: ambiguous``)."""
        options = options_of(item["choices"])
        correct = item["correct_choice"]["label"]
        expected = f"{correct}. {options[correct]}"
        reading = read_answer(response_text, last_choice_line(options))
        answer = reading.text or ""
        label = resolve_choice(answer, options)
        if label is None:
            fail = (
                "no-answer: empty reply"
                if not answer
                else f"no-answer: '{quote_answer(answer)}' names no option ({', '.join(options)})"
                + (": its label contradicts its text" if label_contradicts(answer, options) else "")
            )
        else:
            fail = "" if label == correct else f"wrong: chose {label}, correct {correct}"
        chosen = f"chose {label}. {options[label]}" if label else "chose no option"
        reference = hidden_reference(item)
        return with_reading(Score(
            hard=float(label == correct),
            soft=float(label == correct),
            predicted_answer=label or answer,
            fail_reason=fail,
            extras={"predicted_label": label or "", "correct_label": correct},
            expected=expected,
            detail=f"{chosen}; correct {expected}" + (f"\n{reference}" if reference else ""),
        ), reading)

    def extract_answer(self, response_text: str) -> str | None:
        """The last ``<answer>`` tag as a candidate label, or None: self-check turns ask for the tag
        until there is one and stop when the label repeats."""
        answer = last_tag(response_text, "answer")
        return None if answer is None else clean_label(answer)

    def task_types(self, items: Sequence[Item]) -> list[str]:
        """The sorted union of the items' ``theorem_type`` tags (``["math_mcq"]`` when there are none)."""
        return sorted({tag for item in items for tag in item.get("theorem_type") or []}) or [
            DEFAULT_TASK_TYPE
        ]


plugin = LiveMathematicianBenchBenchmark()

__all__ = [
    "BENCHMARK_ID",
    "HIDDEN_REFERENCE_CHARS",
    "LiveMathematicianBenchBenchmark",
    "LiveMathematicianBenchConfig",
    "hidden_reference",
    "normalise_row",
    "plugin",
    "read_raw",
    "shuffled_view",
]
