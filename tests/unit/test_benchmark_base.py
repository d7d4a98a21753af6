"""The ``Benchmark[ConfigT]`` base class: a plug-in writes three methods and inherits every other hook.

A small plug-in defined here (loader, prompt, scorer only) is loaded from a split folder and rolled
out through the shared runner with the real ``scripted`` backend as its target.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from skillopt.benchmarks.answers import last_tag
from skillopt.benchmarks.base import Benchmark, BenchmarkConfig, BenchmarkSetupError, Judge, Score
from skillopt.benchmarks.rows import required_text
from skillopt.benchmarks.runner import run_item
from skillopt.core.data import Item
from skillopt.llm.chat import Message, user
from tests.fakes.benchmark_target import RecordingScriptedTarget

#: Every hook a plug-in may override; each must be declared (with its contract) in the base class.
OPTIONAL_HOOKS = ("read_rows", "load_split", "data_roots", "batch_view", "run_episode", "extract_answer",
                  "needs_judge", "judge_request", "bind_target", "preflight", "task_types", "prompts_dir",
                  "system_message", "config")
CLASS_ATTRIBUTES = ("GOLD_FIELDS", "version", "default_split_mode", "default_task_type", "native_extensions",
                    "extras", "uses_images", "data_hint")


class TinyConfig(BenchmarkConfig):
    pass


class Tiny(Benchmark[TinyConfig]):
    id = "tiny"
    Config = TinyConfig
    GOLD_FIELDS = ("answer",)

    def normalise_row(self, row: Mapping[str, Any], cfg: TinyConfig) -> dict[str, Any]:
        return {"id": required_text(row, "id"), "question": required_text(row, "question"),
                "answer": required_text(row, "answer")}

    def build_messages(self, item: Item, skill: str, cfg: TinyConfig) -> list[Message]:
        return [self.system_message("Answer.", skill, "Use <answer>…</answer>."), user(item["question"])]

    def score(self, item: Item, response_text: str, judge: Judge | None) -> Score:
        answer = last_tag(response_text, "answer") or ""
        hard = float(answer.lower() == item["answer"].lower())
        return Score(hard=hard, soft=hard, predicted_answer=answer, fail_reason="" if hard else "wrong: no")


def split_folder(tmp_path: Path) -> Path:
    for split, rows in {"train": [{"id": "a", "question": "Capital of Italy?", "answer": "Rome"}],
                        "val": [{"id": "b", "question": "Capital of Peru?", "answer": "Lima"}],
                        "test": [{"id": "c", "question": "Capital of Chad?", "answer": "N'Djamena"}]}.items():
        (tmp_path / split).mkdir(parents=True)
        (tmp_path / split / "items.json").write_text(json.dumps(rows))
    return tmp_path


def test_every_optional_hook_and_attribute_is_declared_in_the_base_class():
    for name in (*OPTIONAL_HOOKS, *CLASS_ATTRIBUTES):
        assert name in vars(Benchmark), f"{name} is not declared in Benchmark"
    for name in OPTIONAL_HOOKS:
        if callable(vars(Benchmark)[name]):
            assert (vars(Benchmark)[name].__doc__ or "").strip(), f"{name} has no contract docstring"


def test_a_plugin_missing_a_required_method_cannot_be_instantiated():
    class NoScore(Benchmark[TinyConfig]):
        id = "noscore"
        Config = TinyConfig

        def normalise_row(self, row: Mapping[str, Any], cfg: TinyConfig) -> dict[str, Any]:
            return dict(row)

        def build_messages(self, item: Item, skill: str, cfg: TinyConfig) -> list[Message]:
            return []

    with pytest.raises(TypeError, match="score"):
        NoScore()


def test_the_defaults_load_split_folders_and_answer_every_hook(tmp_path):
    bench = Tiny()
    config = TinyConfig(split_mode="split_dir", split_dir=str(split_folder(tmp_path / "data")))
    items = {split: bench.load_split(config, split, run_dir=tmp_path / "run")
             for split in ("train", "val", "test")}
    assert [item.id for item in items["train"]] == ["a"] and items["train"][0].task_type == "default"
    item = items["train"][0]
    assert bench.batch_view(item, config, seed=7, training=True) is item
    assert bench.bind_target(config, backend="scripted", kind="chat") == (config, [])
    assert bench.needs_judge(config) is False and bench.extras == () and bench.uses_images is False
    assert bench.task_types(items["train"] + items["val"]) == ["default"]
    assert bench.data_roots(config) == [Path(config.split_dir)]
    request = bench.judge_request(item, "Roma")
    assert request.stage == "judge" and request.tags["gold_answers"] == ["Rome"]
    assert request.tags["prediction"] == "Roma" and "Capital of Italy?" in request.messages[-1].text()
    bench.preflight(config)
    with pytest.raises(BenchmarkSetupError, match=r"tiny: no split folder .*pass --data DIR"):
        bench.preflight(config.model_copy(update={"split_dir": str(tmp_path / "nowhere")}))
    ratio = TinyConfig(split_mode="ratio", data_path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(BenchmarkSetupError, match="tiny: no data at"):
        bench.preflight(ratio)


def test_max_turns_works_with_the_default_extract_answer(tmp_path):
    """The default ``extract_answer`` (the last ``<answer>`` tag) drives self-check turns: a reply
    without the tag gets the format request, and turns stop once the answer repeats."""
    bench = Tiny()
    config = TinyConfig(split_mode="split_dir", split_dir=str(split_folder(tmp_path / "data")), max_turns=4)
    item = bench.load_split(config, "train", run_dir=tmp_path / "run")[0]
    target = RecordingScriptedTarget([
        {"stage": "rollout", "user": "no answer in the required format", "text": "<answer>Rome</answer>"},
        {"stage": "rollout", "user": "Re-check your answer", "text": "Still <answer> rome </answer>"},
        {"stage": "rollout", "text": "I think it is Rome."},
    ])
    row = run_item(bench, item, "Be brief.", config, target=target, judge=None)
    assert row.n_turns == 3 and row.hard == 1.0  # no tag -> format request -> Rome -> same answer: stop
    feedback = [event["content"] for event in row.trajectory if event["type"] == "feedback"]
    assert feedback[0].startswith("Your reply has no answer") and feedback[1].startswith("Re-check")
    assert "## Skill\nBe brief." in target.requests[0].messages[0].text()


def test_the_system_message_leaves_a_blank_skill_out():
    assert Tiny.system_message("Intro.", "  ", "Rules.").text() == "Intro.\n\nRules."
    assert Tiny.system_message("Intro.", "Skill.", "Rules.").text() == "Intro.\n\n## Skill\nSkill.\n\nRules."
