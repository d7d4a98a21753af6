"""Benchmark plug-ins with one bug each, as a third party might write them: what skillopt says when a
plug-in cannot be loaded, raises, or returns what the runner cannot use (``tests/unit/test_plugin_failures``).

``Capitals`` works; every other class breaks one part of the contract (``skillopt.benchmarks.base``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from skillopt.benchmarks.answers import last_tag
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, Judge, Score
from skillopt.benchmarks.rows import required_text
from skillopt.core.data import Item
from skillopt.llm.chat import Message, user


class CapitalsConfig(BenchmarkConfig):
    pass


class Capitals(Benchmark[CapitalsConfig]):
    """A working plug-in: exact match on the ``<answer>`` tag."""

    id = "capitals"
    Config = CapitalsConfig
    GOLD_FIELDS = ("answer",)

    def normalise_row(self, row: Mapping[str, Any], cfg: CapitalsConfig) -> dict[str, Any]:
        return {"id": required_text(row, "id"), "question": required_text(row, "question"),
                "answer": required_text(row, "answer")}

    def build_messages(self, item: Item, skill: str, cfg: CapitalsConfig) -> list[Message]:
        return [self.system_message("Answer.", skill, "Use <answer>…</answer>."), user(item["question"])]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        answer = last_tag(response_text, "answer") or ""
        hard = float(answer == item["answer"])
        return Score(hard=hard, soft=hard, predicted_answer=answer, fail_reason="" if hard else "wrong: no")


class DividesByZero(Capitals):
    """``score`` crashes on one item."""

    id = "divides_by_zero"

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        if item.id == "pe":
            return Score(hard=1 / 0, soft=0.0)
        return super().score(item, response_text, judge)


class AsksTheJudge(Capitals):
    """``score`` calls the judge (which may fail like any model call)."""

    id = "asks_the_judge"

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        assert judge is not None
        correct, reason = judge(item, last_tag(response_text, "answer") or "")
        return Score(hard=float(correct), soft=float(correct), detail=reason)


class ScoresAFloat(Capitals):
    """``score`` returns a bare number."""

    id = "scores_a_float"

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Any:
        return 1.0


class ScoresInPercent(Capitals):
    """``score`` reports percentages (``model_copy`` skips the model's validation)."""

    id = "scores_in_percent"

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        score = super().score(item, response_text, judge)
        return score.model_copy(update={"hard": 100 * score.hard})


class ScoresNaN(Capitals):
    """``score`` gives a soft score of NaN."""

    id = "scores_nan"

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        return Score(hard=0.0, soft=float("nan"))


class PromptIsAString(Capitals):
    """``build_messages`` returns the user's text instead of messages."""

    id = "prompt_is_a_string"

    def build_messages(self, item: Item, skill: str, cfg: CapitalsConfig) -> Any:
        return item["question"]


class ReadsAnInt(Capitals):
    """``normalise_row`` treats a number as text."""

    id = "reads_an_int"

    def normalise_row(self, row: Mapping[str, Any], cfg: CapitalsConfig) -> dict[str, Any]:
        return {"id": row["id"], "question": row["question"].strip(), "answer": row["answer"]}


class DropsTheId(Capitals):
    """``normalise_row`` forgets to copy the id."""

    id = "drops_the_id"

    def normalise_row(self, row: Mapping[str, Any], cfg: CapitalsConfig) -> dict[str, Any]:
        return {"question": row["question"], "answer": row["answer"]}


class StrictConfig(BenchmarkConfig):
    strictness: int


class NoDefault(Capitals):
    """Its ``Config`` has a key without a default."""

    id = "no_default"
    Config = StrictConfig  # type: ignore[assignment]


class NoScore(Benchmark[CapitalsConfig]):
    """No ``score``: the class cannot be instantiated."""

    id = "no_score"
    Config = CapitalsConfig

    def normalise_row(self, row: Mapping[str, Any], cfg: CapitalsConfig) -> dict[str, Any]:
        return dict(row)

    def build_messages(self, item: Item, skill: str, cfg: CapitalsConfig) -> list[Message]:
        return [user("?")]


class PlainConfig(BaseModel):
    strictness: int = 1


class PlainModelConfig(Capitals):
    """Its ``Config`` is a pydantic model, not a ``BenchmarkConfig``."""

    id = "plain_model_config"
    Config = PlainConfig  # type: ignore[assignment]


class NoId(Benchmark[CapitalsConfig]):
    """No ``id`` class attribute."""

    Config = CapitalsConfig

    def normalise_row(self, row: Mapping[str, Any], cfg: CapitalsConfig) -> dict[str, Any]:
        return dict(row)

    def build_messages(self, item: Item, skill: str, cfg: CapitalsConfig) -> list[Message]:
        return [user("?")]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        return Score(hard=0.0, soft=0.0)
