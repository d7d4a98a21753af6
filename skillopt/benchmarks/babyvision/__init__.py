"""BabyVision (``babyvision``): child-level visual reasoning over one image, answered in ``\\boxed{}``
and graded exactly or by the judge role.

Raw rows come from ``meta_data.jsonl`` (ratio mode; images in ``images/`` beside it) or a split's
``items.json``. Options may be a list of strings, a list of ``{label|text|content|option}`` or a dict;
``choiceAns`` a ``{label, text}`` dict, an int (0-based when in range, else 1-based) or a label / option
text; ``blankAns`` a string or a list. Rows are dropped (counted) for a missing image, a choice row
whose answer resolves to no label, or a blank row with no answer. Normalized:
``{id, task_type = subtype, type, question, image_path, ans_type, choices, correct_choice,
blank_answers, cot, source_path}``.

Scoring: the last ``\\boxed{}``; none is a no-answer and calls no judge. A label equal to the correct
one (choice) or a phrase equal to a gold (blank, lowercased, spaces collapsed) scores 1 with no
judge; anything else asks the judge role for a strict verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from skillopt.benchmarks.answers import last_boxed, quote_answer, token_f1
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score
from skillopt.benchmarks.choices import options_block, parse_options
from skillopt.benchmarks.grading import verdict_request
from skillopt.benchmarks.images import resolve_image, text_then_image
from skillopt.benchmarks.rows import ROW_DIR, roots_of, rows_from
from skillopt.core.data import DropRow, Item, read_records
from skillopt.core.errors import BenchmarkSetupError
from skillopt.llm.chat import ChatRequest, Message

BENCHMARK_ID = "babyvision"
DEFAULT_TASK_TYPE = "babyvision"
NATIVE_EXTENSIONS = (".jsonl", ".json")
NO_BOX = "no-answer: no \\boxed{} found"
AnsType = Literal["choice", "blank"]
_CHOICE_TYPES = {"choice", "multiple_choice", "mcq", "option"}
_BLANK_TYPES = {"", "blank", "open", "open_ended", "fill_blank", "short_answer"}

_SYSTEM_INTRO = (
    "You solve child-level visual reasoning puzzles. Inspect the image carefully and ground every claim "
    "in what it shows."
)
_ANSWER_FORMAT = (
    "Think step by step, then give the final answer in \\boxed{…}: the option label for a choice question, "
    "a short phrase for an open question."
)
_JUDGE_RUBRIC = (
    "You are a strict grader of answers to visual reasoning questions. Decide whether the extracted answer "
    "agrees in meaning with the ground truth, ignoring wording and format. Reject an answer that is wrong, "
    "incomplete, or adds incorrect content; for a choice question the answer must name the correct option "
    "(its label or its text). The verdict is \"correct\" only when it agrees."
)


class BabyVisionConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``babyvision``: the common keys plus the image root and output cap."""

    max_tokens: int = Field(default=768, ge=1)
    self_check_max_tokens: int = Field(default=512, ge=1)


# ----------------------------------------------------------------------------------------- loading


#: The key ``read_meta`` adds to each raw row: its 1-based position in the file, the id of a row that has
#: neither ``taskId`` nor ``id``. Normalisers never copy it into the item.
ROW_NUMBER = "_row_number"


def read_meta(path: Path) -> list[dict[str, Any]]:
    """The raw reader: ``meta_data.jsonl`` (or a folder holding it); rows remember their file's folder."""
    path = Path(path)
    if path.is_dir() and (path / "meta_data.jsonl").is_file():
        path = path / "meta_data.jsonl"
    rows = rows_from(path, read_records(path))
    return [{**row, ROW_NUMBER: number} for number, row in enumerate(rows, start=1)]


def resolve_correct(answer: Any, options: Sequence[Mapping[str, str]]) -> dict[str, str] | None:
    """The correct option: a ``{label, text}`` dict; an int (0-based index when in range, else 1-based);
    a string matched as a label, then as option text. None when it names no option."""
    by_label = {o["label"]: o for o in options}
    if isinstance(answer, Mapping):
        label = str(answer.get("label") or "").strip().upper()
        if label in by_label:
            return dict(by_label[label])
        answer = answer.get("text")
    if isinstance(answer, bool) or answer is None:
        return None
    if isinstance(answer, int):
        index = answer if 0 <= answer < len(options) else answer - 1
        return dict(options[index]) if 0 <= index < len(options) else None
    text = str(answer).strip()
    label = text.upper().strip("()[] .")
    if label in by_label:
        return dict(by_label[label])
    wanted = " ".join(text.split()).casefold()
    return next((dict(o) for o in options if " ".join(o["text"].split()).casefold() == wanted), None)


def _ans_type(row: Mapping[str, Any], options: list[dict[str, str]]) -> AnsType:
    declared = str(row.get("ans_type") or row.get("ansType") or "").strip().lower()
    if declared in _CHOICE_TYPES:
        return "choice"
    if declared and declared in _BLANK_TYPES:
        return "blank"
    if declared:
        raise ValueError(f"field 'ansType' is {declared!r}; expected choice or blank")
    has_choice = options or row.get("choiceAns") not in (None, "") or row.get("correct_choice")
    return "choice" if has_choice else "blank"


def normalise_row(row: Mapping[str, Any], *, roots: Sequence[Path] = ()) -> dict[str, Any]:
    """A BabyVision item (idempotent); drops rows without an image or a resolvable answer."""
    row_dir = row.get(ROW_DIR)
    image_value = next((row[k] for k in ("image_path", "image", "image_file", "img") if row.get(k)), None)
    image_roots = [r / "images" for r in [*roots, *roots_of(row_dir)]] + [*roots_of(row_dir), *roots]
    image = resolve_image(image_value, image_roots)
    if image is None:
        raise DropRow("missing image")
    options = parse_options(
        row.get("choices")
        if row.get("choices") is not None
        else next((row[k] for k in ("options", "choiceOptions") if row.get(k) is not None), None),
        "options",
    )
    ans_type = _ans_type(row, options)
    correct = None
    blank: list[str] = []
    if ans_type == "choice":
        correct = resolve_correct(
            row["correct_choice"] if row.get("correct_choice") else row.get("choiceAns"), options
        )
        if correct is None:
            raise DropRow("choice row without a resolvable answer")
    else:
        raw = row.get("blank_answers") if row.get("blank_answers") is not None else row.get("blankAns")
        values = raw if isinstance(raw, list | tuple) else [raw]
        blank = [str(v).strip() for v in values if v is not None and str(v).strip()]
        if not blank:
            raise DropRow("blank row without an answer")
    raw_id = next((row[k] for k in ("taskId", "id") if row.get(k) not in (None, "")), row.get(ROW_NUMBER))
    if raw_id is None:
        raise KeyError("taskId")
    subtype = str(row.get("task_type") or row.get("subtype") or row.get("subType") or "").strip()
    question = str(row.get("question") or row.get("query") or "").strip()
    if not question:
        raise KeyError("question")
    item = {
        "id": raw_id,
        "task_type": subtype or DEFAULT_TASK_TYPE,
        "type": str(row.get("type") or row.get("taskType") or "").strip(),
        "question": question,
        "image_path": str(image),
        "ans_type": ans_type,
        "choices": options,
        "correct_choice": correct,
        "blank_answers": blank,
        "cot": str(row.get("cot") or row.get("coT") or "").strip(),
        "source_path": str(row.get("source_path") or image_value),
    }
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    return item


# ----------------------------------------------------------------------------------------- scoring


def _blank_normalise(text: str) -> str:
    return " ".join(str(text).lower().split())


def exact_answer(item: Mapping[str, Any], answer: str) -> bool:
    """The exact short-circuit: the label (uppercased, brackets stripped) or the phrase equals the gold."""
    if item["ans_type"] == "choice":
        return answer.upper().strip().strip("()[]").strip() == item["correct_choice"]["label"]
    return _blank_normalise(answer) in {_blank_normalise(g) for g in item["blank_answers"]}


def ground_truth(item: Mapping[str, Any]) -> str:
    """The ground truth as the judge and the evaluation event show it."""
    if item["ans_type"] == "choice":
        correct = item["correct_choice"]
        return f"{correct['label']}. {correct['text']}" if correct["text"] else correct["label"]
    return " | ".join(item["blank_answers"])


def _gold_list(item: Mapping[str, Any]) -> list[str]:
    if item["ans_type"] == "choice":
        correct = item["correct_choice"]
        return [g for g in (correct["label"], correct["text"]) if g]
    return list(item["blank_answers"])


# ------------------------------------------------------------------------------------------ plugin


class BabyVisionBenchmark(Benchmark[BabyVisionConfig]):
    """The ``babyvision`` plug-in."""

    id = BENCHMARK_ID
    GOLD_FIELDS = ("correct_choice", "blank_answers", "cot")
    Config = BabyVisionConfig
    default_split_mode = "ratio"
    default_task_type = DEFAULT_TASK_TYPE
    native_extensions = NATIVE_EXTENSIONS
    uses_images = True
    data_hint = ("download it with scripts/download_babyvision.py --out_dir DIR and pass --data DIR "
                 "(meta_data.jsonl with images/ beside it, or a folder holding train/, val/ and test/)")

    def read_rows(self, path: Path, cfg: BabyVisionConfig) -> list[dict[str, Any]]:
        return read_meta(path)

    def normalise_row(self, row: Mapping[str, Any], cfg: BabyVisionConfig) -> dict[str, Any]:
        return normalise_row(row, roots=self.data_roots(cfg))

    def build_messages(self, item: Item, skill: str, cfg: BabyVisionConfig) -> list[Message]:
        """System: the task, the skill, the box format. User: question, choices, reminder, then the image."""
        sections = [f"## Question\n{item['question']}"]
        if item["ans_type"] == "choice" and item["choices"]:
            sections.append(f"## Choices\n{options_block(item['choices'])}")
        reminder = ("Answer with the option label in \\boxed{…}." if item["ans_type"] == "choice"
                    else "Answer with a short phrase in \\boxed{…}.")
        sections.append(reminder)
        return [
            self.system_message(_SYSTEM_INTRO, skill, _ANSWER_FORMAT),
            text_then_image("\n\n".join(sections), item["image_path"], self.config(cfg).image_detail),
        ]

    def extract_answer(self, response_text: str) -> str | None:
        boxed = last_boxed(response_text)
        return _blank_normalise(boxed) if boxed else None

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """Exact label or phrase → 1 with no judge; otherwise the judge's verdict; no box → no-answer."""
        answer = last_boxed(response_text)
        golds = _gold_list(item)
        extras: dict[str, Any] = {"ans_type": item["ans_type"]}
        if item["ans_type"] == "choice":
            extras["correct_label"] = item["correct_choice"]["label"]
        else:
            extras["gold_answers"] = golds
        expected = ground_truth(item)
        if not answer:
            extras.update(evaluation_mode="exact", judge_reason="")
            return Score(hard=0.0, soft=0.0, fail_reason=NO_BOX, extras=extras, expected=expected,
                         detail="no \\boxed{} answer; no judge call")
        if item["ans_type"] == "blank":
            extras["string_f1"] = round(max(token_f1(answer, g) for g in golds), 4)
        if exact_answer(item, answer):
            extras.update(evaluation_mode="exact", judge_reason="")
            return Score(hard=1.0, soft=1.0, predicted_answer=answer, extras=extras, expected=expected,
                         detail="exact match; no judge call")
        if judge is None:
            raise BenchmarkSetupError("babyvision: an inexact answer needs the judge role, but the runner "
                                      "gave no judge")
        correct, reason = judge(item, answer)
        extras.update(evaluation_mode="judge", judge_reason=reason)
        fail = (
            "" if correct else f"wrong: judged incorrect: boxed '{quote_answer(answer)}', expected {expected}"
        )
        return Score(hard=float(correct), soft=float(correct), predicted_answer=answer, fail_reason=fail,
                     extras=extras, expected=expected, detail=f"Judge: {reason}")

    def judge_request(self, item: Item, prediction: str) -> ChatRequest:
        """The strict judge: question (and choices), the ground truth and the extracted answer."""
        body = f"## Question\n{item['question']}"
        if item["ans_type"] == "choice":
            body += f"\n\n## Choices\n{options_block(item['choices'])}"
        body += f"\n\n## Ground truth\n{ground_truth(item)}\n\n## Extracted answer\n{prediction}"
        return verdict_request(
            _JUDGE_RUBRIC, body, item_id=item.id, prediction=prediction, golds=_gold_list(item)
        )

    def needs_judge(self, cfg: BabyVisionConfig) -> bool:
        """Inexact answers are graded by the judge role, so a run needs it."""
        return True


plugin = BabyVisionBenchmark()

__all__ = [
    "BENCHMARK_ID",
    "BabyVisionBenchmark",
    "BabyVisionConfig",
    "exact_answer",
    "ground_truth",
    "normalise_row",
    "plugin",
    "read_meta",
    "resolve_correct",
]
