"""A minimal skillopt benchmark plug-in: short factual questions, exact-match scoring.

Copy this package, rename it, and change the three things that differ between benchmarks: how items
are loaded (``load_split``), how the target is prompted (``build_messages``) and how a reply is scored
(``score``). Everything else — threads, timeouts, trajectories, the evaluation event, caching,
training — is skillopt's. Register it in your package's ``pyproject.toml``::

    [project.entry-points."skillopt.benchmarks"]
    mybench = "skillopt_mybench:plugin"
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from skillopt.benchmarks.answers import exact_match, last_tag
from skillopt.benchmarks.base import Judge, Score, skill_section
from skillopt.config import BenchmarkSection
from skillopt.data import Item, SplitSpec, load_splits, split_output_dir
from skillopt.llm.chat import Message, system, user


class MyBenchConfig(BenchmarkSection):
    """The ``benchmark:`` section: the shared keys plus this benchmark's own (none here)."""

    model_config = ConfigDict(extra="forbid")

    data_root: str | None = None


def normalise(row: dict[str, Any]) -> dict[str, Any]:
    """Each row: ``id``, ``question``, ``answer``; the answer is the gold field."""
    return {"id": row["id"], "question": row["question"], "answer": str(row["answer"]),
            "task_type": row.get("task_type", "fact")}


class MyBench:
    id = "mybench"
    version = "1"  # bump it whenever prompting or scoring changes: it is part of every cache key
    GOLD_FIELDS: tuple[str, ...] = ("answer",)
    Config = MyBenchConfig
    default_split_mode = "split_dir"
    # What the `scripted` backend answers as the target, so `--backend scripted` runs offline.
    scripted_rules: Sequence[dict[str, Any]] = (
        {"stage": "rollout", "user": "capital of Italy", "text": "<answer>Rome</answer>"},
        {"stage": "rollout", "text": "I am not sure. <answer>unknown</answer>"},
    )

    @property
    def prompts_dir(self) -> Path:
        return Path(__file__).parent / "prompts"

    def load_split(self, cfg: MyBenchConfig, split: str, *, run_dir: Path) -> list[Item]:
        spec = SplitSpec.from_benchmark_config(cfg, default_split_mode=self.default_split_mode)
        splits = load_splits(spec, benchmark=self.id, normalise=normalise, default_task_type="fact",
                             out_dir=split_output_dir(spec, run_dir=run_dir, benchmark=self.id))
        return splits.get(split)

    def build_messages(self, item: Item, skill: str, cfg: MyBenchConfig) -> list[Message]:
        # Never read a GOLD_FIELDS key here: gold reaches the optimizer only through the evaluation event.
        return [
            system(f"Answer the question.\n\n{skill_section(skill)}Give the final answer inside <answer>…</answer>."),
            user(item["question"]),
        ]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        predicted = last_tag(response_text, "answer")
        if predicted is None:
            return Score(hard=0.0, soft=0.0, fail_reason="no-answer: no <answer> tag", expected=item["answer"])
        hard = 1.0 if exact_match(predicted, [item["answer"]]) else 0.0
        reason = "" if hard else f"wrong: predicted {predicted!r}, expected {item['answer']!r}"
        return Score(hard=hard, soft=hard, predicted_answer=predicted, fail_reason=reason, expected=item["answer"])

    def task_types(self, items: Sequence[Item]) -> list[str]:
        return sorted({str(item.get("task_type", "fact")) for item in items})

    def preflight(self, cfg: MyBenchConfig) -> None:
        return None

    def needs_judge(self, cfg: MyBenchConfig) -> bool:
        return False


plugin = MyBench()
