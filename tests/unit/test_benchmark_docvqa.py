"""The ``docvqa`` benchmark: loading, image paths and ANLS scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skillopt.benchmarks.base import BenchmarkSetupError
from skillopt.benchmarks.docvqa import DocVQAConfig, anls, levenshtein, normalise_row, plugin
from skillopt.core.data import Item
from tests.fakes.benchmark_target import FIXTURES_ROOT, fixture_config_of, items_by_id

FIXTURES = FIXTURES_ROOT / "docvqa"


def items(tmp_path: Path) -> dict[str, Item]:
    return items_by_id(plugin, fixture_config_of(plugin), tmp_path)


def score(item: Item, reply: str) -> tuple[float, float, str]:
    result = plugin.score(item, reply, None)
    return result.hard, round(result.soft, 2), result.fail_reason


def test_fixture_rows_normalise_with_list_answers_and_absolute_image_paths(tmp_path):
    loaded = items(tmp_path)
    assert sorted(loaded) == ["90001", "90002", "90003"]
    memo = loaded["90001"]
    assert memo["answers"] == ["March 3, 1998", "3/3/98"] and memo["answer"] == "March 3, 1998"
    assert memo["image_path"] == str((FIXTURES / "images" / "q90001_d7001.png").resolve())
    assert (memo.task_type, memo["docId"], memo["ucsf_document_page_no"]) == ("layout", "7001", "2")
    assert loaded["90002"]["answers"] == ["$4.2 million"]
    assert loaded["90003"].task_type == "handwritten|layout"
    assert plugin.task_types(list(loaded.values())) == ["handwritten|layout", "layout", "table/list"]
    assert normalise_row(memo, roots=[FIXTURES]) == memo  # idempotent


def test_the_spec_examples_march_with_a_full_stop_is_soft_only_and_the_short_form_is_exact(tmp_path):
    memo = items(tmp_path)["90001"]
    hard, soft, reason = score(memo, "<answer>March 3, 1998.</answer>")
    assert (hard, soft) == (0.0, 0.93)
    assert reason == "wrong: ANLS=0.93, predicted 'March 3, 1998.', gold ['March 3, 1998', '3/3/98']"
    assert score(memo, "<answer>3/3/98</answer>") == (1.0, 1.0, "")


@pytest.mark.parametrize(
    ("prediction", "golds", "value"),
    [
        ("  MARCH   3, 1998 ", ["March 3, 1998"], 1.0),  # case and spacing do not count
        ("", [""], 1.0),  # two empty strings
        ("abcde", ["abcdf"], 0.8),  # one edit in five
        ("ab", ["abcd"], 0.0),  # NL exactly 0.5 is cut to 0
        ("abc", ["abcdef"], 0.0),  # NL 0.5 reaches the cut-off
        ("abcd", ["abcdef"], 0.6667),  # NL 1/3 keeps its credit
        ("xyz", ["abc", "xyw"], 0.6667),  # the best gold wins
        ("Smith", [], 0.0),
    ],
)
def test_anls_cut_off_and_best_gold(prediction, golds, value):
    assert anls(prediction, golds) == pytest.approx(value, abs=1e-4)


def test_levenshtein_counts_insertions_deletions_and_substitutions():
    assert (levenshtein("kitten", "sitting"), levenshtein("", "abc"), levenshtein("same", "same")) == (
        3,
        3,
        0,
    )


def test_hard_needs_anls_of_at_least_0_999_so_punctuation_counts(tmp_path):
    signer = items(tmp_path)["90003"]
    assert score(signer, "<answer>j. r.  smith</answer>")[0] == 1.0
    assert score(signer, "<answer>J R Smith</answer>")[:2] == (0.0, 0.82)
    # No tag: the last line is the answer.
    assert score(signer, "I read the signature.\nJohn R. Smith")[0] == 1.0
    no_answer = plugin.score(signer, "", None)
    assert (no_answer.hard, no_answer.fail_reason) == (0.0, "no-answer: empty reply")


def test_a_trailing_document_path_in_the_question_supplies_a_missing_image_path(tmp_path):
    row = {"questionId": 5, "question": "What is the title? document_path: images/q90002_d7002.png",
           "answer": "Annual report"}
    item = normalise_row(row, roots=[FIXTURES])
    assert item["question"] == "What is the title?"
    assert item["image_path"] == str((FIXTURES / "images" / "q90002_d7002.png").resolve())
    assert item["answers"] == ["Annual report"] and item["id"] == "5"


def test_relative_images_fall_back_to_the_csv_folder_and_missing_ones_stop_the_load_with_a_count(tmp_path):
    data = tmp_path / "data"
    for split in ("train", "val", "test"):
        (data / split / "pics").mkdir(parents=True)
        (data / split / "pics" / "p.png").write_bytes((FIXTURES / "images" / "q90001_d7001.png").read_bytes())
        (data / split / "q.csv").write_text(
            f"questionId,question,answer,image_path\n{split}1,Q?,A,pics/p.png\n{split}2,Q2?,B,pics/none.png\n",
            encoding="utf-8")
    config = DocVQAConfig(split_mode="split_dir", split_dir=str(data), data_root=str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(
        BenchmarkSetupError, match=r"1 of 2 train items have no image file \(first: item train2"
    ):
        plugin.load_split(config, "train", run_dir=tmp_path)
    for split in ("train", "val", "test"):
        (data / split / "q.csv").write_text(
            f"questionId,question,answer,image_path\n{split}1,Q?,A,pics/p.png\n", encoding="utf-8"
        )
    [item] = plugin.load_split(config, "val", run_dir=tmp_path)
    assert item["image_path"] == str((data / "val" / "pics" / "p.png").resolve())


def test_a_missing_data_root_fails_preflight(tmp_path):
    with pytest.raises(BenchmarkSetupError, match="data_root"):
        plugin.preflight(DocVQAConfig(split_dir=str(FIXTURES), data_root=str(tmp_path / "nope")))


def test_ratio_output_round_trips_through_its_own_reader(tmp_path):
    out = tmp_path / "splits"
    config = DocVQAConfig(split_mode="ratio", data_path=str(FIXTURES / "raw" / "q.csv"), split_ratio="1:1:1",
                          split_output_dir=str(out), data_root=str(FIXTURES))
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [len(rows) for rows in loaded.values()] == [1, 1, 1]
    again = DocVQAConfig(split_mode="split_dir", split_dir=str(out))
    for split, rows in loaded.items():
        assert json.loads((out / split / "items.json").read_text(encoding="utf-8"))[0]["id"] == rows[0].id
        assert plugin.load_split(again, split, run_dir=tmp_path) == rows
    assert {i.id: i for rows in loaded.values() for i in rows} == items(tmp_path / "fixture")


def test_self_check_turns_use_the_smaller_cap_and_stop_on_a_repeated_answer(tmp_path):
    from skillopt.benchmarks.runner import run_item
    from tests.fakes.benchmark_target import PluginScriptedTarget

    config = fixture_config_of(plugin, ["benchmark.max_turns=3"])
    target = PluginScriptedTarget(plugin)
    row = run_item(plugin, items(tmp_path)["90002"], "", config, target=target, judge=None)
    assert [request.max_tokens for request in target.requests] == [768, 512]  # the answer repeated on turn 2
    assert row.n_turns == 2 and row.hard == 1.0
    assert all(request.messages[1].images() for request in target.requests)  # the image is re-sent each turn
