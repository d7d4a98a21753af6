"""MMRB (``mmrb``): reasoning across several images that the question references inline, multiple choice
or open answers, scored without a model.

Raw rows come from ``<subtask>/<subtask>_human.json`` files (ratio mode; ``data_path`` is one file or a
folder searched recursively) or a split's ``items.json``. Image paths are relative to the JSON's folder
(then ``data_root``, the ``--data`` folder); missing files are removed and a row left with no image is
dropped. Normalized: ``{id = safe_id("<source>:<subtask>:<index>"), question, answer, options,
is_choice, image_paths, task_type = subtask, reasoning_steps, source, subtask, index}``.

The user message interleaves text and images at the ``{image#k}`` placeholders; unreferenced images
follow as ``[Additional Image #k]``. Scoring: the label or the option text for choice items,
normalised equality or whole-word containment for open ones.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from skillopt.benchmarks.answers import clean_label, last_boxed, quote_answer, read_answer
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score, with_reading
from skillopt.benchmarks.grading import hidden_reference_block
from skillopt.benchmarks.images import image_part, resolve_image
from skillopt.benchmarks.rows import ROW_DIR, roots_of, rows_from
from skillopt.core.data import DropRow, Item, read_records
from skillopt.llm.chat import Message, Part, TextPart, user

BENCHMARK_ID = "mmrb"
DEFAULT_TASK_TYPE = "mmrb"
NATIVE_EXTENSIONS = (".json",)
HIDDEN_PATHS = 3
_PLACEHOLDER = re.compile(r"\{image#(\d+)\}")
_OPTION_PREFIX = re.compile(r"^\s*\(([A-Za-z])\)\s*")
_ANSWER_BRACKETS = re.compile(r"Answer\[\s*(.*?)\s*\]", re.DOTALL)
_PHRASES = re.compile(r"(?:final answer(?: is)?|the answer is|answer:)\s*(.+)", re.IGNORECASE)
_PUNCTUATION = str.maketrans("", "", string.punctuation)

_SYSTEM_INTRO = (
    "You reason across several images. The question refers to them by position (Image #1, Image #2, …); "
    "keep track of which fact comes from which image."
)
_ANSWER_FORMAT = (
    "Put only the final answer inside <answer>…</answer> at the end of your reply: the option letter for a "
    "multiple-choice question, otherwise a short answer."
)


class MMRBConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``mmrb``."""

    max_tokens: int = Field(default=1024, ge=1)


# ----------------------------------------------------------------------------------------- loading


def read_human_files(path: Path) -> list[dict[str, Any]]:
    """The raw reader: one JSON file, or every ``*_human.json`` under a folder (sorted); rows remember
    their file's folder."""
    path = Path(path)
    files = sorted(path.rglob("*_human.json")) if path.is_dir() else [path]
    if path.is_dir() and not files:
        return read_records(path)
    return [row for file in files for row in rows_from(file, read_records(file))]


def _clean(text: Any) -> str:
    return " ".join(str(text or "").split())


def normalise_row(row: Mapping[str, Any], *, roots: Sequence[Path] = ()) -> dict[str, Any]:
    """An MMRB item (idempotent); missing images are removed and a row with none left is dropped."""
    raw_paths = row.get("image_paths") or []
    if isinstance(raw_paths, str):
        raw_paths = [raw_paths]
    search = [*roots_of(row.get(ROW_DIR)), *roots]
    images = [
        str(found)
        for found in (resolve_image(p, search, field="image_paths") for p in raw_paths)
        if found is not None
    ]
    if not images:
        raise DropRow("no image")
    answer = _clean(row.get("answer"))
    if not answer:
        raise KeyError("answer")
    question = _clean(row.get("question"))
    if not question:
        raise KeyError("question")
    index, source, subtask = row.get("index"), _clean(row.get("source")), _clean(row.get("subtask"))
    if index in (None, ""):
        raise KeyError("index")
    options = [_clean(o) for o in row.get("options") or [] if _clean(o)]
    item = {
        "id": f"{source}:{subtask}:{index}",
        "question": question,
        "answer": answer,
        "options": options,
        "is_choice": bool(options),
        "image_paths": images,
        "task_type": subtask or DEFAULT_TASK_TYPE,
        "reasoning_steps": list(row.get("reasoning_steps") or []),
        "source": source,
        "subtask": subtask,
        "index": index,
    }
    return item


# ----------------------------------------------------------------------------------------- scoring


def extract(text: str) -> str:
    """``<answer>``; the last ``Answer[…]``; ``\\boxed{}``; a bare single letter; the text after
    "final answer (is)" / "the answer is" / "answer:"; else the whole reply."""
    return read_answer(text, _untagged).text or ""


def _untagged(text: str) -> str:
    """Without an ``<answer>`` tag: the rest of :func:`extract`'s chain."""
    bracketed = _ANSWER_BRACKETS.findall(text)
    if bracketed:
        return bracketed[-1].strip()
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if re.fullmatch(r"\s*\(?[A-Za-z]\)?[.\s]*", text):
        return clean_label(text)
    phrases = _PHRASES.findall(text)
    if phrases:
        return phrases[-1].strip()
    return text.strip()


def normalise_open(text: str) -> str:
    """Lowercase, punctuation dropped, spaces collapsed."""
    return " ".join(str(text).lower().translate(_PUNCTUATION).split())


def option_text(option: str) -> str:
    """An option without its ``(X)`` prefix."""
    return _OPTION_PREFIX.sub("", option).strip()


def option_label(option: str, index: int) -> str:
    found = _OPTION_PREFIX.match(option)
    return found.group(1).upper() if found else chr(ord("A") + index)


def open_match(prediction: str, gold: str) -> bool:
    """Normalised equality, or one side containing the other as whole words; empty never matches."""
    predicted, expected = normalise_open(prediction), normalise_open(gold)
    if not predicted or not expected:
        return False
    return predicted == expected or f" {expected} " in f" {predicted} " or f" {predicted} " in f" {expected} "


def hidden_reference(item: Mapping[str, Any]) -> str:
    paths = list(item.get("reasoning_steps") or [])[:HIDDEN_PATHS]
    lines: list[str] = []
    for number, path in enumerate(paths, start=1):
        steps = path if isinstance(path, list) else [path]
        for step in steps:
            if isinstance(step, Mapping):
                lines.append(f"path {number} step {step.get('reasoning step', '?')} "
                             f"[{step.get('reasoning type', '')}]: {step.get('rationale', '')}")
    return hidden_reference_block(lines, use="annotated reasoning paths, never teach their content")


# ------------------------------------------------------------------------------------------ plugin


class MMRBBenchmark(Benchmark[MMRBConfig]):
    """The ``mmrb`` plug-in."""

    id = BENCHMARK_ID
    version = "2"  # 2: the shared answer reader (untagged answers marked, contradicting labels rejected)
    GOLD_FIELDS = ("answer", "reasoning_steps")
    Config = MMRBConfig
    default_split_mode = "ratio"
    default_task_type = DEFAULT_TASK_TYPE
    native_extensions = NATIVE_EXTENSIONS
    uses_images = True
    data_hint = ("pass --data DIR (an MMRB release folder: subtask folders with *_human.json and images, or "
                 "a folder holding train/, val/ and test/) or set benchmark.data_path")

    def read_rows(self, path: Path, cfg: MMRBConfig) -> list[dict[str, Any]]:
        return read_human_files(path)

    def normalise_row(self, row: Mapping[str, Any], cfg: MMRBConfig) -> dict[str, Any]:
        return normalise_row(row, roots=self.data_roots(cfg))

    def build_messages(self, item: Item, skill: str, cfg: MMRBConfig) -> list[Message]:
        """System: the multi-image rule, the skill, the format. User: text and images interleaved at
        the placeholders, unreferenced images after, then the options and the format line."""
        detail = self.config(cfg).image_detail
        images = item["image_paths"]
        parts: list[Part] = []
        used: set[int] = set()
        position = 0
        text = "## Question\n"
        for found in _PLACEHOLDER.finditer(item["question"]):
            text += item["question"][position:found.start()]
            position = found.end()
            number = int(found.group(1))
            if 1 <= number <= len(images):
                parts += [TextPart(text=f"{text}[Image #{number}]"), image_part(images[number - 1], detail)]
                used.add(number)
                text = ""
            else:
                text += f"[Image #{number} unavailable]"
        text += item["question"][position:]
        if text.strip():
            parts.append(TextPart(text=text))
        for number, path in enumerate(images, start=1):
            if number not in used:
                parts += [TextPart(text=f"[Additional Image #{number}]"), image_part(path, detail)]
        tail = []
        if item["options"]:
            tail.append("## Options\n" + "\n".join(item["options"]))
        tail.append("Answer with the option letter inside <answer>…</answer>." if item["is_choice"]
                    else "Answer with a short answer inside <answer>…</answer>.")
        parts.append(TextPart(text="\n\n".join(tail)))
        return [self.system_message(_SYSTEM_INTRO, skill, _ANSWER_FORMAT), user(parts)]

    def extract_answer(self, response_text: str) -> str | None:
        return normalise_open(extract(response_text)) or None

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """Choice: the label, or the gold option's text; open: equality or whole-word containment."""
        reading = read_answer(response_text, _untagged)
        answer = reading.text or ""
        gold = item["answer"]
        reference = hidden_reference(item)
        expected = gold
        correct = False
        how = ""
        if item["is_choice"]:
            label = gold.upper().strip("() .")
            by_label = {option_label(o, i): option_text(o) for i, o in enumerate(item["options"])}
            gold_text = by_label.get(label, "")
            expected = f"{label} ({gold_text})" if gold_text else label
            if answer and clean_label(answer).strip("()") == label:
                correct, how = True, "label match"
            elif answer and gold_text and normalise_open(answer) == normalise_open(gold_text):
                correct, how = True, "option-text match"
        elif open_match(answer, gold):
            correct, how = True, "normalised equality or containment"
        detail = "\n".join(p for p in (how or "no match", reference) if p)
        if not answer:
            fail = "no-answer: empty reply"
        else:
            fail = "" if correct else f"wrong: predicted '{quote_answer(answer)}', gold {expected}"
        return with_reading(
            Score(
                hard=float(correct),
                soft=float(correct),
                predicted_answer=answer,
                fail_reason=fail,
                expected=expected,
                detail=detail,
                extras={"is_choice": item["is_choice"], "n_images": len(item["image_paths"])},
            ),
            reading,
        )


plugin = MMRBBenchmark()

__all__ = [
    "BENCHMARK_ID",
    "MMRBBenchmark",
    "MMRBConfig",
    "extract",
    "normalise_open",
    "normalise_row",
    "open_match",
    "plugin",
    "read_human_files",
]
