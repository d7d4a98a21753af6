"""A minimal skillopt benchmark plug-in: short factual questions, exact-match scoring.

Copy this package, rename it, and change the three things that differ between benchmarks: how a row
becomes an item (``normalise_row``), how the target is prompted (``build_messages``) and how a reply
is scored (``score``). Everything else — split folders and ratio splits, threads, timeouts,
trajectories, the evaluation event, caching, training — is skillopt's, and every optional hook
(``read_rows``, ``extract_answer``, ``judge_request``, ``run_episode``, ``bind_target``,
``preflight``, ...) has a default in ``skillopt.benchmarks.base.Benchmark``, whose docstring is the
contract. Register it in your package's ``pyproject.toml``::

    [project.entry-points."skillopt.benchmarks"]
    mybench = "skillopt_mybench:plugin"
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skillopt.benchmarks.answers import exact_match, last_tag
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score
from skillopt.benchmarks.rows import required_text
from skillopt.core.data import Item
from skillopt.llm.chat import Message, user


class MyBenchConfig(BenchmarkConfig):
    """The ``benchmark:`` section: the shared keys plus this benchmark's own (none here)."""


class MyBench(Benchmark[MyBenchConfig]):
    id = "mybench"
    Config = MyBenchConfig
    # build_messages never reads these: gold reaches the optimizer only after scoring.
    GOLD_FIELDS = ("answer",)
    default_task_type = "fact"

    @property
    def prompts_dir(self) -> Path:
        return Path(__file__).parent / "prompts"

    def normalise_row(self, row: Mapping[str, Any], cfg: MyBenchConfig) -> dict[str, Any]:
        # A KeyError or ValueError becomes a load error naming the file and the row.
        return {"id": required_text(row, "id"), "question": required_text(row, "question"),
                "answer": required_text(row, "answer"), "task_type": row.get("task_type") or "fact"}

    def build_messages(self, item: Item, skill: str, cfg: MyBenchConfig) -> list[Message]:
        return [self.system_message("Answer the question.", skill,
                                    "Give the final answer inside <answer>…</answer>."),
                user(item["question"])]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        predicted = last_tag(response_text, "answer")
        if predicted is None:
            return Score(hard=0.0, soft=0.0, fail_reason="no-answer: no <answer> tag",
                         expected=item["answer"])
        hard = 1.0 if exact_match(predicted, [item["answer"]]) else 0.0
        reason = "" if hard else f"wrong: predicted {predicted!r}, expected {item['answer']!r}"
        return Score(hard=hard, soft=hard, predicted_answer=predicted, fail_reason=reason,
                     expected=item["answer"])


plugin = MyBench()
