"""The ``mmrb`` benchmark: ids, interleaved images, extraction order,
label / option-text / containment scoring, ratio mode over ``*_human.json`` folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from skillopt.benchmarks.base import UNTAGGED_NOTE
from skillopt.benchmarks.mmrb import MMRBConfig, extract, normalise_row, open_match, plugin
from skillopt.benchmarks.runner import run_item
from skillopt.core.data import DropRow, Item
from skillopt.llm.chat import ImagePart, TextPart
from tests.fakes.benchmark_target import FIXTURES_ROOT, PluginScriptedTarget, fixture_config_of, items_by_id

FIXTURES = FIXTURES_ROOT / "mmrb"
KITE, CLOCK, APPLES = "MMRB-Spot_the_Similarity-0", "MMRB-Spot_the_Similarity-1", "MMRB-Spot_the_Similarity-2"


def items(tmp_path: Path) -> dict[str, Item]:
    return items_by_id(plugin, fixture_config_of(plugin), tmp_path)


def hard(item: Item, reply: str) -> float:
    return plugin.score(item, reply, None).hard


def test_ids_come_from_source_subtask_and_index_and_images_resolve(tmp_path):
    loaded = items(tmp_path)
    assert sorted(loaded) == [KITE, CLOCK, APPLES]
    kite = loaded[KITE]
    assert kite["source_id"] == "MMRB:Spot_the_Similarity:0" and kite["is_choice"] is True
    assert kite["image_paths"] == [str((FIXTURES / "images" / n).resolve()) for n in ("s0_1.png", "s0_2.png")]
    assert loaded[APPLES]["is_choice"] is False and kite.task_type == "Spot_the_Similarity"
    # idempotent before the loader's safe_id
    assert normalise_row(kite, roots=[FIXTURES])["id"] == "MMRB:Spot_the_Similarity:0"


def test_images_are_interleaved_in_placeholder_order_with_their_positions(tmp_path):
    clock = items(tmp_path)[CLOCK]
    _, user = plugin.build_messages(clock, "", fixture_config_of(plugin))
    kinds = [type(part).__name__ for part in user.content]
    assert kinds == [
        "TextPart",
        "ImagePart",
        "TextPart",
        "ImagePart",
        "TextPart",
        "ImagePart",
        "TextPart",
        "TextPart",
    ]
    assert [Path(str(p.source)).name for p in user.images()] == ["s1_1.png", "s1_2.png", "s1_3.png"]
    assert user.content[0].text.endswith("[Image #1]") and user.content[2].text.strip() == "[Image #2]"
    assert "## Options\n(A) Image 1\n(B) Image 2\n(C) Image 3" in user.content[-1].text
    assert "In which image is the clock hand furthest along?" in user.content[-2].text


def test_out_of_range_references_become_text_and_unreferenced_images_are_appended(tmp_path):
    row = {
        "index": 5,
        "question": "Compare {image#2} with {image#3}.",
        "answer": "yes",
        "source": "S",
        "subtask": "T",
        "image_paths": [str(FIXTURES / "images" / "s0_1.png"), str(FIXTURES / "images" / "s0_2.png")],
    }
    item = Item(normalise_row(row, roots=[FIXTURES]))
    _, user = plugin.build_messages(item, "", MMRBConfig())
    texts = [p.text for p in user.content if isinstance(p, TextPart)]
    assert "[Image #3 unavailable]" in " ".join(texts) and "[Additional Image #1]" in texts
    images = [Path(str(p.source)).name for p in user.content if isinstance(p, ImagePart)]
    assert images == ["s0_2.png", "s0_1.png"]  # #2 inline, then the unreferenced #1


def test_missing_images_are_removed_and_a_row_with_none_is_dropped(tmp_path):
    row = {"index": 1, "question": "Q {image#1}", "answer": "A", "source": "S", "subtask": "T",
           "image_paths": ["images/gone.png", "images/s0_1.png"]}
    item = normalise_row(row, roots=[FIXTURES])
    assert [Path(p).name for p in item["image_paths"]] == ["s0_1.png"]
    with pytest.raises(DropRow, match="no image"):
        normalise_row({**row, "image_paths": ["images/gone.png"]}, roots=[FIXTURES])


def test_spec_checks_label_option_text_and_containment(tmp_path):
    loaded = items(tmp_path)
    assert hard(loaded[KITE], "<answer>b</answer>") == 1.0
    assert hard(loaded[KITE], "<answer>a blue kite</answer>") == 1.0
    assert hard(loaded[KITE], "<answer>(B)</answer>") == 1.0
    assert hard(loaded[KITE], "<answer>a blue</answer>") == 0.0  # part of the option text is no match
    assert hard(loaded[APPLES], "The answer is 5 apples") == 1.0
    assert hard(loaded[APPLES], "<answer>15 apples</answer>") == 0.0  # containment is by whole words
    empty = plugin.score(loaded[APPLES], "<answer></answer>", None)
    assert (empty.hard, empty.fail_reason) == (0.0, "no-answer: empty reply")


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("x <answer>C</answer> Answer[B]", "C"),  # the tag first
        ("Answer[ A ] then Answer[B]", "B"),  # the last Answer[...]
        ("so \\boxed{D}", "D"),
        (" (c). ", "C"),  # a bare letter
        ("Looking closely, the final answer is 3 cats", "3 cats"),
        ("Answer: two", "two"),
        ("just words", "just words"),
    ],
)
def test_extraction_order(reply, answer):
    assert extract(reply) == answer


def test_open_matching_is_equality_or_word_containment_either_way():
    assert open_match("Five.", "five") and open_match("5", "5 apples") and open_match("5 apples!", "5")
    assert not open_match("", "5") and not open_match("15", "5")


def test_the_fake_target_answers_through_the_chat_path_and_rows_are_answered(tmp_path):
    config = fixture_config_of(plugin)
    target = PluginScriptedTarget(plugin)
    row = run_item(plugin, items(tmp_path)[APPLES], "", config, target=target, judge=None)
    assert row.answered and row.hard == 1.0
    assert [Path(str(p.source)).name for p in target.requests[0].messages[1].images()] == [
        "s2_1.png",
        "s2_2.png",
    ]


def test_ratio_mode_searches_folders_for_human_json_and_round_trips(tmp_path):
    out = tmp_path / "splits"
    config = MMRBConfig(split_mode="ratio", data_path=str(FIXTURES / "raw"), split_ratio="1:1:1",
                        split_output_dir=str(out))
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert sorted(i.id for rows in loaded.values() for i in rows) == [KITE, CLOCK, APPLES]
    raw_images = FIXTURES / "raw" / "Spot_the_Similarity" / "images"
    assert all(Path(p).parent == raw_images.resolve() for rows in loaded.values() for i in rows
               for p in i["image_paths"])
    # Read back as split_dir: the images stay in the source folder, which must be a data root.
    again = MMRBConfig(split_mode="split_dir", split_dir=str(out), data_root=str(FIXTURES / "raw"))
    for split, rows in loaded.items():
        assert plugin.load_split(again, split, run_dir=tmp_path) == rows


def test_reasoning_paths_reach_only_the_evaluation_as_a_hidden_reference(tmp_path):
    kite = items(tmp_path)[KITE]
    detail = plugin.score(kite, "<answer>A</answer>", None).detail
    assert "Hidden reference (analyst only; annotated reasoning paths" in detail
    assert "path 1 step 1 [Perception]: Both show a blue kite." in detail
    untagged = plugin.score(items(tmp_path)[APPLES], "5", None)  # no reasoning paths, no tag
    assert untagged.detail.splitlines() == ["normalised equality or containment", UNTAGGED_NOTE]
    assert untagged.extras["format"] == "untagged"
