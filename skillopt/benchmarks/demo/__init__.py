"""The built-in ``demo`` benchmark: generated word problems, trainable offline.

Items come from ``world.generate_splits`` (``split_mode: generated``, the default), or from files
in the demo's own item form in ``split_dir`` / ``ratio`` mode. The answers follow conventions the
initial skill does not state, so training has something to learn; ``scripted.py`` holds the
target and optimizer that make ``skillopt train demo`` run with no model at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import Field

from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score, split_items
from skillopt.benchmarks.demo.world import TASK_TYPES, generate_splits, last_answer, score_response
from skillopt.benchmarks.rows import hashed_id
from skillopt.core.data import Item
from skillopt.llm.chat import Message, user

BENCHMARK_ID = "demo"

_SYSTEM_INTRO = (
    "You solve short everyday word problems: distances, prices, capital cities, dates and counts. "
    "Each answer is checked exactly, character by character."
)
_ANSWER_FORMAT = (
    "Work the problem out in a line or two, then put only your final answer inside "
    "<answer>…</answer> at the end of your reply."
)


class DemoConfig(BenchmarkConfig):
    """The ``benchmark:`` section for ``demo``: the common keys plus the generated split sizes."""

    #: Items generated per split in ``generated`` mode (ignored by the file-based modes).
    train_size: int = Field(default=24, ge=1)
    val_size: int = Field(default=12, ge=1)
    test_size: int = Field(default=24, ge=0)


def normalise_row(row: dict[str, Any]) -> dict[str, Any]:
    """A demo item from a file row (idempotent): needs ``question``, ``answer`` and a known ``task_type``.

    A row without an id gets ``demo-`` plus the first 12 hex chars of its question's sha1.
    """
    question, answer, task_type = str(row["question"]), str(row["answer"]), str(row["task_type"])
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown task_type {task_type!r}; expected one of {', '.join(TASK_TYPES)}")
    item_id = row.get("id") or hashed_id("demo-", question)
    return {**row, "id": item_id, "task_type": task_type, "question": question, "answer": answer}


class DemoBenchmark(Benchmark[DemoConfig]):
    """The ``demo`` plug-in."""

    id = BENCHMARK_ID
    version = "2"
    GOLD_FIELDS = ("answer",)
    Config = DemoConfig
    default_split_mode = "generated"

    def normalise_row(self, row: Mapping[str, Any], cfg: DemoConfig) -> dict[str, Any]:
        return normalise_row(dict(row))

    def load_split(self, cfg: DemoConfig, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split``; generated from ``split_seed`` unless ``split_mode`` names files."""
        config = self.config(cfg)
        sizes = {"train": config.train_size, "val": config.val_size, "test": config.test_size}
        return split_items(config, split, run_dir=run_dir, benchmark=BENCHMARK_ID,
                           default_split_mode=self.default_split_mode, normalise=normalise_row,
                           generate=partial(generate_splits, sizes=sizes))

    def build_messages(self, item: Item, skill: str, cfg: DemoConfig) -> list[Message]:
        """The system prompt (task, skill, answer format) and the question; gold is never read."""
        return [
            self.system_message(_SYSTEM_INTRO, skill, _ANSWER_FORMAT),
            user(str(item["question"])),
        ]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """Exact match with gold; partial credit per convention; never raises for a bad answer."""
        return score_response(item.task_type, str(item["answer"]), response_text)

    def extract_answer(self, response_text: str) -> str | None:
        """The answer the scorer reads (the last ``<answer>`` tag); the runner's self-check turns compare
        it."""
        return last_answer(response_text)

    def task_types(self, items: Sequence[Item]) -> list[str]:
        present = {item.task_type for item in items}
        return [kind for kind in TASK_TYPES if kind in present] + sorted(present - set(TASK_TYPES))

    def preflight(self, cfg: DemoConfig) -> None:
        """Nothing to check: the demo reads no data, tools or credentials of its own."""


plugin = DemoBenchmark()

__all__ = ["BENCHMARK_ID", "DemoBenchmark", "DemoConfig", "normalise_row", "plugin"]
