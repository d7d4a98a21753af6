"""The ``searchqa`` benchmark.

Items come from tests/fixtures/searchqa (split_dir form) or its raw copy (ratio form); the target
is the real ``scripted`` backend answering from the fixture folder's ``scripted_rules.yaml``.
"""

from __future__ import annotations

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
from skillopt.benchmarks.runner import check_infrastructure, error_row, run_item
from skillopt.benchmarks.searchqa import TRUNCATED, SearchQAConfig, cut_context, plugin
from skillopt.core.config import load_config
from skillopt.core.data import Item
from skillopt.core.errors import DataError
from skillopt.llm.errors import ServerError
from tests.fakes.benchmark_target import PluginScriptedTarget, fixture_config_of, items_by_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "searchqa"
NOVEL, RIVER, ELEMENT = (
    "0a1b2c3d4e5f40718293a4b5c6d7e8f9",
    "1b2c3d4e5f6a41829304b5c6d7e8f9a0",
    "2c3d4e5f6a7b42930415c6d7e8f9a0b1",
)


def fixture_config(*overrides: str) -> SearchQAConfig:
    """The config a user gets from ``skillopt train searchqa --data tests/fixtures/searchqa -o ...``."""
    config = fixture_config_of(plugin, overrides)
    assert isinstance(config, SearchQAConfig)
    return config


def fixture_items(tmp_path: Path) -> dict[str, Item]:
    config = fixture_config()
    return items_by_id(plugin, config, tmp_path)


def score(item: Item, reply: str) -> tuple[float, float, str]:
    result = plugin.score(item, reply, None)
    return result.hard, result.soft, result.fail_reason


class ScriptedTarget(PluginScriptedTarget):
    """The ``target`` role as the runner uses it: the real scripted backend with this plug-in's rules."""

    def __init__(self, rules: Any = None) -> None:
        super().__init__(plugin, rules)


# ------------------------------------------------------------------------------------ config, loading


def test_registered_and_the_default_config_with_data_loads_and_passes_preflight(tmp_path):
    assert isinstance(load_benchmark("searchqa"), Benchmark)
    config = fixture_config()
    assert config.split_mode == "split_dir" and config.max_context_chars == 6000 and config.workers == 24
    assert config.data_root == str(FIXTURES)
    plugin.preflight(config)
    assert plugin.needs_judge(config) is False
    ids = [
        [item.id for item in plugin.load_split(config, split, run_dir=tmp_path)]
        for split in ("train", "val", "test")
    ]
    assert ids == [[NOVEL], [RIVER], [ELEMENT]]
    assert plugin.task_types(list(fixture_items(tmp_path).values())) == ["qa"]
    assert all(item.task_type == "qa" for item in fixture_items(tmp_path).values())


def test_preflight_without_the_split_folder_says_how_to_fix_it(tmp_path):
    config = benchmark_config(plugin, load_config("searchqa", env={}).config.benchmark)
    assert config.split_dir == "data/searchqa_split"
    with pytest.raises(BenchmarkSetupError, match="pass --data DIR"):
        plugin.preflight(config.model_copy(update={"split_dir": str(tmp_path / "missing")}))


def test_an_unknown_split_name_raises(tmp_path):
    with pytest.raises(ValueError, match="unknown split name 'dev'"):
        plugin.load_split(fixture_config(), "dev", run_dir=tmp_path)
    assert [item.id for item in plugin.load_split(fixture_config(), "valid_unseen", run_dir=tmp_path)] == [
        ELEMENT
    ]


def test_a_row_without_answers_names_the_file_the_row_and_the_field(tmp_path):
    source = tmp_path / "rows.jsonl"
    rows = json.loads((FIXTURES / "raw" / "items.json").read_text(encoding="utf-8"))
    del rows[1]["answers"]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = SearchQAConfig(split_mode="ratio", data_path=str(source), split_output_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match=r"rows.jsonl line 2: missing field 'answers'"):
        plugin.load_split(config, "train", run_dir=tmp_path)


def test_ratio_output_round_trips_through_its_own_reader(tmp_path):
    out = tmp_path / "splits"
    config = SearchQAConfig(
        split_mode="ratio",
        data_path=str(FIXTURES / "raw" / "items.json"),
        split_ratio="1:1:1",
        split_output_dir=str(out),
    )
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    manifest = json.loads((out / "split_manifest.json").read_text(encoding="utf-8"))
    assert manifest["counts"] == {"train": 1, "val": 1, "test": 1}
    again = SearchQAConfig(split_mode="split_dir", split_dir=str(out))
    for split, rows in loaded.items():
        assert [row["id"] for row in json.loads((out / split / "items.json").read_text())] == manifest["ids"][
            split
        ]
        assert plugin.load_split(again, split, run_dir=tmp_path) == rows
    assert {item.id: item for rows in loaded.values() for item in rows} == fixture_items(tmp_path / "fixture")


# -------------------------------------------------------------------------------------------- prompts


def test_prompt_has_skill_slot_format_line_then_context_and_question(tmp_path):
    item = fixture_items(tmp_path)[RIVER]
    system, user = plugin.build_messages(item, "Name the city only.", fixture_config())
    assert "## Skill\nName the city only.\n\n" in system.text() and "<answer>…</answer>" in system.text()
    assert user.text() == f"## Context\n{item['context']}\n\n## Question\n{item['question']}"
    assert "## Skill" not in plugin.build_messages(item, "", fixture_config())[0].text()


def test_no_prompt_reads_or_contains_a_gold_value(tmp_path):
    sentinel = "GOLD-SENTINEL-5172"
    for item in fixture_items(tmp_path).values():
        baseline = [m.text() for m in plugin.build_messages(item, "skill", fixture_config())]
        without_gold = Item({k: v for k, v in item.items() if k not in plugin.GOLD_FIELDS})
        assert [m.text() for m in plugin.build_messages(without_gold, "skill", fixture_config())] == baseline
        marked = Item({**item, **{field: [sentinel] for field in plugin.GOLD_FIELDS}})
        assert not any(sentinel in m.text() for m in plugin.build_messages(marked, "skill", fixture_config()))


def test_context_is_cut_at_doc_boundaries_keeping_whole_passages():
    passages = [f"[DOC] [TLE] Title {n} [PAR] {'text ' * 6}" for n in range(3)]
    context = "".join(passages)
    assert cut_context(context, len(context)) == context
    assert (
        cut_context(context, len(passages[0]) + len(passages[1]) + 5) == (passages[0] + passages[1]).rstrip()
    )
    assert cut_context(context, len(passages[0])) == passages[0].rstrip()


def test_an_oversize_first_passage_is_hard_cut_and_marked():
    context = "[DOC] [TLE] Long [PAR] " + "word " * 100 + "[DOC] [TLE] Short [PAR] tiny"
    cut = cut_context(context, 60)
    assert cut.endswith(TRUNCATED) and len(cut) == 60 and cut.startswith("[DOC] [TLE] Long [PAR] word")


def test_max_context_chars_applies_to_the_prompt(tmp_path):
    item = fixture_items(tmp_path)[NOVEL]
    _, user = plugin.build_messages(item, "", fixture_config("benchmark.max_context_chars=40"))
    assert f"## Context\n{item['context'][: 40 - len(TRUNCATED)]}{TRUNCATED}\n\n## Question" in user.text()


# -------------------------------------------------------------------------------------------- scoring


def test_the_article_is_dropped_before_exact_match(tmp_path):
    assert score(fixture_items(tmp_path)[NOVEL], "<answer>Sun Also Rises</answer>") == (1.0, 1.0, "")


def test_an_answer_with_extra_words_scores_partial_f1(tmp_path):
    result = plugin.score(fixture_items(tmp_path)[RIVER], "<answer>Prague, Czechia</answer>", None)
    assert (result.hard, round(result.soft, 2)) == (0.0, 0.67)
    assert result.fail_reason == "wrong: EM=0, predicted 'Prague, Czechia', expected ['Prague', 'Praha']"
    assert result.extras == {"em": 0.0, "f1": 0.6667, "sub_em": 1.0, "gold_answers": ["Prague", "Praha"]}
    assert result.expected == "['Prague', 'Praha']" and result.detail == "EM=0 F1=0.67 sub_EM=1"


def test_without_a_tag_the_last_non_empty_line_is_the_answer(tmp_path):
    element = fixture_items(tmp_path)[ELEMENT]
    assert score(element, "Atomic number 79 is Au.\nGold\n\n") == (1.0, 1.0, "")
    assert plugin.score(element, "  gold  ", None).predicted_answer == "gold"
    assert score(element, "") == (0.0, 0.0, "no-answer: empty reply")
    assert score(element, "<answer>Silver</answer> no wait <answer>Gold</answer>")[0] == 1.0


# ------------------------------------------------------------------------------- runner and scripted


def test_scripted_rules_solve_two_fixture_items_and_miss_the_river(tmp_path):
    target = ScriptedTarget()
    rows = {
        item_id: run_item(plugin, item, "", fixture_config(), target=target, judge=None)
        for item_id, item in fixture_items(tmp_path).items()
    }
    assert {item_id: (row.hard, round(row.soft, 2)) for item_id, row in rows.items()} == {
        NOVEL: (1.0, 1.0),
        RIVER: (0.0, 0.67),
        ELEMENT: (1.0, 1.0),
    }
    assert rows[RIVER].trajectory[-1]["type"] == "evaluation"
    assert "Expected: ['Prague', 'Praha']" in rows[RIVER].trajectory[-1]["content"]


def test_self_check_turns_keep_the_scripted_answer_and_stop_when_it_repeats(tmp_path):
    config = fixture_config("benchmark.max_turns=3")
    row = run_item(plugin, fixture_items(tmp_path)[NOVEL], "", config, target=ScriptedTarget(), judge=None)
    assert (row.n_turns, row.hard) == (2, 1.0)
    assert plugin.extract_answer("<answer>The Sun Also Rises.</answer>") == "sun also rises"
    assert plugin.extract_answer("Sun Also Rises") is None


def test_a_target_that_always_raises_is_an_infrastructure_error(tmp_path):
    failing = ScriptedTarget(rules=[{"stage": "rollout", "error": "ServerError"}])
    rows = []
    for item in fixture_items(tmp_path).values():
        with pytest.raises(ServerError) as caught:
            run_item(plugin, item, "", fixture_config(), target=failing, judge=None)
        rows.append(error_row(item, caught.value))
    with pytest.raises(RolloutInfrastructureError, match="none of 3 items got a model answer"):
        check_infrastructure(rows, role_label="scripted/scripted")
