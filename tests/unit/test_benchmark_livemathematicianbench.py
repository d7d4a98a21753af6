"""The ``livemathematicianbench`` benchmark.

Items come from tests/fixtures/livemathematicianbench (split_dir form, raw rows) or its raw
monthly copy (ratio form); the target is the real ``scripted`` backend answering from the
plug-in's own ``scripted_rules``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from skillopt.benchmarks.answers import choice_label, clean_label, resolve_choice, tag_or_last_line
from skillopt.benchmarks.base import (
    Benchmark,
    BenchmarkSetupError,
    RolloutInfrastructureError,
    benchmark_config,
    load_benchmark,
)
from skillopt.benchmarks.livemathematicianbench import (
    HIDDEN_REFERENCE_CHARS,
    LiveMathematicianBenchConfig,
    normalise_row,
    plugin,
    shuffled_view,
)
from skillopt.benchmarks.runner import check_infrastructure, error_row, run_item
from skillopt.core.config import load_config
from skillopt.core.data import DropRow, Item
from skillopt.llm.errors import ServerError
from tests.fakes.benchmark_target import PluginScriptedTarget, fixture_config_of, items_by_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "livemathematicianbench"
RAW_FILE = FIXTURES / "raw" / "data" / "202601" / "qa_202601_final.json"
GROUP, EXISTENCE, EQUIVALENCE = "202601-1", "202601-2", "202601-3"
SPLITS = ("train", "val", "test")


def fixture_config(*overrides: str) -> LiveMathematicianBenchConfig:
    """The config a user gets from ``skillopt train livemathematicianbench --data <fixtures> -o ...``."""
    config = fixture_config_of(plugin, overrides)
    assert isinstance(config, LiveMathematicianBenchConfig)
    return config


def fixture_items(tmp_path: Path, *overrides: str) -> dict[str, Item]:
    config = fixture_config(*overrides)
    return items_by_id(plugin, config, tmp_path)


def unshuffled(tmp_path: Path) -> dict[str, Item]:
    return fixture_items(tmp_path, "benchmark.shuffle_choices=false")


def raw_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(RAW_FILE.read_text(encoding="utf-8"))
    return rows


def score(item: Item, reply: str) -> tuple[float, float, str]:
    result = plugin.score(item, reply, None)
    return result.hard, result.soft, result.fail_reason


def texts(item: Item) -> list[str]:
    return [choice["text"] for choice in item["choices"]]


class ScriptedTarget(PluginScriptedTarget):
    """The ``target`` role as the runner uses it: the real scripted backend with this plug-in's rules."""

    def __init__(self, rules: Any = None) -> None:
        super().__init__(plugin, rules)


# ------------------------------------------------------------------------------------ config, loading


def test_registered_and_the_default_config_with_data_loads_and_passes_preflight(tmp_path):
    assert isinstance(load_benchmark("livemathematicianbench"), Benchmark)
    config = fixture_config()
    assert (config.split_mode, config.split_dir, config.data_root) == (
        "split_dir",
        str(FIXTURES),
        str(FIXTURES),
    )
    assert (config.shuffle_choices, config.use_theorem, config.use_sketch) == (True, False, False)
    assert (config.exec_timeout, config.workers, config.max_turns, config.max_tokens) == (300, 64, 1, 16384)
    plugin.preflight(config)
    assert plugin.needs_judge(config) is False
    ids = [[item.id for item in plugin.load_split(config, split, run_dir=tmp_path)] for split in SPLITS]
    assert ids == [[GROUP], [EXISTENCE], [EQUIVALENCE]]


def test_ids_are_month_dash_no_and_keep_the_source_id(tmp_path):
    items = unshuffled(tmp_path)
    assert {item.id: item.source_id for item in items.values()} == {
        GROUP: "202601:1",
        EXISTENCE: "202601:2",
        EQUIVALENCE: "202601:3",
    }
    without_month = normalise_row({k: v for k, v in raw_rows()[0].items() if k != "month"})
    assert without_month["id"] == "1" and without_month["month"] == ""


def test_task_types_are_the_first_theorem_type_tag_and_the_sorted_union(tmp_path):
    items = unshuffled(tmp_path)
    assert {item.id: item.task_type for item in items.values()} == {
        GROUP: "implication",
        EXISTENCE: "existence",
        EQUIVALENCE: "equivalence",
    }
    assert items[EQUIVALENCE]["theorem_type"] == ["equivalence"]  # a bare string becomes a list
    assert plugin.task_types(list(items.values())) == [
        "equivalence",
        "existence",
        "implication",
        "uniqueness",
    ]
    untagged = normalise_row({**raw_rows()[0], "theorem_type": []})
    assert untagged["task_type"] == "math_mcq" and plugin.task_types([Item(untagged)]) == ["math_mcq"]


def test_preflight_without_the_split_folder_says_how_to_fix_it(tmp_path):
    config = benchmark_config(plugin, load_config("livemathematicianbench", env={}).config.benchmark)
    assert config.split_dir == "data/livemathematicianbench_split"
    with pytest.raises(BenchmarkSetupError, match="pass --data DIR"):
        plugin.preflight(config.model_copy(update={"split_dir": str(tmp_path / "missing")}))


def test_an_unknown_split_name_raises(tmp_path):
    with pytest.raises(ValueError, match="unknown split name 'dev'"):
        plugin.load_split(fixture_config(), "dev", run_dir=tmp_path)
    assert [item.id for item in plugin.load_split(fixture_config(), "valid_unseen", run_dir=tmp_path)] == [
        EQUIVALENCE
    ]


def test_all_three_choices_shapes_normalise_to_labelled_options(tmp_path):
    items = unshuffled(tmp_path)
    assert items[GROUP]["choices"] == [
        {"label": "A", "text": "G is cyclic"},
        {"label": "B", "text": "G is abelian"},
        {"label": "C", "text": "G is simple"},
    ]
    assert items[EXISTENCE]["choices"][1] == {"label": "B", "text": "There is some x"}  # list of strings
    assert items[EXISTENCE]["correct_choice"] == {
        "label": "A",
        "text": "There is exactly one x",
    }  # bare label
    assert items[EQUIVALENCE]["choices"][2] == {"label": "C", "text": "Q implies P"}  # dict label -> text
    assert items[EQUIVALENCE]["correct_choice"] == {"label": "B", "text": "P iff Q"}
    content = normalise_row(
        {
            "no": 9,
            "question": "q?",
            "choices": [{"label": "(a)", "content": "x"}, {"label": "b.", "content": "y"}],
            "correct_choice": "b",
        }
    )  # top-level mcq keys, ``content`` for ``text``, labels cleaned like answers
    assert content["choices"] == [{"label": "A", "text": "x"}, {"label": "B", "text": "y"}]
    assert content["correct_choice"] == {"label": "B", "text": "y"}


def test_the_normaliser_is_idempotent_and_keeps_every_normalized_field(tmp_path):
    for item in unshuffled(tmp_path).values():
        again = normalise_row(dict(item))
        assert set(again) == {
            "id",
            "month",
            "no",
            "paper_link",
            "theorem",
            "sketch",
            "theorem_type",
            "question",
            "choices",
            "correct_choice",
            "source_path",
            "task_type",
            "source_id",
        }
        assert {k: v for k, v in again.items() if k != "id"} == {k: v for k, v in item.items() if k != "id"}


def test_a_correct_label_missing_from_the_choices_is_inserted_in_label_order():
    row = {
        "no": 5,
        "mcq": {
            "question": "q?",
            "choices": {"A": "x", "C": "z"},
            "correct_choice": {"label": "B", "text": "y"},
        },
    }
    item = normalise_row(row)
    assert [c["label"] for c in item["choices"]] == ["A", "B", "C"]
    assert item["correct_choice"] == {"label": "B", "text": "y"}
    by_text = normalise_row(
        {"no": 6, "question": "q?", "choices": ["x", "y"], "correct_choice": {"text": "Y"}}
    )
    assert by_text["correct_choice"] == {"label": "B", "text": "y"}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"question": " "}, "no_question"),
        ({"choices": []}, "no_choices"),
        ({"correct_choice": "D"}, "no_correct_label"),  # a bare label that names no option
        ({"correct_choice": {"label": "", "text": "nowhere"}}, "no_correct_label"),
        ({"correct_choice": None}, "no_correct_label"),
    ],
)
def test_rows_without_question_choices_or_a_resolvable_correct_label_are_dropped(change, reason):
    row = raw_rows()[1]
    with pytest.raises(DropRow) as dropped:
        normalise_row({**row, "mcq": {**row["mcq"], **change}})
    assert dropped.value.reason == reason


def test_ratio_output_round_trips_and_counts_drops(tmp_path):
    source = tmp_path / "release"
    shutil.copytree(FIXTURES / "raw", source)
    broken = tmp_path / "release" / "data" / "202602" / "qa_202602_final.json"
    broken.parent.mkdir()
    broken.write_text(
        json.dumps([{"no": 1, "mcq": {"question": "q?", "choices": ["x"], "correct_choice": "Z"}}])
    )
    out = tmp_path / "splits"
    config = LiveMathematicianBenchConfig(
        split_mode="ratio",
        data_path=str(source),
        split_ratio="1:1:1",
        split_output_dir=str(out),
        shuffle_choices=False,
    )
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in SPLITS}
    manifest = json.loads((out / "split_manifest.json").read_text(encoding="utf-8"))
    assert manifest["counts"] == {"train": 1, "val": 1, "test": 1}
    assert manifest["dropped"] == {"no_correct_label": 1}
    again = LiveMathematicianBenchConfig(split_mode="split_dir", split_dir=str(out), shuffle_choices=False)
    for split, rows in loaded.items():
        assert [row["id"] for row in json.loads((out / split / "items.json").read_text())] == manifest["ids"][
            split
        ]
        assert plugin.load_split(again, split, run_dir=tmp_path) == rows
    by_id = {item.id: item for rows in loaded.values() for item in rows}
    assert {item["source_path"] for item in by_id.values()} == {"data/202601/qa_202601_final.json"}
    fixture = unshuffled(tmp_path / "fixture")
    assert {i: {**item, "source_path": ""} for i, item in by_id.items()} == fixture
    shuffled = config.model_copy(update={"shuffle_choices": True})
    assert [c["text"] for c in plugin.load_split(shuffled, "train", run_dir=tmp_path)[0]["choices"]] == texts(
        fixture_items(tmp_path / "fixture2")[loaded["train"][0].id]
    )


def test_ratio_reads_a_single_monthly_file_and_takes_its_month_from_the_name(tmp_path):
    source = tmp_path / "qa_202512_final.json"
    source.write_text(json.dumps([{k: v for k, v in row.items() if k != "month"} for row in raw_rows()]))
    config = LiveMathematicianBenchConfig(
        split_mode="ratio", data_path=str(source), split_ratio="1:1:1", split_output_dir=str(tmp_path / "out")
    )
    ids = sorted(item.id for split in SPLITS for item in plugin.load_split(config, split, run_dir=tmp_path))
    assert ids == ["202512-1", "202512-2", "202512-3"]


# ------------------------------------------------------------------------------------- choice shuffle


def test_shuffling_is_seeded_relabels_and_correct_choice_follows_its_text(tmp_path):
    canonical = unshuffled(tmp_path)
    orders = set()
    for seed in range(12):
        for item in canonical.values():
            view = shuffled_view(item, seed)
            assert view == shuffled_view(item, seed)  # deterministic per (seed, id)
            assert [c["label"] for c in view["choices"]] == ["A", "B", "C"]
            assert sorted(texts(view)) == sorted(texts(item))
            by_label = {c["label"]: c["text"] for c in view["choices"]}
            assert by_label[view["correct_choice"]["label"]] == item["correct_choice"]["text"]
            assert view["correct_choice"]["text"] == item["correct_choice"]["text"]
            orders.add((item.id, tuple(texts(view))))
    assert len(orders) > 3 * 2  # positions really move between seeds
    assert canonical == unshuffled(tmp_path)  # views are copies; the loaded item is untouched
    group = canonical[GROUP]
    assert shuffled_view(group, 7)["choices"] is not group["choices"]


def test_train_batches_reshuffle_with_the_batch_seed_and_evaluation_views_stay_stable(tmp_path):
    """Train batches show the choices shuffled with the batch seed, so positions move between epochs
    (each epoch's batches have their own seeds); evaluation views keep the load order, so every
    candidate skill sees the same options; the text answer still scores right in every view."""
    config = fixture_config()
    loaded = fixture_items(tmp_path)
    orders = set()
    for seed in range(8):
        for item in loaded.values():
            view = plugin.batch_view(item, config, seed=seed, training=True)
            assert view == plugin.batch_view(item, config, seed=seed, training=True)
            assert plugin.batch_view(item, config, seed=seed, training=False) is item
            orders.add((item.id, tuple(texts(view))))
            reply = f"<answer>{view['correct_choice']['text']}</answer>"
            assert plugin.score(view, reply, None).hard == 1.0
            _, user_message = plugin.build_messages(view, "", config)
            assert (
                f"{view['correct_choice']['label']}. {view['correct_choice']['text']}" in user_message.text()
            )
    assert len(orders) > 3 * 2  # positions move between batch seeds
    fixed = fixture_config("benchmark.shuffle_choices=false")
    item = unshuffled(tmp_path / "fixed")[GROUP]
    assert plugin.batch_view(item, fixed, seed=3, training=True) is item


def test_loaded_items_are_shuffled_with_the_split_seed_and_stable_across_loads(tmp_path):
    shuffled, canonical = fixture_items(tmp_path), unshuffled(tmp_path)
    assert shuffled == fixture_items(tmp_path)
    assert shuffled == {i: shuffled_view(item, 42) for i, item in canonical.items()}
    reseeded = fixture_items(tmp_path, "benchmark.split_seed=7")
    assert reseeded == {i: shuffled_view(item, 7) for i, item in canonical.items()}


def test_the_correct_text_scores_under_any_shuffle_and_the_old_label_need_not(tmp_path):
    group = unshuffled(tmp_path)[GROUP]
    for seed in range(8):
        view = shuffled_view(group, seed)
        label = view["correct_choice"]["label"]
        assert score(view, f"<answer>{label}</answer>")[0] == 1.0
        assert score(view, "<answer>G is abelian</answer>")[0] == 1.0
        assert score(view, "<answer>B</answer>")[0] == float(label == "B")


# -------------------------------------------------------------------------------------------- prompts


def test_prompt_has_solver_intro_skill_slot_label_format_then_question_and_choices(tmp_path):
    item = unshuffled(tmp_path)[GROUP]
    system, user = plugin.build_messages(item, "  Compare every option.  ", fixture_config())
    assert "quantifiers" in system.text() and "equality cases" in system.text()
    assert "## Skill\nCompare every option.\n\n" in system.text() and "<answer>…</answer>" in system.text()
    assert user.text() == (
        "## Question\nLet |G| = p^2. Which statement is proved?\n\n"
        "## Choices\nA. G is cyclic\nB. G is abelian\nC. G is simple"
    )
    assert "## Skill" not in plugin.build_messages(item, " \n", fixture_config())[0].text()


def test_theorem_and_sketch_are_shown_only_when_enabled(tmp_path):
    item = unshuffled(tmp_path)[GROUP]
    default = plugin.build_messages(item, "", fixture_config())[1].text()
    assert "Every group of order p^2" not in default and "Class equation" not in default
    shown = plugin.build_messages(
        item, "", fixture_config("benchmark.use_theorem=true", "benchmark.use_sketch=true")
    )[1].text()
    assert shown.endswith(
        "## Theorem\nEvery group of order p^2 is abelian.\n\n## Proof Sketch\nClass equation."
    )


def test_no_prompt_reads_or_contains_a_gold_value(tmp_path):
    sentinel = "GOLD-SENTINEL-8841"
    config = fixture_config()
    for item in fixture_items(tmp_path).values():
        baseline = [m.text() for m in plugin.build_messages(item, "skill", config)]
        without_gold = Item({k: v for k, v in item.items() if k not in plugin.GOLD_FIELDS})
        assert [m.text() for m in plugin.build_messages(without_gold, "skill", config)] == baseline
        marked = Item({**item, **{field: sentinel for field in plugin.GOLD_FIELDS}})
        assert not any(sentinel in m.text() for m in plugin.build_messages(marked, "skill", config))
        assert item["theorem"] not in "".join(baseline) or item["theorem"] == "…"


# -------------------------------------------------------------------------------------------- scoring


def test_a_parenthesised_label_with_a_trailing_dot_is_correct_without_shuffling(tmp_path):
    assert score(unshuffled(tmp_path)[GROUP], "<answer>(B).</answer>") == (1.0, 1.0, "")


@pytest.mark.parametrize(
    "answer",
    [
        "B",
        "b",
        " B ",
        "(B)",
        "B)",
        "B:",
        "B.",
        "(b).",
        "G is abelian",
        "g IS  Abelian",
        "B because p^2",
        "(B) G is abelian",
    ],
)
def test_label_variants_option_text_and_a_leading_label_all_name_option_b(tmp_path, answer):
    result = plugin.score(unshuffled(tmp_path)[GROUP], f"Reasoning.\n<answer>{answer}</answer>", None)
    assert (result.hard, result.soft, result.predicted_answer) == (1.0, 1.0, "B")
    assert result.extras == {"predicted_label": "B", "correct_label": "B"}


def test_a_wrong_label_says_what_was_chosen_and_what_was_correct(tmp_path):
    result = plugin.score(unshuffled(tmp_path)[GROUP], "<answer>A</answer>", None)
    assert (result.hard, result.soft, result.fail_reason) == (0.0, 0.0, "wrong: chose A, correct B")
    assert result.expected == "B. G is abelian"
    assert result.detail.startswith("chose A. G is cyclic; correct B. G is abelian")
    assert result.extras == {"predicted_label": "A", "correct_label": "B"}


def test_an_answer_naming_no_option_is_a_no_answer_row(tmp_path):
    group = unshuffled(tmp_path)[GROUP]
    hard, soft, fail = score(group, "<answer>D</answer>")
    assert (hard, soft) == (0.0, 0.0) and fail == "no-answer: 'D' names no option (A, B, C)"
    assert score(group, "<answer>G is nilpotent</answer>")[2].startswith("no-answer: 'G is nilpotent'")
    assert score(group, "") == (0.0, 0.0, "no-answer: empty reply")
    assert plugin.score(group, "<answer>D</answer>", None).extras["predicted_label"] == ""


def test_the_last_tag_wins_and_without_a_tag_the_last_line_is_read(tmp_path):
    group = unshuffled(tmp_path)[GROUP]
    assert score(group, "<answer>A</answer> wait, no: <ANSWER>B</ANSWER>")[0] == 1.0
    assert score(group, "<answer>B</answer> hmm <answer>C</answer>")[2] == "wrong: chose C, correct B"
    assert score(group, "It must be abelian.\n\nB\n")[0] == 1.0
    assert score(group, "  (B)  ")[0] == 1.0


def test_the_evaluation_detail_carries_the_hidden_reference_capped(tmp_path):
    group = unshuffled(tmp_path)[GROUP]
    detail = plugin.score(group, "<answer>A</answer>", None).detail
    assert "Hidden reference" in detail and "Theorem: Every group of order p^2 is abelian." in detail
    long = Item({**group, "sketch": "step " * 2000})
    reference = plugin.score(long, "<answer>A</answer>", None).detail.split("\n", 1)[1]
    assert len(reference) == HIDDEN_REFERENCE_CHARS and reference.endswith("...")


def test_shared_label_readers():
    assert [choice_label(i) for i in (0, 1, 25, 26, 27)] == ["A", "B", "Z", "AA", "AB"]
    assert clean_label(" (c): ") == "C" and clean_label("B).") == "B"
    options = {"A": "x > 0", "B": "x >= 0"}
    assert resolve_choice("X >= 0", options) == "B"
    assert resolve_choice("a since x > 0", options) == "A"  # the first token
    assert resolve_choice("A, since", options) is None  # a comma is not stripped from a label
    assert resolve_choice("neither", options) is None and resolve_choice("", options) is None
    assert tag_or_last_line("a\n<answer> b </answer>\nc") == "b"
    assert tag_or_last_line("a\n c \n\n") == "c" and tag_or_last_line("   ") == ""


# ------------------------------------------------------------------------------- runner and scripted


@pytest.mark.parametrize("shuffle", ["true", "false"])
def test_scripted_rules_solve_group_and_equivalence_and_miss_existence(tmp_path, shuffle):
    config = fixture_config(f"benchmark.shuffle_choices={shuffle}")
    items = fixture_items(tmp_path, f"benchmark.shuffle_choices={shuffle}")
    rows = {
        i: run_item(plugin, item, "", config, target=ScriptedTarget(), judge=None)
        for i, item in items.items()
    }
    assert {i: row.hard for i, row in rows.items()} == {GROUP: 1.0, EXISTENCE: 0.0, EQUIVALENCE: 1.0}
    missed = rows[EXISTENCE]
    correct = items[EXISTENCE]["correct_choice"]["label"]
    assert missed.fail_reason.startswith("wrong: chose ") and missed.fail_reason.endswith(
        f"correct {correct}"
    )
    assert missed.trajectory[-1]["type"] == "evaluation"
    assert f"Expected: {correct}. There is exactly one x" in missed.trajectory[-1]["content"]
    assert all(row.task_type == items[i].task_type for i, row in rows.items())


def test_self_check_turns_stop_when_the_label_repeats(tmp_path):
    config = fixture_config("benchmark.max_turns=3")
    row = run_item(plugin, fixture_items(tmp_path)[GROUP], "", config, target=ScriptedTarget(), judge=None)
    assert (row.n_turns, row.hard) == (2, 1.0)
    assert plugin.extract_answer("<answer> (b). </answer>") == "B"
    assert plugin.extract_answer("B") is None


def test_a_target_that_always_raises_is_an_infrastructure_error(tmp_path):
    failing = ScriptedTarget(rules=[{"stage": "rollout", "error": "ServerError"}])
    rows = []
    for item in fixture_items(tmp_path).values():
        with pytest.raises(ServerError) as caught:
            run_item(plugin, item, "", fixture_config(), target=failing, judge=None)
        rows.append(error_row(item, caught.value))
    with pytest.raises(RolloutInfrastructureError, match="none of 3 items got a model answer"):
        check_infrastructure(rows, role_label="scripted/scripted")


def test_the_seed_skill_names_the_answer_format_the_evaluator_reads():
    seed = (plugin.prompts_dir / "initial_skill.md").read_text(encoding="utf-8")
    assert "<answer>" in seed and "\\boxed" not in seed
    for name in ("analyst_error.md", "analyst_success.md"):
        assert (plugin.prompts_dir / name).read_text(encoding="utf-8").strip()
    error_guide = (plugin.prompts_dir / "analyst_error.md").read_text(encoding="utf-8")
    for failure in ("quantifier_miss", "strength_mismatch", "condition_miss", "option_confusion", "other"):
        assert f"`{failure}`" in error_guide
