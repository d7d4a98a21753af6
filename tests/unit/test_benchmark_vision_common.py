"""What every image benchmark (docvqa, babyvision, mathverse, mmrb) must do.

Each runs from its fixture folder with only ``--data`` and the scripted backend; its prompts carry
the item's images as ``ImagePart``s (recorded as ``[image] <name>``, never bytes) and never a gold
value; an unknown split raises; a target that always fails is an infrastructure error; at least one
fixture item is solved and one missed by the plug-in's scripted rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skillopt.benchmarks.base import Benchmark, RolloutInfrastructureError, load_benchmark
from skillopt.benchmarks.runner import check_infrastructure, error_row, run_item
from skillopt.llm.chat import ImagePart
from skillopt.llm.errors import ServerError
from skillopt.llm.scripted import parse_rules
from tests.fakes.benchmark_target import (
    PluginScriptedTarget,
    fixture_config_of,
    fixture_rules,
    items_by_id,
    scripted_judge_of,
)

IMAGE_BENCHMARKS = ["docvqa", "babyvision", "mathverse", "mmrb"]


def _gold_strings(value) -> list[str]:
    """Every string leaf of a gold field (long enough to be a meaningful leak)."""
    if isinstance(value, str):
        return [value] if len(value.strip()) >= 3 else []
    if isinstance(value, dict):
        return [s for v in value.values() for s in _gold_strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _gold_strings(v)]
    return []


@pytest.fixture(params=IMAGE_BENCHMARKS)
def bench(request):
    return load_benchmark(request.param)


def test_registered_loads_with_only_data_and_passes_preflight(bench, tmp_path):
    assert isinstance(bench, Benchmark) and bench.uses_images is True and bench.extras == ()
    config = fixture_config_of(bench)
    assert config.split_mode == "split_dir" and config.image_detail == "auto"
    bench.preflight(config)
    items = items_by_id(bench, config, tmp_path)
    assert len(items) >= 3  # one per split at least (babyvision's has more: something to learn)
    for item in items.values():
        images = item.get("image_paths") or [item["image_path"]]
        assert all(Path(p).is_absolute() and Path(p).is_file() for p in images)


def test_the_user_message_carries_the_images_and_the_trajectory_only_their_names(bench, tmp_path):
    config = fixture_config_of(bench)
    for item in items_by_id(bench, config, tmp_path).values():
        system, user = bench.build_messages(item, "Look twice.", config)
        assert system.role == "system" and "## Skill\nLook twice." in system.text()
        assert user.role == "user" and not system.images()
        images = user.images()
        expected = item.get("image_paths") or [item["image_path"]]
        assert [Path(str(p.source)) for p in images] == [Path(p) for p in expected]
        assert all(isinstance(p, ImagePart) and p.detail is None for p in images)  # auto sends no detail
        for image in images:
            assert f"[image] {Path(str(image.source)).name}" in user.text()
        assert "base64" not in user.text()


def test_image_detail_low_or_high_reaches_every_image_part(bench, tmp_path):
    config = fixture_config_of(bench, ["benchmark.image_detail=high"])
    item = next(iter(items_by_id(bench, config, tmp_path).values()))
    _, user = bench.build_messages(item, "", config)
    assert user.images() and {p.detail for p in user.images()} == {"high"}
    assert user.images()[0].data_uri().startswith("data:image/png;base64,iVBORw0KGgo")


def test_no_prompt_contains_a_gold_value(bench, tmp_path):
    config = fixture_config_of(bench)
    for item in items_by_id(bench, config, tmp_path).values():
        prompt = "\n".join(m.text() for m in bench.build_messages(item, "", config))
        golds = [s for field in bench.GOLD_FIELDS for s in _gold_strings(item.get(field))]
        # A gold that is also an option's text is shown as an option, by design; no other gold may appear.
        options = json.dumps(item.get("choices") or item.get("options") or [])
        leaked = [g for g in golds if g in prompt and g not in options and g not in item.get("question", "")]
        assert not leaked, (item.id, leaked)


def test_an_unknown_split_name_raises(bench, tmp_path):
    with pytest.raises(ValueError, match="accepted names"):
        bench.load_split(fixture_config_of(bench), "dev", run_dir=tmp_path)


def test_scripted_rules_solve_some_fixture_items_and_miss_others(bench, tmp_path):
    config = fixture_config_of(bench)
    judge = scripted_judge_of(bench) if bench.needs_judge(config) else None
    target = PluginScriptedTarget(bench)
    rows = [run_item(bench, item, "", config, target=target, judge=judge)
            for item in items_by_id(bench, config, tmp_path).values()]
    assert all(row.answered and row.trajectory[-1]["type"] == "evaluation" for row in rows)
    assert 0 < sum(row.hard for row in rows) < len(rows), [(r.id, r.fail_reason) for r in rows]
    assert all(
        row.fail_reason == "" or row.fail_reason.split(":")[0] in ("wrong", "no-answer") for row in rows
    )
    # The trajectory names images, never their bytes.
    assert all("base64" not in json.dumps(row.trajectory) for row in rows)
    assert any("[image] " in event["content"] for row in rows for event in row.trajectory
               if event["type"] == "message" and event["role"] == "user")


def test_a_target_that_always_raises_is_an_infrastructure_error(bench, tmp_path):
    config = fixture_config_of(bench)
    failing = PluginScriptedTarget(bench, rules=[{"stage": "rollout", "error": "ServerError"}])
    rows = []
    for item in items_by_id(bench, config, tmp_path).values():
        with pytest.raises(ServerError) as caught:
            run_item(bench, item, "", config, target=failing, judge=None)
        rows.append(error_row(item, caught.value))
    with pytest.raises(RolloutInfrastructureError, match=f"none of {len(rows)} items got a model answer"):
        check_infrastructure(rows, role_label="scripted/scripted")


def test_scripted_rules_are_valid_and_the_three_prompts_ship(bench):
    assert len(parse_rules(list(fixture_rules(bench)), where="test")) == len(fixture_rules(bench))
    names = {path.name for path in bench.prompts_dir.iterdir()}
    assert {"initial_skill.md", "analyst_error.md", "analyst_success.md"} <= names
    seed = (bench.prompts_dir / "initial_skill.md").read_text(encoding="utf-8")
    wanted = "\\boxed{" if bench.id == "babyvision" else "<answer>…</answer>"
    assert wanted in seed
    assert ("<answer>" in seed) == (bench.id != "babyvision")  # one answer format per seed, the one scored


def test_the_shipped_config_is_valid_for_the_plugin(bench):
    from skillopt.benchmarks.base import benchmark_config
    from skillopt.core.config import load_config

    config = benchmark_config(bench, load_config(bench.id, env={}).config.benchmark)
    assert config.split_mode == bench.default_split_mode and config.image_detail == "auto"
