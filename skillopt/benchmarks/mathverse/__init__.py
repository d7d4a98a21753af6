"""MathVerse (``mathverse``): visual math over diagrams in the "Text Lite" version, multiple choice or
free-form.

Raw rows come from ``testmini.json`` (ratio mode; the default ``data_path`` is
``<data_root>/testmini.json``) or a split's ``items.json``. Rows are filtered to
``benchmark.problem_version`` before splitting (a drop counted in the manifest), as are rows without
an answer or a resolvable image (``data_root/<img>``, ``data_root/images/<img>``, then the row file's
folder). With ``use_text_dominant_reference`` an item carries the Text Dominant question of the same
problem as an analyst-only reference.

Scoring: ``<answer>``, else ``\\boxed{}``, else the last line. Multiple choice compares the option
label (``B: 50°`` reads as B); free-form compares normalised strings first and asks the judge role
for mathematical equivalence only when they differ.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from skillopt.benchmarks.answers import last_boxed, last_line, quote_answer, read_answer, token_f1
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score, with_reading
from skillopt.benchmarks.grading import hidden_reference_block, verdict_request
from skillopt.benchmarks.images import resolve_image, text_then_image
from skillopt.benchmarks.rows import ROW_DIR, roots_of, rows_from
from skillopt.core.data import ITEMS_FILE, DropRow, Item, read_records
from skillopt.core.errors import BenchmarkSetupError
from skillopt.llm.chat import ChatRequest, Message

BENCHMARK_ID = "mathverse"
DEFAULT_TASK_TYPE = "mathverse"
NATIVE_EXTENSIONS = (".json",)
TEXT_DOMINANT = "Text Dominant"
_CHOICES_LINE = re.compile(r"^\s*Choices\s*:\s*$", re.IGNORECASE | re.MULTILINE)
_CHOICE = re.compile(r"^\s*\(?([A-Z])\s*[:.)]\s*(.*\S)?\s*$")
_LEADING_LABEL = re.compile(r"^[(\[]?\s*([A-Z])(?![A-Z0-9])")
_FREE_FORM_DROP = re.compile(r"\\mathrm|\\,|\\!|\\;|[${}~]")

_SYSTEM_INTRO = (
    "You solve math problems about a diagram. The diagram is evidence: recover from it any value or "
    "relation the text leaves out before solving."
)
_ANSWER_FORMAT = (
    "Put only the final answer inside <answer>…</answer> at the end of your reply: the option label for a "
    "multiple-choice problem, the bare mathematical answer for a free-form one."
)
_JUDGE_RUBRIC = (
    "You check whether an answer to a math problem is mathematically equivalent to the reference answer. "
    "Ignore formatting (LaTeX, spacing, equivalent forms of the same value). Reject a different value or "
    "meaning, a missing unit that changes the meaning, or a different choice. The verdict is \"correct\" "
    "only for an equivalent answer."
)


class MathVerseConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``mathverse``."""

    #: The dataset folder: ``testmini.json`` and the images; ``--data DIR`` sets it to DIR.
    data_root: str | None = "data/MathVerse"
    #: Only rows of this version are used (filtered before splitting).
    problem_version: str = "Text Lite"
    #: Give the analyst the Text Dominant question of the same problem as a hidden reference.
    use_text_dominant_reference: bool = False
    max_tokens: int = Field(default=1024, ge=1)
    self_check_max_tokens: int = Field(default=768, ge=1)


# ----------------------------------------------------------------------------------------- loading


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The raw reader (a JSON array); rows remember their file's folder."""
    return rows_from(path, read_records(path))


def split_choices(question: str) -> tuple[str, list[dict[str, str]]]:
    """The stem (text before ``Choices:``) and the ``A:…`` / ``A.…`` / ``A)…`` options after it."""
    found = _CHOICES_LINE.search(question)
    if not found:
        return question.strip(), []
    choices = []
    for line in question[found.end():].splitlines():
        match = _CHOICE.match(line)
        if match:
            choices.append({"label": match.group(1), "text": (match.group(2) or "").strip()})
    return question[: found.start()].strip(), choices


def normalise_row(
    row: Mapping[str, Any], *, roots: Sequence[Path] = (), version: str = "Text Lite"
) -> dict[str, Any]:
    """A MathVerse item (idempotent); rows of another version, without an answer or an image are dropped."""
    if str(row.get("problem_version") or "").strip() != version:
        raise DropRow("problem_version")
    answer = str(row.get("answer") or "").strip()
    if not answer:
        raise DropRow("no answer")
    row_dir = roots_of(row.get(ROW_DIR))
    image_value = row.get("image_path") or row.get("image")
    image = resolve_image(image_value, [*roots, *(r / "images" for r in roots), *row_dir,
                                        *(r / "images" for r in row_dir)])
    if image is None:
        raise DropRow("missing image")
    question = str(row.get("question") or "")
    stem, choices = split_choices(question)
    choices = list(row.get("choices") or choices)
    is_choice = str(row.get("question_type") or "").strip() == "multi-choice" or bool(choices)
    correct = None
    if is_choice:
        label = answer.upper().strip("()[] .")
        correct = next((dict(c) for c in choices if c["label"] == label), {"label": label, "text": ""})
    raw_id = next(
        (row[k] for k in ("id", "problem_index", "sample_index") if row.get(k) not in (None, "")), None
    )
    if raw_id is None:
        raise KeyError("problem_index")
    metadata = dict(row.get("metadata") or {})
    task_type = (row.get("task_type") or metadata.get("subfield") or metadata.get("subject")
                 or row.get("question_type") or DEFAULT_TASK_TYPE)
    item = {
        "id": raw_id,
        "question": question.strip(),
        "question_stem": stem,
        "choices": choices,
        "is_choice": is_choice,
        "correct_choice": correct,
        "answer": answer,
        "gold_answers": list(row.get("gold_answers") or [answer]),
        "image_path": str(image),
        "metadata": metadata,
        "problem_version": version,
        "problem_index": str(row.get("problem_index") or raw_id),
        "question_type": str(row.get("question_type") or ("multi-choice" if is_choice else "free-form")),
        "task_type": str(task_type),
    }
    if row.get("text_dominant_question"):
        item["text_dominant_question"] = row["text_dominant_question"]
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    return item


def text_dominant_questions(files: Sequence[Path]) -> dict[str, str]:
    """``problem_index`` → the Text Dominant question, from the given raw files."""
    found: dict[str, str] = {}
    for path in files:
        if not Path(path).is_file():
            continue
        for row in read_records(path):
            if str(row.get("problem_version") or "").strip() == TEXT_DOMINANT and row.get("question"):
                found.setdefault(
                    str(row.get("problem_index") or row.get("sample_index")), str(row["question"])
                )
    return found


# ----------------------------------------------------------------------------------------- scoring


def extract(text: str) -> str:
    """``<answer>``, else ``\\boxed{}``, else the last non-empty line."""
    return read_answer(text, _untagged).text or ""


def _untagged(text: str) -> str | None:
    """Without an ``<answer>`` tag: ``\\boxed{}``, else the last non-empty line."""
    boxed = last_boxed(text)
    return boxed if boxed is not None else last_line(text)


def choice_of(answer: str) -> str | None:
    """The option label an answer names: uppercased, brackets stripped, the leading letter of ``B: 50°``."""
    match = _LEADING_LABEL.match(answer.upper().strip())
    return match.group(1) if match else None


def normalise_free_form(text: str) -> str:
    """Drop ``$``, ``\\mathrm``, braces, ``~``, ``\\,``, ``\\!``, ``\\;``; lowercase; collapse spaces."""
    return " ".join(_FREE_FORM_DROP.sub("", str(text)).lower().split())


def hidden_reference(item: Mapping[str, Any]) -> str:
    question = str(item.get("text_dominant_question") or "").strip()
    return hidden_reference_block([f"Text Dominant question: {question}"] if question else [],
                                  use="use it to infer what the Text Lite wording withheld, never teach its "
                                      "content")


# ------------------------------------------------------------------------------------------ plugin


class MathVerseBenchmark(Benchmark[MathVerseConfig]):
    """The ``mathverse`` plug-in."""

    id = BENCHMARK_ID
    version = "2"  # 2: the shared answer reader (untagged answers marked, contradicting labels rejected)
    GOLD_FIELDS = ("answer", "gold_answers", "correct_choice", "text_dominant_question")
    Config = MathVerseConfig
    default_split_mode = "ratio"
    default_task_type = DEFAULT_TASK_TYPE
    native_extensions = NATIVE_EXTENSIONS
    uses_images = True
    data_hint = "pass --data DIR (a folder holding train/, val/ and test/) or set benchmark.data_root"

    def read_rows(self, path: Path, cfg: MathVerseConfig) -> list[dict[str, Any]]:
        return read_rows(path)

    def normalise_row(self, row: Mapping[str, Any], cfg: MathVerseConfig) -> dict[str, Any]:
        return normalise_row(row, roots=self.data_roots(cfg), version=cfg.problem_version)

    def load_split(self, cfg: MathVerseConfig, split: str, *, run_dir: Path) -> list[Item]:
        config = self.config(cfg)
        if (config.split_mode or self.default_split_mode) == "ratio" and not config.data_path:
            config = config.model_copy(
                update={"data_path": str(Path(config.data_root or ".") / "testmini.json")}
            )
        items = super().load_split(config, split, run_dir=run_dir)
        if not config.use_text_dominant_reference:
            return items
        references = text_dominant_questions(self._source_files(config))
        return [Item({**item, "text_dominant_question": references[item["problem_index"]]})
                if item["problem_index"] in references else item for item in items]

    @staticmethod
    def _source_files(config: MathVerseConfig) -> list[Path]:
        if (config.split_mode or "ratio") == "split_dir" and config.split_dir:
            root = Path(config.split_dir)
            files = []
            for split in ("train", "val", "test"):
                folder = root / split
                native = sorted(folder.glob("*.json")) if folder.is_dir() else []
                files += [folder / ITEMS_FILE] if (folder / ITEMS_FILE).is_file() else native[:1]
            return files
        return [Path(config.data_path)] if config.data_path else []

    def build_messages(self, item: Item, skill: str, cfg: MathVerseConfig) -> list[Message]:
        """System: the diagram rule, the skill, the format. User: stem, choices, reminder, then the
        diagram."""
        stem = item["question_stem"] or "(The problem is stated in the image.)"
        sections = [f"## Question\n{stem}"]
        if item["choices"]:
            sections.append("## Choices\n" + "\n".join(f"{c['label']}: {c['text']}" for c in item["choices"]))
        sections.append("Answer with the option label inside <answer>…</answer>." if item["is_choice"]
                        else "Answer with the bare final answer inside <answer>…</answer>.")
        return [
            self.system_message(_SYSTEM_INTRO, skill, _ANSWER_FORMAT),
            text_then_image("\n\n".join(sections), item["image_path"], self.config(cfg).image_detail),
        ]

    def extract_answer(self, response_text: str) -> str | None:
        answer = extract(response_text)
        return normalise_free_form(answer) or None

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """MC: the label; free-form: normalised equality, else the judge's equivalence verdict."""
        reading = read_answer(response_text, _untagged)
        answer = reading.text or ""
        golds = [str(g) for g in item["gold_answers"]]
        reference = hidden_reference(item)
        extras: dict[str, Any] = {
            "string_f1": round(max(token_f1(answer, g) for g in golds), 4) if answer else 0.0
        }
        if item["is_choice"]:
            extras["correct_label"] = item["correct_choice"]["label"]
        else:
            extras["gold_answers"] = golds
        expected = (f"{item['correct_choice']['label']}" if item["is_choice"] else " | ".join(golds))

        def result(correct: bool, mode: str, fail: str, detail: str) -> Score:
            extras["evaluation_mode"] = mode
            text = "\n".join(part for part in (detail, reference) if part)
            return with_reading(Score(hard=float(correct), soft=float(correct), predicted_answer=answer,
                                      fail_reason="" if correct else fail, extras=extras, expected=expected,
                                      detail=text), reading)

        if not answer:
            return result(False, "exact", "no-answer: empty reply", "no answer")
        if item["is_choice"]:
            label = choice_of(answer)
            correct = label == item["correct_choice"]["label"]
            return result(correct, "exact", f"wrong: chose {label or quote_answer(answer)}, correct "
                          f"{item['correct_choice']['label']}", f"label {label or '(none)'}")
        if normalise_free_form(answer) in {normalise_free_form(g) for g in golds}:
            return result(True, "exact", "", "normalised exact match; no judge call")
        if judge is None:
            raise BenchmarkSetupError("mathverse: an inexact free-form answer needs the judge role, but the "
                                      "runner gave no judge")
        correct, reason = judge(item, answer)
        extras["judge_reason"] = reason
        return result(
            correct, "judge", f"wrong: judged not equivalent: '{quote_answer(answer)}'", f"Judge: {reason}"
        )

    def judge_request(self, item: Item, prediction: str) -> ChatRequest:
        """The equivalence judge: the question, the reference answer and the extracted answer."""
        body = (f"## Problem\n{item['question']}\n\n## Reference answer\n{item['answer']}\n\n"
                f"## Answer to check\n{prediction}")
        return verdict_request(_JUDGE_RUBRIC, body, item_id=item.id, prediction=prediction,
                               golds=item["gold_answers"])

    def preflight(self, cfg: MathVerseConfig) -> None:
        config = self.config(cfg)
        super().preflight(config)
        mode = config.split_mode or self.default_split_mode
        source = config.data_path or str(Path(config.data_root or ".") / "testmini.json")
        if mode == "ratio" and not Path(source).exists():
            raise BenchmarkSetupError(
                f"mathverse: no data at {source}; download AI4Math/MathVerse testmini (testmini.json and its "
                "images) into benchmark.data_root or pass --data"
            )

    def needs_judge(self, cfg: MathVerseConfig) -> bool:
        """Free-form answers that do not match exactly are graded by the judge role, so a run needs it."""
        return True


plugin = MathVerseBenchmark()

__all__ = [
    "BENCHMARK_ID",
    "MathVerseBenchmark",
    "MathVerseConfig",
    "choice_of",
    "extract",
    "normalise_free_form",
    "normalise_row",
    "plugin",
    "split_choices",
]
