"""The ``babyvision`` benchmark: raw shapes, drops, \\boxed{} answers,
the exact short-circuit and the judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skillopt.benchmarks.babyvision import (
    BabyVisionConfig,
    normalise_row,
    parse_options,
    plugin,
    read_meta,
    resolve_correct,
)
from skillopt.benchmarks.base import BenchmarkSetupError
from skillopt.core.data import DropRow, Item
from tests.fakes.benchmark_target import FIXTURES_ROOT, fixture_config_of, items_by_id, scripted_judge_of

FIXTURES = FIXTURES_ROOT / "babyvision"
CORRECT = [{"stage": "judge", "json": {"verdict": "correct", "reason": "same meaning"}}]


def items(tmp_path: Path) -> dict[str, Item]:
    return items_by_id(plugin, fixture_config_of(plugin), tmp_path)


def never(item, prediction):
    raise AssertionError("the judge must not be called")


def test_fixture_rows_normalise_choice_index_label_and_blank_answers(tmp_path):
    loaded = items(tmp_path)
    shadow, cubes, maze = loaded["101"], loaded["102"], loaded["103"]
    # 0-based 2
    assert shadow["ans_type"] == "choice" and shadow["correct_choice"] == {"label": "C", "text": "3"}
    assert [c["label"] for c in shadow["choices"]] == ["A", "B", "C", "D"]
    assert (
        cubes["ans_type"] == "blank" and cubes["blank_answers"] == ["7"] and cubes["correct_choice"] is None
    )
    assert maze["correct_choice"] == {"label": "B", "text": "B"}
    assert (shadow.task_type, shadow["type"], shadow["cot"]) == (
        "Find the shadow",
        "Fine-grained Discrimination",
        "Compare outlines.",
    )
    assert shadow["image_path"] == str((FIXTURES / "images" / "101.png").resolve())
    assert plugin.task_types(list(loaded.values())) == ["Count 3D blocks", "Find the shadow", "Maze"]
    assert all(normalise_row(item, roots=[FIXTURES]) == item for item in loaded.values())  # idempotent


@pytest.mark.parametrize(
    ("options", "answer", "label"),
    [
        (["x", "y", "z"], 0, "A"),  # an in-range int is 0-based
        (["x", "y", "z"], 3, "C"),  # out of range: 1-based
        (["x", "y", "z"], 7, None),
        (["x", "y", "z"], "b", "B"),  # a label, any case
        (["x", "y", "z"], "(C)", "C"),
        (["red", "blue"], "Blue", "B"),  # option text
        ({"A": "cat", "B": "dog"}, {"label": "b", "text": "dog"}, "B"),
        ([{"label": "P", "text": "up"}, {"content": "down"}], "down", "B"),
        (["x", "y"], "maybe", None),
    ],
)
def test_choice_answers_resolve_from_every_raw_shape(options, answer, label):
    correct = resolve_correct(answer, parse_options(options))
    assert (correct["label"] if correct else None) == label


def test_rows_without_image_or_resolvable_answer_are_dropped(tmp_path):
    image = FIXTURES / "images" / "101.png"
    base = {"taskId": 9, "question": "Q?", "image": str(image)}
    with pytest.raises(DropRow, match="missing image"):
        normalise_row({**base, "image": "nowhere.png", "blankAns": "1"}, roots=[FIXTURES])
    with pytest.raises(DropRow, match="choice row"):
        normalise_row({**base, "ansType": "choice", "options": ["a"], "choiceAns": "Z"}, roots=[FIXTURES])
    with pytest.raises(DropRow, match="blank row"):
        normalise_row({**base, "ansType": "open", "blankAns": []}, roots=[FIXTURES])
    # The answer type is inferred when absent.
    assert (
        normalise_row({**base, "options": ["a", "b"], "choiceAns": 1}, roots=[FIXTURES])["ans_type"]
        == "choice"
    )
    assert normalise_row({**base, "blankAns": ["one", "1"]}, roots=[FIXTURES])["blank_answers"] == [
        "one",
        "1",
    ]


def test_the_prompt_lists_choices_asks_for_a_box_and_ends_with_the_image(tmp_path):
    _, user = plugin.build_messages(items(tmp_path)["101"], "", fixture_config_of(plugin))
    text = user.content[0].text
    assert "## Choices\nA. 1\nB. 2\nC. 3\nD. 4" in text and "\\boxed{" in text
    assert user.content[-1].type == "image"
    _, blank = plugin.build_messages(items(tmp_path)["102"], "", fixture_config_of(plugin))
    assert "## Choices" not in blank.text()


def test_spec_checks_exact_answers_skip_the_judge(tmp_path):
    loaded = items(tmp_path)
    shadow = plugin.score(loaded["101"], "It is the third.\n\\boxed{C}", never)
    assert (shadow.hard, shadow.extras["evaluation_mode"], shadow.extras["correct_label"]) == (
        1.0,
        "exact",
        "C",
    )
    assert plugin.score(loaded["101"], "\\boxed{(c)}", never).hard == 1.0
    cubes = plugin.score(loaded["102"], "\\boxed{7}", never)
    assert (cubes.hard, cubes.extras["string_f1"]) == (1.0, 1.0)
    none = plugin.score(loaded["102"], "There are seven.", never)
    assert (none.hard, none.fail_reason) == (0.0, "no-answer: no \\boxed{} found")


def test_inexact_answers_go_to_the_judge_default_scripted_judge_says_incorrect_a_rule_says_correct(tmp_path):
    cubes = items(tmp_path)["102"]
    calls: list = []
    wrong = plugin.score(cubes, "\\boxed{seven}", scripted_judge_of(plugin, calls=calls))
    assert (wrong.hard, wrong.soft, wrong.extras["evaluation_mode"]) == (0.0, 0.0, "judge")
    assert wrong.fail_reason.startswith("wrong: judged incorrect: boxed 'seven'") and calls == [
        ("102", "seven")
    ]
    right = plugin.score(cubes, "\\boxed{seven}", scripted_judge_of(plugin, rules=CORRECT))
    assert (right.hard, right.extras["judge_reason"]) == (1.0, "same meaning")


def test_nested_braces_in_the_box_are_kept_and_the_last_box_wins(tmp_path):
    loaded = items(tmp_path)
    calls: list = []
    result = plugin.score(
        loaded["102"], "\\boxed{3} then \\boxed{\\text{7}}", scripted_judge_of(plugin, calls=calls)
    )
    assert result.predicted_answer == "\\text{7}" and calls == [("102", "\\text{7}")]
    assert plugin.score(loaded["101"], "\\boxed{A} no, \\boxed{C}", never).hard == 1.0
    assert plugin.score(loaded["101"], "\\boxed{C", never).fail_reason.startswith("no-answer")  # unbalanced


def test_the_judge_request_is_stage_judge_with_ground_truth_and_grading_tags(tmp_path):
    request = plugin.judge_request(items(tmp_path)["101"], "B")
    assert request.stage == "judge"
    assert request.tags["prediction"] == "B" and request.tags["gold_answers"] == ["C", "3"]
    body = request.messages[1].text()
    assert "## Ground truth\nC. 3" in body and "## Choices\nA. 1" in body and "## Extracted answer\nB" in body
    assert '"verdict"' in request.messages[0].text()


def test_without_a_judge_an_inexact_answer_is_a_setup_error_never_a_zero(tmp_path):
    with pytest.raises(BenchmarkSetupError, match="needs the judge role"):
        plugin.score(items(tmp_path)["102"], "\\boxed{seven}", None)
    assert plugin.needs_judge(fixture_config_of(plugin)) is True


def test_ratio_mode_reads_meta_data_jsonl_with_images_beside_it(tmp_path):
    out = tmp_path / "splits"
    config = BabyVisionConfig(split_mode="ratio", data_path=str(FIXTURES / "raw"), split_ratio="1:1:1",
                              split_output_dir=str(out))
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [len(rows) for rows in loaded.values()] == [1, 1, 1]
    paths = {i.id: i["image_path"] for rows in loaded.values() for i in rows}
    assert paths["103"] == str((FIXTURES / "raw" / "images" / "103.png").resolve())
    # Read back as split_dir: the images stay in the source folder, which must be a data root.
    again = BabyVisionConfig(split_mode="split_dir", split_dir=str(out), data_root=str(FIXTURES / "raw"))
    for split, rows in loaded.items():
        assert plugin.load_split(again, split, run_dir=tmp_path) == rows
    manifest = json.loads((out / "split_manifest.json").read_text(encoding="utf-8"))
    assert manifest["dropped"] == {}


def test_a_missing_data_path_fails_preflight_with_the_download_hint(tmp_path):
    with pytest.raises(BenchmarkSetupError, match="download_babyvision"):
        plugin.preflight(BabyVisionConfig(split_mode="ratio", data_path=str(tmp_path / "none")))


def test_task_id_is_preferred_over_id(tmp_path):
    image = FIXTURES / "images" / "101.png"
    row = {"taskId": 501, "id": "internal-7", "question": "Q?", "image": str(image), "blankAns": "1"}
    assert normalise_row(row, roots=[FIXTURES])["id"] == 501
    assert normalise_row({**row, "taskId": None}, roots=[FIXTURES])["id"] == "internal-7"


def test_rows_without_task_id_take_their_position_in_the_file_as_id(tmp_path):
    """The id is ``taskId``, else ``id``, else the row's index + 1."""
    image = FIXTURES / "images" / "101.png"
    rows = [{"question": "Q1?", "image": str(image), "blankAns": "1"},
            {"taskId": 77, "question": "Q2?", "image": str(image), "blankAns": "2"},
            {"question": "Q3?", "image": str(image), "blankAns": "3"}]
    meta = tmp_path / "meta_data.jsonl"
    meta.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    items = [normalise_row(row, roots=[FIXTURES]) for row in read_meta(tmp_path)]
    assert [item["id"] for item in items] == [1, 77, 3]
    assert all(not key.startswith("_") for item in items for key in item)
