"""DocVQA (``docvqa``): short extractive answers read off a single document page image, scored by ANLS.

Items come from one CSV per split (``questionId|id, question, answer|ground_truth, image_path,
topic|category, docId, ucsf_document_id, ucsf_document_page_no, source_split``) or ``items.json``,
normalized to ``{id, question, answers, answer, image_path (absolute), task_type = topic, …}``. The
answer cell may be a Python-literal or JSON list. A trailing ``document_path: <path>`` in the question
is stripped and used when ``image_path`` is empty. Relative image paths resolve against ``data_root``
(the ``--data`` folder), else the working directory, then the CSV's folder; loading stops with a
count when any image is missing. The target sees the question and the page image and answers in
``<answer>…</answer>``; hard = ANLS ≥ 0.999, soft = ANLS.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from skillopt.benchmarks.answers import last_line, quote_answer, read_answer
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score, with_reading
from skillopt.benchmarks.images import resolve_image, text_then_image
from skillopt.benchmarks.rows import ROW_DIR, first_text, parse_list, read_table, roots_of, rows_from
from skillopt.core.data import Item
from skillopt.core.errors import BenchmarkSetupError
from skillopt.llm.chat import Message

BENCHMARK_ID = "docvqa"
DEFAULT_TASK_TYPE = "docvqa"
NATIVE_EXTENSIONS = (".csv",)
#: ANLS at or above this is an exact answer (up to case and spacing).
HARD_THRESHOLD = 0.999
#: A gold whose normalised Levenshtein distance reaches this scores 0 (the ANLS cut-off).
ANLS_CUTOFF = 0.5
_DOCUMENT_PATH = re.compile(r"\s*document_path:\s*(\S+)\s*$")

_SYSTEM_INTRO = (
    "You are a document-reading expert. You see one page of a scanned document and answer a question "
    "about it. Ground the answer in what is visible on the page: prefer exact spans, numbers, dates and "
    "names as printed; never invent content; when several candidates fit, pick the best-supported one."
)
_ANSWER_FORMAT = (
    "Give only the answer, copied as printed on the page, inside <answer>…</answer> at the end of your reply."
)
_REMINDER = "Answer with the shortest exact span from the page inside <answer>…</answer>."


class DocVQAConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``docvqa``: the common keys plus the image root and the output cap."""

    max_tokens: int = Field(default=768, ge=1)
    self_check_max_tokens: int = Field(default=512, ge=1)


# ----------------------------------------------------------------------------------------- loading


def read_csv_rows(path: Path) -> list[dict[str, Any]]:
    """The raw reader: the CSV (or the one CSV in a folder); each row remembers its file's folder."""
    return rows_from(path, read_table(path))


def normalise_row(row: Mapping[str, Any], *, roots: Sequence[Path] = ()) -> dict[str, Any]:
    """A DocVQA item (idempotent). ``question`` and ``answer|ground_truth`` (or ``answers``) are required.

    The image path is made absolute against ``roots`` and then the row's own folder; when it is
    found nowhere it stays as given (the loader reports missing images with a count). A path that
    resolves outside those folders raises ``ValueError``.
    """
    question = first_text(row, "question")
    image = first_text(row, "image_path")
    found = _DOCUMENT_PATH.search(question)
    if found:
        question = question[: found.start()].rstrip()
        image = image or found.group(1)
    if not question:
        raise KeyError("question")
    golds = parse_list(
        row["answers"] if row.get("answers") else row.get("answer", row.get("ground_truth")), "answer"
    )
    if not golds:
        raise KeyError("answer")
    raw_id = first_text(row, "questionId", "id")
    if not raw_id:
        raise KeyError("questionId")
    if not image:
        raise KeyError("image_path")
    row_dir = row.get(ROW_DIR)
    resolved = resolve_image(image, [*roots, *roots_of(row_dir)])
    topic = first_text(row, "topic", "category")
    item = {
        "id": first_text(row, "id") or raw_id,
        "question": question,
        "answers": golds,
        "answer": golds[0],
        "image_path": str(resolved) if resolved else image,
        "task_type": first_text(row, "task_type") or topic or DEFAULT_TASK_TYPE,
        "questionId": first_text(row, "questionId") or raw_id,
        "docId": first_text(row, "docId"),
        "ucsf_document_id": first_text(row, "ucsf_document_id"),
        "ucsf_document_page_no": first_text(row, "ucsf_document_page_no"),
        "source_split": first_text(row, "source_split"),
    }
    if "source_id" in row:
        item["source_id"] = row["source_id"]
    return item


# ----------------------------------------------------------------------------------------- scoring


def levenshtein(a: str, b: str) -> int:
    """The edit distance (insertions, deletions, substitutions) between two strings."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def _anls_normalise(text: str) -> str:
    return " ".join(str(text).lower().split())


def anls(prediction: str, golds: Sequence[str]) -> float:
    """Average Normalised Levenshtein Similarity of one answer: the best ``1 - NL`` over the golds,
    where ``NL = levenshtein / max(len)`` on lowercased, whitespace-collapsed text, and 0 when
    ``NL >= 0.5``. Two empty strings score 1."""
    predicted = _anls_normalise(prediction)
    best = 0.0
    for gold in golds:
        expected = _anls_normalise(gold)
        longest = max(len(predicted), len(expected))
        distance = levenshtein(predicted, expected) / longest if longest else 0.0
        best = max(best, 1.0 - distance if distance < ANLS_CUTOFF else 0.0)
    return best


# ------------------------------------------------------------------------------------------ plugin


class DocVQABenchmark(Benchmark[DocVQAConfig]):
    """The ``docvqa`` plug-in."""

    id = BENCHMARK_ID
    version = "2"  # 2: the shared answer reader (untagged answers marked, contradicting labels rejected)
    GOLD_FIELDS = ("answers", "answer")
    Config = DocVQAConfig
    default_task_type = DEFAULT_TASK_TYPE
    native_extensions = NATIVE_EXTENSIONS
    #: Prompts carry the page image, so the target must take images (checked before the run).
    uses_images = True
    data_hint = ("pass --data DIR (a folder holding train/, val/ and test/, each with one DocVQA CSV, "
                 "and the page images) or set benchmark.split_dir")

    def read_rows(self, path: Path, cfg: DocVQAConfig) -> list[dict[str, Any]]:
        return read_csv_rows(path)

    def normalise_row(self, row: Mapping[str, Any], cfg: DocVQAConfig) -> dict[str, Any]:
        return normalise_row(row, roots=roots_of(cfg.data_root or Path.cwd()))

    def load_split(self, cfg: DocVQAConfig, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split``; an item whose image is missing stops the load with a count."""
        config = self.config(cfg)
        items = super().load_split(config, split, run_dir=run_dir)
        missing = [item for item in items if not Path(item["image_path"]).is_file()]
        if missing:
            raise BenchmarkSetupError(
                f"docvqa: {len(missing)} of {len(items)} {split} items have no image file (first: item "
                f"{missing[0].id}, {missing[0]['image_path']}); relative paths resolve against "
                f"benchmark.data_root ({config.data_root or 'the working directory'}), then the CSV's folder"
            )
        return items

    def build_messages(self, item: Item, skill: str, cfg: DocVQAConfig) -> list[Message]:
        """System: the reading rules, the skill, the answer format. User: the question, then the page
        image."""
        config = self.config(cfg)
        return [
            self.system_message(_SYSTEM_INTRO, skill, _ANSWER_FORMAT),
            text_then_image(f"## Question\n{item['question']}\n\n{_REMINDER}", item["image_path"],
                            config.image_detail),
        ]

    def extract_answer(self, response_text: str) -> str | None:
        """The answer as ANLS compares it, so self-check turns stop on an unchanged answer."""
        return _anls_normalise(read_answer(response_text, last_line).text or "") or None

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """ANLS of the last ``<answer>`` (else the last line) against the golds; hard when ≥ 0.999."""
        golds = [str(g) for g in item["answers"]]
        reading = read_answer(response_text, last_line)
        answer = reading.text or ""
        extras: dict[str, Any] = {"gold_answers": golds, "image_path": Path(item["image_path"]).name}
        if not answer:
            extras["anls"] = 0.0
            return Score(hard=0.0, soft=0.0, fail_reason="no-answer: empty reply", extras=extras,
                         expected=" | ".join(golds), detail="ANLS 0.000")
        value = anls(answer, golds)
        extras["anls"] = round(value, 4)
        hard = float(value >= HARD_THRESHOLD)
        fail = "" if hard else f"wrong: ANLS={value:.2f}, predicted '{quote_answer(answer)}', gold {golds}"
        detail = f"ANLS {value:.3f} (hard needs >= {HARD_THRESHOLD})"
        return with_reading(
            Score(
                hard=hard,
                soft=value,
                predicted_answer=answer,
                fail_reason=fail,
                extras=extras,
                expected=" | ".join(golds),
                detail=detail,
            ),
            reading,
        )

    def preflight(self, cfg: DocVQAConfig) -> None:
        """A missing split folder or data root gets a fix-it message (missing images are counted at load)."""
        config = self.config(cfg)
        super().preflight(config)
        if config.data_root and not Path(config.data_root).is_dir():
            raise BenchmarkSetupError(f"docvqa: benchmark.data_root {config.data_root} is not a folder")


plugin = DocVQABenchmark()

__all__ = [
    "BENCHMARK_ID",
    "DocVQABenchmark",
    "DocVQAConfig",
    "anls",
    "levenshtein",
    "normalise_row",
    "plugin",
    "read_csv_rows",
]
