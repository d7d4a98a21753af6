"""The bring-your-own ``qa`` benchmark.

Items come from tests/fixtures/qa (split_dir form) or its raw copies (ratio form); the target is
the real ``scripted`` backend answering from the fixture folder's ``scripted_rules.yaml``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from skillopt.benchmarks.base import (
    Benchmark,
    BenchmarkSetupError,
    RolloutInfrastructureError,
    benchmark_config,
    load_benchmark,
)
from skillopt.benchmarks.qa import QAConfig, plugin
from skillopt.benchmarks.runner import check_infrastructure, error_row, run_item
from skillopt.core.config import load_config
from skillopt.core.data import Item
from skillopt.core.errors import DataError
from skillopt.llm.base import BackendContext
from skillopt.llm.errors import ServerError
from skillopt.llm.scripted import ScriptedBackend, parse_rules, resolve_rule_set
from skillopt.shell.cli import _data_overrides
from tests.fakes.benchmark_target import PluginScriptedTarget, fixture_config_of, fixture_rules, items_by_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "qa"
SPIDER = "How many legs does a spider have?"
SPIDER_ID = "qa-" + hashlib.sha1(SPIDER.encode("utf-8")).hexdigest()[:12]


# ------------------------------------------------------------------------------------------ helpers


def fixture_config(**overrides: Any) -> QAConfig:
    """The config a user gets from ``skillopt train qa --data tests/fixtures/qa -o benchmark.<k>=<v>``."""
    config = fixture_config_of(plugin, [f"benchmark.{key}={value}" for key, value in overrides.items()])
    assert isinstance(config, QAConfig)
    return config


def fixture_items(tmp_path: Path, **overrides: Any) -> dict[str, Item]:
    config = fixture_config(**overrides)
    return items_by_id(plugin, config, tmp_path)


def score(item: Item, reply: str, judge: Any = None) -> tuple[float, float, str]:
    result = plugin.score(item, reply, judge)
    return result.hard, result.soft, result.fail_reason


class ScriptedTarget(PluginScriptedTarget):
    """The ``target`` role as the runner uses it: the real scripted backend with this plug-in's rules."""

    def __init__(self, rules: Any = None) -> None:
        super().__init__(plugin, rules)


def scripted_judge(item: Item, prediction: str) -> tuple[bool, str]:
    """The judge callable backed by the scripted ``auto`` judge, through the plug-in's own request."""
    backend = ScriptedBackend(resolve_rule_set(None, BackendContext(), where="test"), role="judge")
    verdict = json.loads(backend.attempt(plugin.judge_request(item, prediction), timeout_s=30).text)
    return verdict["verdict"] == "correct", verdict["reason"]


def exploding_judge(item: Item, prediction: str) -> tuple[bool, str]:
    raise AssertionError("the judge must not be called")


# ------------------------------------------------------------------------------------ config, loading


def test_registered_and_the_default_config_with_data_loads_and_passes_preflight(tmp_path):
    assert isinstance(load_benchmark("qa"), Benchmark)
    config = fixture_config()
    assert config.split_mode == "split_dir" and config.data_root == str(FIXTURES)
    assert config.scoring == "exact" and config.tolerance == 1e-6
    plugin.preflight(config)
    items = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [[item.id for item in rows] for rows in items.values()] == [["cap-fr"], ["planet"], [SPIDER_ID]]
    assert plugin.task_types([item for rows in items.values() for item in rows]) == [
        "astronomy",
        "geography",
        "qa",
    ]


def test_the_default_split_mode_is_ratio_and_needs_a_data_file(tmp_path):
    config = benchmark_config(plugin, load_config("qa", env={}).config.benchmark)
    assert plugin.default_split_mode == "ratio"
    with pytest.raises(ValueError, match="ratio mode needs data_path"):
        plugin.load_split(config, "train", run_dir=tmp_path)


def test_items_are_normalized_and_the_third_id_is_qa_plus_sha1_of_its_question(tmp_path):
    items = fixture_items(tmp_path)
    spider = items[SPIDER_ID]
    assert "qa-" + hashlib.sha1(b"How many legs does a spider have?").hexdigest()[:12] == SPIDER_ID
    assert {key: spider[key] for key in ("question", "answers", "context", "choices", "task_type")} == {
        "question": SPIDER,
        "answers": ["8", "eight"],
        "context": "Every adult spider has eight legs.",
        "choices": [],
        "task_type": "qa",
    }
    assert items["cap-fr"]["answers"] == ["Paris"] and items["cap-fr"].task_type == "geography"
    assert items["planet"]["choices"] == ["Mars", "Jupiter", "Venus"]


def test_an_unknown_split_name_raises_listing_the_accepted_names(tmp_path):
    with pytest.raises(ValueError, match="accepted names: train, val, selection"):
        plugin.load_split(fixture_config(), "dev", run_dir=tmp_path)
    assert [item.id for item in plugin.load_split(fixture_config(), "selection", run_dir=tmp_path)] == [
        "planet"
    ]


def test_renamed_question_field_loads_rows_that_carry_prompt(tmp_path):
    root = tmp_path / "data"
    for split, n in (("train", 1), ("val", 2), ("test", 3)):
        (root / split).mkdir(parents=True)
        (root / split / "rows.jsonl").write_text(
            json.dumps({"prompt": f"Question {n}?", "answer": str(n)}) + "\n"
        )
    config = QAConfig(split_mode="split_dir", split_dir=str(root), fields={"question": "prompt"})
    [item] = plugin.load_split(config, "val", run_dir=tmp_path)
    assert item["question"] == "Question 2?" and item["answers"] == ["2"]


def test_a_row_without_the_question_field_names_the_file_the_row_and_the_field(tmp_path):
    source = tmp_path / "rows.jsonl"
    # a blank line between the rows: the message names the line an editor shows (3), not the record (2)
    source.write_text('{"prompt": "Q1?", "answer": "a"}\n\n{"question": "Q2?", "answer": "b"}\n')
    config = QAConfig(
        split_mode="ratio",
        data_path=str(source),
        split_output_dir=str(tmp_path / "out"),
        fields={"question": "prompt"},
    )
    with pytest.raises(DataError) as caught:
        plugin.load_split(config, "train", run_dir=tmp_path)
    message = str(caught.value)
    assert str(source) in message and "rows.jsonl line 3:" in message and "'prompt'" in message


def test_a_row_without_an_answer_is_an_error_with_no_drop_rule(tmp_path):
    source = tmp_path / "rows.json"
    source.write_text(json.dumps([{"question": "Q1?", "answer": "a"}, {"question": "Q2?", "answer": ""}]))
    config = QAConfig(split_mode="ratio", data_path=str(source), split_output_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match=r"row 2: field 'answer' is empty"):
        plugin.load_split(config, "train", run_dir=tmp_path)


def test_two_rows_with_the_same_question_and_no_id_are_a_duplicate_id_error(tmp_path):
    source = tmp_path / "rows.jsonl"
    source.write_text(
        '{"question": "Same?", "answer": "a"}\n' * 2 + '{"question": "Other?", "answer": "b"}\n'
    )
    config = QAConfig(split_mode="ratio", data_path=str(source), split_output_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match="duplicate item id 'qa-"):
        plugin.load_split(config, "train", run_dir=tmp_path)


def test_csv_cells_holding_json_lists_are_lists_and_other_cells_stay_text(tmp_path):
    source = tmp_path / "rows.csv"
    source.write_text(
        'question,answer,choices\nPick one?,"[""B""]","[""x"", ""y""]"\nBracketed?,[not json],\nPlain?,42,\n',
        encoding="utf-8",
    )
    config = QAConfig(
        split_mode="ratio", data_path=str(source), split_ratio="1:1:1", split_output_dir=str(tmp_path / "out")
    )
    items = {
        item["question"]: item
        for split in ("train", "val", "test")
        for item in plugin.load_split(config, split, run_dir=tmp_path)
    }
    assert items["Pick one?"]["answers"] == ["B"] and items["Pick one?"]["choices"] == ["x", "y"]
    assert items["Bracketed?"]["answers"] == ["[not json]"]
    assert items["Plain?"]["answers"] == ["42"] and items["Plain?"]["choices"] == []


def test_choice_scoring_needs_choices_on_every_row(tmp_path):
    with pytest.raises(DataError, match=r"train split, .*items.json row 1: scoring 'choice' needs choices"):
        fixture_items(tmp_path, scoring="choice")


def test_numeric_scoring_needs_a_numeric_gold_on_every_row(tmp_path):
    with pytest.raises(
        DataError, match=r"items.json row 1: scoring 'numeric' needs a number in field 'answer'"
    ):
        fixture_items(tmp_path, scoring="numeric")


@pytest.mark.parametrize("raw", ["items.jsonl", "items.csv"])
def test_ratio_output_round_trips_through_its_own_reader(tmp_path, raw):
    out = tmp_path / "splits"
    config = QAConfig(
        split_mode="ratio",
        data_path=str(FIXTURES / "raw" / raw),
        split_ratio="1:1:1",
        split_output_dir=str(out),
    )
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [len(rows) for rows in loaded.values()] == [1, 1, 1]
    manifest = json.loads((out / "split_manifest.json").read_text(encoding="utf-8"))
    assert manifest["counts"] == {"train": 1, "val": 1, "test": 1} and manifest["split_ratio"] == "1:1:1"
    # The written files read back as the same items through the split_dir reader.
    again = QAConfig(split_mode="split_dir", split_dir=str(out))
    for split, rows in loaded.items():
        written = json.loads((out / split / "items.json").read_text(encoding="utf-8"))
        assert [row["id"] for row in written] == manifest["ids"][split]
        assert plugin.load_split(again, split, run_dir=tmp_path) == rows
    # The JSONL and the CSV copy hold the same rows, so they give the same items as the fixture folder.
    expected = fixture_items(tmp_path / "fixture")
    assert {item.id: item for rows in loaded.values() for item in rows} == expected


# -------------------------------------------------------------------------------------------- prompts


def test_prompts_have_sections_skill_slot_and_format_line(tmp_path):
    items = fixture_items(tmp_path)
    system, user = plugin.build_messages(items[SPIDER_ID], "  Be brief.  ", fixture_config())
    assert system.role == "system" and "## Skill\nBe brief.\n\n" in system.text()
    assert "<answer>…</answer>" in system.text()
    assert user.text().index("## Context\nEvery adult spider") < user.text().index(
        "## Question\nHow many legs"
    )
    assert user.text().rstrip().endswith("Put your final answer inside <answer>…</answer>.")
    blank_system, capital_user = plugin.build_messages(items["cap-fr"], " \n", fixture_config())
    assert "## Skill" not in blank_system.text()
    assert "## Context" not in capital_user.text() and "## Choices" not in capital_user.text()


def test_the_planet_prompt_lists_labelled_options(tmp_path):
    _, user = plugin.build_messages(fixture_items(tmp_path)["planet"], "", fixture_config())
    assert "## Choices\nA. Mars\nB. Jupiter\nC. Venus" in user.text()


def test_no_prompt_reads_or_contains_a_gold_value(tmp_path):
    sentinel = "GOLD-SENTINEL-9431"
    for item in fixture_items(tmp_path).values():
        baseline = [m.text() for m in plugin.build_messages(item, "skill", fixture_config())]
        without_gold = Item({k: v for k, v in item.items() if k not in plugin.GOLD_FIELDS})
        assert [m.text() for m in plugin.build_messages(without_gold, "skill", fixture_config())] == baseline
        marked = Item({**item, **{field: [sentinel] for field in plugin.GOLD_FIELDS}})
        assert not any(sentinel in m.text() for m in plugin.build_messages(marked, "skill", fixture_config()))
    _, user = plugin.build_messages(fixture_items(tmp_path)["cap-fr"], "", fixture_config())
    assert "Paris" not in user.text()


# -------------------------------------------------------------------------------------------- scoring


def test_exact_scoring_on_the_capital_item(tmp_path):
    capital = fixture_items(tmp_path)["cap-fr"]
    assert score(capital, "<answer>Paris</answer>") == (1.0, 1.0, "")
    hard, soft, reason = score(capital, "<answer>The city of Paris</answer>")
    assert (hard, soft) == (0.0, pytest.approx(0.5))
    assert reason == "wrong: EM=0, predicted 'The city of Paris', expected ['Paris']"
    assert score(capital, "<answer>Lyon</answer> … <answer>Paris</answer>")[0] == 1.0


def test_exact_score_reports_expected_detail_and_extras(tmp_path):
    result = plugin.score(fixture_items(tmp_path)["cap-fr"], "<answer>The city of Paris</answer>", None)
    assert result.predicted_answer == "The city of Paris"
    assert result.expected == "['Paris']" and result.detail == "EM=0 F1=0.50"
    assert result.extras == {"scoring": "exact", "gold_answers": ["Paris"], "f1": 0.5}


def test_a_reply_without_an_answer_tag_is_a_no_answer_row(tmp_path):
    assert score(fixture_items(tmp_path)["cap-fr"], "Paris") == (0.0, 0.0, "no-answer: no <answer> tag")


@pytest.mark.parametrize("scoring", ["exact", "choice"])
@pytest.mark.parametrize("reply", ["<answer>B</answer>", "<answer>jupiter</answer>", "<answer>(b).</answer>"])
def test_the_planet_item_accepts_the_label_or_the_option_text(tmp_path, scoring, reply):
    planet = fixture_items(tmp_path)["planet"]
    planet["scoring"] = scoring  # as a load under benchmark.scoring=<scoring> sets it
    assert score(planet, reply)[:2] == (1.0, 1.0)
    assert score(planet, "<answer>A</answer>")[0] == 0.0


def test_choice_scoring_loads_choice_items_and_rejects_an_unknown_option(tmp_path):
    source = tmp_path / "rows.jsonl"
    source.write_text(
        "".join(
            json.dumps({"question": f"Q{n}?", "choices": ["Mars", "Jupiter"], "answer": "Jupiter"}) + "\n"
            for n in range(3)
        )
    )
    config = QAConfig(
        split_mode="ratio",
        data_path=str(source),
        split_ratio="1:1:1",
        scoring="choice",
        split_output_dir=str(tmp_path / "out"),
    )
    [item] = plugin.load_split(config, "train", run_dir=tmp_path)
    assert item["scoring"] == "choice"
    assert score(item, "<answer>B</answer>") == (1.0, 1.0, "")
    assert score(item, "<answer>A</answer>")[2] == "wrong: predicted option A, expected ['Jupiter']"
    assert score(item, "<answer>Saturn</answer>") == (0.0, 0.0, "no-answer: not a valid option")


def test_numeric_scoring_on_the_spider_item(tmp_path):
    # The capital and planet golds hold no number, so the spider row goes with two numeric rows.
    spider_row = (FIXTURES / "raw" / "items.jsonl").read_text(encoding="utf-8").splitlines()[2]
    source = tmp_path / "rows.jsonl"
    source.write_text(
        spider_row + "\n" + '{"question": "Q1?", "answer": "1"}\n{"question": "Q2?", "answer": "2"}\n'
    )
    config = QAConfig(
        split_mode="ratio",
        data_path=str(source),
        split_ratio="1:1:1",
        scoring="numeric",
        split_output_dir=str(tmp_path / "out"),
    )
    items = {
        item.id: item
        for split in ("train", "val", "test")
        for item in plugin.load_split(config, split, run_dir=tmp_path)
    }
    spider = items[SPIDER_ID]
    assert score(spider, "<answer>8.0</answer>") == (1.0, 1.0, "")
    assert score(spider, "<answer>9</answer>")[:2] == (0.0, 0.0)
    assert score(spider, "<answer>9</answer>")[2].startswith("wrong: predicted 9, expected ['8', 'eight']")
    assert score(spider, "<answer>eight</answer>") == (1.0, 1.0, "")  # number words are numbers
    assert score(spider, "<answer>no idea</answer>") == (0.0, 0.0, "no-answer: no number")


def test_numeric_tolerance_is_relative(tmp_path):
    item = Item(
        id="n",
        question="Q?",
        answers=["$1,000"],
        context="",
        choices=[],
        task_type="qa",
        scoring="numeric",
        tolerance=0.01,
    )
    assert score(item, "<answer>1,009</answer>")[0] == 1.0
    assert score(item, "<answer>1011</answer>")[0] == 0.0


def test_the_default_config_never_calls_the_judge(tmp_path):
    config = fixture_config()
    assert plugin.needs_judge(config) is False
    for item in fixture_items(tmp_path).values():
        plugin.score(item, "<answer>whatever</answer>", exploding_judge)


def test_judge_scoring_asks_the_judge_role_with_question_golds_and_prediction(tmp_path):
    config = fixture_config(scoring="judge")
    assert plugin.needs_judge(config) is True
    items = fixture_items(tmp_path, scoring="judge")
    request = plugin.judge_request(items["planet"], "Jupiter")
    assert request.stage == "judge"
    assert request.tags["prediction"] == "Jupiter" and request.tags["gold_answers"] == ["Jupiter"]
    assert "Which planet is the largest?\nA. Mars\nB. Jupiter\nC. Venus" in request.last_user_text()
    assert score(items["planet"], "<answer>B</answer>", scripted_judge) == (1.0, 1.0, "")
    assert score(items["cap-fr"], "<answer>paris.</answer>", scripted_judge)[0] == 1.0
    hard, soft, reason = score(items["cap-fr"], "<answer>The city of Paris</answer>", scripted_judge)
    assert (hard, soft) == (0.0, 0.0) and reason.startswith("wrong: judge: ")


def test_judge_scoring_without_a_judge_role_fails_before_any_rollout(tmp_path):
    from skillopt.run.assembly import Run

    overrides = [
        *_data_overrides(str(FIXTURES)),
        "benchmark.scoring=judge",
        "model.judge=null",
        "model.target.backend=scripted",
        "model.optimizer.backend=scripted",
        f"run.runs_dir={tmp_path / 'runs'}",
    ]
    with pytest.raises(BenchmarkSetupError, match="benchmark qa needs the judge role"):
        Run.from_config(load_config("qa", overrides=overrides, env={}), env={})
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------- runner and scripted


def test_scripted_rules_solve_two_fixture_items_and_miss_the_capital(tmp_path):
    items = fixture_items(tmp_path)
    target = ScriptedTarget()
    rows = {
        item_id: run_item(plugin, item, "", fixture_config(), target=target, judge=None)
        for item_id, item in items.items()
    }
    assert {item_id: (row.hard, round(row.soft, 2)) for item_id, row in rows.items()} == {
        "cap-fr": (0.0, 0.5),
        "planet": (1.0, 1.0),
        SPIDER_ID: (1.0, 1.0),
    }
    capital = rows["cap-fr"]
    assert capital.fail_reason.startswith("wrong: EM=0") and capital.task_type == "geography"
    assert capital.trajectory[-1]["type"] == "evaluation"
    assert "Expected: ['Paris']" in capital.trajectory[-1]["content"]
    assert "EM=0 F1=0.50" in capital.trajectory[-1]["content"]


def test_self_check_turns_stop_when_the_normalised_answer_repeats(tmp_path):
    config = fixture_config(max_turns=3)
    row = run_item(plugin, fixture_items(tmp_path)["planet"], "", config, target=ScriptedTarget(), judge=None)
    assert row.n_turns == 2 and row.hard == 1.0
    assert plugin.extract_answer("<answer>The Jupiter.</answer>") == plugin.extract_answer(
        "<answer>jupiter</answer>"
    )
    assert plugin.extract_answer("no tag") is None


def test_a_target_that_always_raises_is_an_infrastructure_error(tmp_path):
    failing = ScriptedTarget(rules=[{"stage": "rollout", "error": "ServerError"}])
    rows = []
    for item in fixture_items(tmp_path).values():
        with pytest.raises(ServerError) as caught:
            run_item(plugin, item, "", fixture_config(), target=failing, judge=None)
        rows.append(error_row(item, caught.value))
    assert all(row.phase == "error" and row.fail_reason.startswith("error: ServerError") for row in rows)
    with pytest.raises(RolloutInfrastructureError, match="none of 3 items got a model answer"):
        check_infrastructure(rows, role_label="scripted/scripted")


def test_scripted_rules_are_valid_rules():
    assert len(parse_rules(list(fixture_rules(plugin)), where="qa scripted_rules")) == len(
        fixture_rules(plugin)
    )


def test_a_bad_or_empty_rules_file_beside_the_data_is_named_with_its_file_before_any_rollout(tmp_path):
    """A misspelt key once failed every rollout ("none of 2 items got a model answer", no file named) and an
    empty file was called missing."""
    from skillopt.benchmarks.scripted_target import target_rules
    from skillopt.core.errors import ConfigError

    data = tmp_path / "items.jsonl"
    data.write_text('{"question": "Q?", "answer": "a"}\n')
    rules = tmp_path / "scripted_rules.yaml"
    config = QAConfig(split_mode="ratio", data_path=str(data), split_output_dir=str(tmp_path / "out"))
    rules.write_text("- questoin: Q?\n  reply: <answer>a</answer>\n")
    with pytest.raises(ConfigError, match=r"scripted_rules.yaml\[0\]\.questoin: unknown key"):
        target_rules("qa", config)
    rules.write_text("")
    with pytest.raises(ConfigError, match=r"scripted_rules.yaml: holds no scripted rules"):
        target_rules("qa", config)
