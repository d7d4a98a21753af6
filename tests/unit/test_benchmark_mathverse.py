"""The ``mathverse`` benchmark: version filter, choices, label and
free-form scoring, the judge only for inexact free-form answers, the Text Dominant reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skillopt.benchmarks.base import BenchmarkSetupError
from skillopt.benchmarks.mathverse import (
    MathVerseConfig,
    choice_of,
    extract,
    normalise_free_form,
    plugin,
    split_choices,
)
from skillopt.core.data import Item
from tests.fakes.benchmark_target import FIXTURES_ROOT, fixture_config_of, items_by_id, scripted_judge_of

FIXTURES = FIXTURES_ROOT / "mathverse"


def items(tmp_path: Path, *overrides: str) -> dict[str, Item]:
    return items_by_id(plugin, fixture_config_of(plugin, list(overrides)), tmp_path)


def never(item, prediction):
    raise AssertionError("the judge must not be called")


def test_text_dominant_rows_are_filtered_and_choices_parsed(tmp_path):
    loaded = items(tmp_path)
    assert sorted(loaded) == ["7", "8", "9"]
    angle = loaded["7"]
    assert angle["question_stem"] == "As shown, find angle ABC." and angle["is_choice"] is True
    assert angle["choices"] == [{"label": "A", "text": "40°"}, {"label": "B", "text": "50°"},
                                {"label": "C", "text": "60°"}]
    assert angle["correct_choice"] == {"label": "B", "text": "50°"} and angle.task_type == "Angle"
    assert loaded["8"]["is_choice"] is False and loaded["8"]["gold_answers"] == ["2\\sqrt{3}"]
    assert angle["image_path"] == str((FIXTURES / "images" / "img7.png").resolve())
    assert "text_dominant_question" not in angle


def test_the_text_dominant_reference_is_attached_when_enabled_and_reaches_only_the_evaluation(tmp_path):
    config = fixture_config_of(plugin, ["benchmark.use_text_dominant_reference=true"])
    angle = items_by_id(plugin, config, tmp_path)["7"]
    assert angle["text_dominant_question"].startswith("AB is a diameter of circle O")
    prompt = "\n".join(m.text() for m in plugin.build_messages(angle, "", config))
    assert "diameter" not in prompt
    detail = plugin.score(angle, "<answer>B</answer>", never).detail
    assert "Hidden reference" in detail and "diameter" in detail


@pytest.mark.parametrize(
    ("question", "stem", "labels"),
    [
        ("Find x.\nChoices:\nA:1\nB:2", "Find x.", ["A", "B"]),
        ("Find x.\nchoices:\nA. 1\nB) 2\n(C) 3", "Find x.", ["A", "B", "C"]),
        ("Find x.", "Find x.", []),
    ],
)
def test_choice_lines_in_three_styles(question, stem, labels):
    found_stem, choices = split_choices(question)
    assert found_stem == stem and [c["label"] for c in choices] == labels


@pytest.mark.parametrize(
    ("reply", "label"),
    [("<answer>B: 50°</answer>", "B"), ("<answer>(b)</answer>", "B"), ("\\boxed{C}", "C"), ("A.", "A"),
     ("<answer>BC</answer>", None), ("<answer>50°</answer>", None)],
)
def test_choice_labels_are_read_from_tags_boxes_and_bare_letters(reply, label):
    assert choice_of(extract(reply)) == label


def test_spec_checks_label_and_normalised_free_form_match_without_a_judge(tmp_path):
    loaded = items(tmp_path)
    angle = plugin.score(loaded["7"], "Angle ACB is right.\n<answer>B: 50°</answer>", never)
    assert (angle.hard, angle.extras["correct_label"], angle.extras["evaluation_mode"]) == (1.0, "B", "exact")
    wrong = plugin.score(loaded["7"], "<answer>A</answer>", never)
    assert (wrong.hard, wrong.fail_reason) == (0.0, "wrong: chose A, correct B")
    length = plugin.score(loaded["8"], "<answer>$2\\sqrt{3}$</answer>", never)
    assert (length.hard, length.extras["evaluation_mode"]) == (1.0, "exact")
    assert plugin.score(loaded["8"], "so x = \\boxed{2\\sqrt{3}}", never).hard == 1.0  # the box, no tag
    # Collapsing spaces is not removing them: "2 \\sqrt{3}" differs as a string, so the judge decides.
    calls: list = []
    plugin.score(loaded["8"], "<answer>2 \\sqrt{3}</answer>", scripted_judge_of(plugin, calls=calls))
    assert calls == [("8", "2 \\sqrt{3}")]


def test_an_inexact_free_form_answer_asks_the_judge_which_decides(tmp_path):
    area = items(tmp_path)["9"]
    calls: list = []
    result = plugin.score(area, "<answer>12 square units</answer>", scripted_judge_of(plugin, calls=calls))
    assert (result.hard, result.extras["evaluation_mode"]) == (0.0, "judge") and calls == [
        ("9", "12 square units")
    ]
    rules = [{"stage": "judge", "json": {"verdict": "correct", "reason": "same area"}}]
    assert plugin.score(area, "<answer>12.0</answer>", scripted_judge_of(plugin, rules=rules)).hard == 1.0
    with pytest.raises(BenchmarkSetupError, match="needs the judge role"):
        plugin.score(area, "<answer>twelve</answer>", None)
    request = plugin.judge_request(area, "twelve")
    assert request.stage == "judge" and request.tags["gold_answers"] == ["12"]


def test_free_form_normalisation_drops_latex_noise():
    assert normalise_free_form("$\\mathrm{ 2 }\\,\\sqrt{3}~$") == "2 \\sqrt3"
    assert extract("work\n\nfinal: 7\n") == "final: 7"  # the last non-empty line


def test_ratio_mode_filters_before_splitting_and_warns_on_the_empty_test(tmp_path):
    out = tmp_path / "splits"
    config = MathVerseConfig(split_mode="ratio", data_root=str(FIXTURES / "raw"), split_ratio="1:1:1",
                             split_output_dir=str(out))
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [len(rows) for rows in loaded.values()] == [1, 1, 0]
    manifest = json.loads((out / "split_manifest.json").read_text(encoding="utf-8"))
    assert manifest["dropped"] == {"problem_version": 1} and manifest["source_data_path"].endswith(
        "testmini.json"
    )
    again = MathVerseConfig(split_mode="split_dir", split_dir=str(out), data_root=str(FIXTURES / "raw"))
    for split in ("train", "val"):
        assert plugin.load_split(again, split, run_dir=tmp_path) == loaded[split]


def test_the_default_data_root_missing_fails_preflight(tmp_path):
    with pytest.raises(BenchmarkSetupError, match="testmini.json"):
        plugin.preflight(MathVerseConfig(split_mode="ratio", data_root=str(tmp_path / "MathVerse")))
