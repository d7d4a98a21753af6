"""The built-in ``demo`` benchmark: generated word problems, trainable offline (BENCHMARKS.md §1.3).

Items come from ``world.generate_splits`` (``split_mode: generated``, the default), or from files
in the demo's own item form in ``split_dir`` / ``ratio`` mode. The answers follow conventions the
initial skill does not state, so training has something to learn; ``scripted.py`` holds the
target and optimizer that make ``skillopt train demo`` run with no model at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from skillopt.benchmarks.base import Judge, Score, skill_section
from skillopt.benchmarks.demo.world import TASK_TYPES, generate_splits, last_answer, score_response
from skillopt.config import BenchmarkSection
from skillopt.data import Item, SplitSpec, load_splits, split_output_dir
from skillopt.llm.chat import Message, system, user
from skillopt.resources import shipped_dir

BENCHMARK_ID = "demo"

_SYSTEM_INTRO = (
    "You solve short everyday word problems: distances, prices, capital cities, dates and counts. "
    "Each answer is checked exactly, character by character."
)
_ANSWER_FORMAT = (
    "Work the problem out in a line or two, then put only your final answer inside "
    "<answer>…</answer> at the end of your reply."
)


class DemoConfig(BenchmarkSection):
    """The ``benchmark:`` section for ``demo``: the common keys plus the generated split sizes."""

    model_config = ConfigDict(extra="forbid")

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
    item_id = row.get("id") or "demo-" + hashlib.sha1(question.encode("utf-8")).hexdigest()[:12]
    return {**row, "id": item_id, "task_type": task_type, "question": question, "answer": answer}


class DemoBenchmark:
    """The ``demo`` plug-in (the ``Benchmark`` protocol in ``skillopt.benchmarks.base``)."""

    id = BENCHMARK_ID
    version = "2"
    GOLD_FIELDS: tuple[str, ...] = ("answer",)
    Config = DemoConfig
    default_split_mode = "generated"
    scripted_rules: Sequence[Mapping[str, Any]] = (
        {"name": "demo target", "stage": "rollout", "handler": "skillopt.benchmarks.demo.scripted:target"},
    )

    @property
    def prompts_dir(self) -> Path:
        return shipped_dir("prompts") / "benchmarks" / BENCHMARK_ID

    def load_split(self, cfg: BaseModel, split: str, *, run_dir: Path) -> list[Item]:
        """The items of ``split``; generated from ``split_seed`` unless ``split_mode`` names files."""
        config = cfg if isinstance(cfg, DemoConfig) else DemoConfig.model_validate(cfg.model_dump())
        spec = SplitSpec.from_benchmark_config(config, default_split_mode=self.default_split_mode)
        sizes = {"train": config.train_size, "val": config.val_size, "test": config.test_size}
        splits = load_splits(
            spec,
            benchmark=BENCHMARK_ID,
            normalise=normalise_row,
            generate=partial(generate_splits, sizes=sizes),
            out_dir=split_output_dir(spec, run_dir=run_dir, benchmark=BENCHMARK_ID),
        )
        return splits.get(split)

    def build_messages(self, item: Item, skill: str, cfg: BaseModel) -> list[Message]:
        """The system prompt (task, skill, answer format) and the question; gold is never read."""
        return [
            system(f"{_SYSTEM_INTRO}\n\n{skill_section(skill)}{_ANSWER_FORMAT}"),
            user(str(item["question"])),
        ]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        """Exact match with gold; partial credit per convention; never raises for a bad answer."""
        return score_response(item.task_type, str(item["answer"]), response_text)

    def extract_answer(self, response_text: str) -> str | None:
        """The answer the scorer reads (the last ``<answer>`` tag); the runner's self-check turns compare it."""
        return last_answer(response_text)

    def task_types(self, items: Sequence[Item]) -> list[str]:
        present = {item.task_type for item in items}
        return [kind for kind in TASK_TYPES if kind in present] + sorted(present - set(TASK_TYPES))

    def preflight(self, cfg: BaseModel) -> None:
        """Nothing to check: the demo reads no data, tools or credentials of its own."""

    def needs_judge(self, cfg: BaseModel) -> bool:
        return False


plugin = DemoBenchmark()

__all__ = ["BENCHMARK_ID", "DemoBenchmark", "DemoConfig", "normalise_row", "plugin"]
