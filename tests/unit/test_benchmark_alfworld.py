"""The ``alfworld`` benchmark.

Items come from tests/fixtures/alfworld (split_dir form; the gamefiles are empty files under
``json_2.1.1/``). Games run in the fake env manager (or in small scripted worlds a test injects
through ``env_factory``), and the target is the real ``scripted`` backend answering from the
fixture folder's ``scripted_rules.yaml``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from skillopt.benchmarks.alfworld import (
    AlfworldBenchmark,
    AlfworldConfig,
    normalise_row,
    parse_reply,
    plugin,
)
from skillopt.benchmarks.alfworld.env import (
    FAKE_WINNING_COMMAND,
    NOTHING_HAPPENS,
    FakeEnvManager,
    game_data_root,
    goal_of,
    task_type_of,
)
from skillopt.benchmarks.base import Benchmark, BenchmarkSetupError, EpisodeContext, benchmark_config
from skillopt.benchmarks.runner import READOUT_HEADING, run_item
from skillopt.core.config import load_config
from skillopt.core.errors import DataError
from skillopt.llm.errors import ServerError
from skillopt.llm.scripted import parse_rules
from tests.fakes.benchmark_target import PluginScriptedTarget, fixture_config_of, fixture_rules, items_by_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alfworld"
HEAT, LAMP, MUG = "train-0000", "val-0000", "test-0000"
WIN = "<think>The apple needs heating.</think><action>go to microwave 1</action>"


def fixture_config(backend: str = "scripted", **overrides: Any) -> AlfworldConfig:
    """The config of ``skillopt train alfworld --data tests/fixtures/alfworld --backend <backend> -o …``,
    after the run settles ``auto`` for the target backend."""
    config = fixture_config_of(plugin, [f"benchmark.{key}={value}" for key, value in overrides.items()])
    bound, _ = plugin.bind_target(config, backend=backend, kind="chat")
    assert isinstance(bound, AlfworldConfig)
    return bound


def fixture_items(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    return items_by_id(plugin, fixture_config(**overrides), tmp_path)


def rules(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    """Target rules: (regex on the step prompt, reply); anything else gets no action."""
    return [*({"stage": "rollout", "user": pattern, "text": reply} for pattern, reply in pairs),
            {"stage": "rollout", "text": "hmm"}]


def roll(item, config, *, target=None, bench=None, tags=None):
    bench = bench or plugin
    target = target or PluginScriptedTarget(bench)
    return run_item(bench, item, "Act decisively.", config, target=target, judge=None, tags=tags), target


class ScriptedWorld:
    """A tiny world for tests: ``script`` maps an action to (observation, done, won)."""

    def __init__(self, script: dict[str, tuple[str, bool, bool]]) -> None:
        self.script = script
        self.closed = False
        self.actions: list[str] = []

    def reset(self):
        return ({"text": ["Your task is to: water the plant."], "image": None, "anchor": [""]},
                [{"extra.gamefile": "g", "admissible_commands": ["look", "help", "water plant 1"]}])

    def step(self, actions):
        self.actions.append(actions[0])
        text, done, won = self.script.get(actions[0], (NOTHING_HAPPENS, False, False))
        return ({"text": [text], "image": None, "anchor": [""]}, [10.0 * won], [done],
                [{"extra.gamefile": "g", "admissible_commands": ["look", "water plant 1"], "won": won}])

    def close(self):
        self.closed = True


# ------------------------------------------------------------------------------------- config, load


def test_the_plugin_implements_the_protocol_and_declares_its_extra():
    assert isinstance(plugin, Benchmark)
    assert plugin.extras == ("alfworld",)


def test_the_default_config_with_data_loads_binds_the_fake_and_passes_preflight(tmp_path):
    config = fixture_config_of(plugin)
    assert config.env_manager == "auto"
    bound, notes = plugin.bind_target(config, backend="scripted", kind="chat")
    assert bound.env_manager == "fake"
    assert any("simulated" in note for note in notes)
    plugin.preflight(bound)
    items = items_by_id(plugin, bound, tmp_path)
    assert sorted(items) == sorted([HEAT, LAMP, MUG])
    assert items[HEAT].source_id == "train:0000"
    assert items[HEAT]["task"] == "heat some apple and put it in countertop."
    assert Path(items[HEAT]["game_path"]).is_file()
    assert plugin.task_types(list(items.values())) == ["look_at_obj_in_light", "pick_and_place",
                                                        "pick_heat_then_place_in_recep"]


def test_the_shipped_config_keys_are_all_valid_for_the_plugin_config():
    loaded = load_config("alfworld", env={})
    config = benchmark_config(plugin, loaded.config.benchmark)
    assert (config.max_steps, config.max_api_workers, config.env_manager) == (50, 8, "auto")
    assert config.task_timeout >= 1800  # a whole game of max_steps calls fits in the item deadline


def test_a_chat_backend_gets_the_real_environment_and_no_simulated_note():
    bound, notes = plugin.bind_target(fixture_config_of(plugin), backend="openai", kind="chat")
    assert bound.env_manager == "alfworld" and notes == []
    kept, notes = plugin.bind_target(
        fixture_config_of(plugin, ["benchmark.env_manager=fake"]), backend="openai", kind="chat"
    )
    assert kept.env_manager == "fake" and notes


def test_an_exec_backend_target_fails_at_setup():
    with pytest.raises(BenchmarkSetupError, match="exec backend"):
        plugin.bind_target(fixture_config_of(plugin), backend="codex_exec", kind="exec")


@pytest.mark.parametrize(
    ("gamefile", "expected"),
    [
        ("json_2.1.1/x/pick_and_place_simple-Mug-None-Shelf-302/trial_T1/game.tw-pddl", "pick_and_place"),
        (
            "json_2.1.1/x/pick_two_obj_and_place-Pen-None-Desk-1/trial_T1/game.tw-pddl",
            "pick_two_obj_and_place",
        ),
        (
            "json_2.1.1/x/pick_cool_then_place_in_recep-Egg-None-Fridge-2/trial_T1/game.tw-pddl",
            "pick_cool_then_place_in_recep",
        ),
        (
            "json_2.1.1/x/look_at_obj_in_light-Book-None-DeskLamp-301/trial_T1/game.tw-pddl",
            "look_at_obj_in_light",
        ),
        ("json_2.1.1/x/unknown_task-Book-None-DeskLamp-301/trial_T1/game.tw-pddl", None),
    ],
)
def test_task_types_come_from_the_task_directory_longest_match_first(gamefile, expected):
    assert task_type_of(gamefile) == expected


def test_normalising_is_idempotent_and_fills_the_task_type_from_the_path():
    row = {
        "id": "train:0001",
        "gamefile": "json_2.1.1/train/pick_and_place_simple-Mug-None-Shelf-1/trial_T1/game.tw-pddl",
    }
    once = normalise_row(row)
    assert once["task_type"] == "pick_and_place"
    assert normalise_row(once) == once


def test_a_row_without_a_gamefile_is_an_error_naming_the_file_and_row(tmp_path):
    data = tmp_path / "data"
    for split in ("train", "val", "test"):
        (data / split).mkdir(parents=True)
        rows = json.loads((FIXTURES / split / "items.json").read_text())
        (data / split / "items.json").write_text(json.dumps(rows))
    (data / "val" / "items.json").write_text(json.dumps([{"id": "val:0009", "task_type": "pick_and_place"}]))
    config = AlfworldConfig(split_mode="split_dir", split_dir=str(data), data_root=str(FIXTURES))
    with pytest.raises(DataError, match=r"val/items\.json.*gamefile|gamefile.*val/items\.json") as raised:
        plugin.load_split(config, "val", run_dir=tmp_path)
    assert "1" in str(raised.value)


def test_a_gamefile_without_a_task_type_anywhere_is_an_error():
    with pytest.raises(ValueError, match="task_type"):
        normalise_row({"id": "x", "gamefile": "games/mystery/game.tw-pddl"})


def test_ratio_output_round_trips_through_its_own_reader(tmp_path):
    rows = [
        json.loads((FIXTURES / split / "items.json").read_text())[0] for split in ("train", "val", "test")
    ]
    rows += [{**row, "id": row["id"] + "b"} for row in rows]
    source = tmp_path / "games.json"
    source.write_text(json.dumps(rows))
    config = AlfworldConfig(split_mode="ratio", data_path=str(source), split_ratio="1:1:1",
                            alfworld_data=str(FIXTURES), env_manager="fake")
    loaded = {
        split: plugin.load_split(config, split, run_dir=tmp_path / "run")
        for split in ("train", "val", "test")
    }
    assert sorted(len(items) for items in loaded.values()) == [2, 2, 2]
    written = json.loads(next((tmp_path / "run" / "splits").glob("*/train/items.json")).read_text())
    assert all("game_path" not in row for row in written)
    assert {item.id for item in loaded["train"]} == {row["id"].replace(":", "-") for row in written}


def test_preflight_fails_for_a_missing_gamefile_even_with_the_fake(tmp_path):
    data = tmp_path / "data"
    for split in ("train", "val", "test"):
        (data / split).mkdir(parents=True)
        (data / split / "items.json").write_text((FIXTURES / split / "items.json").read_text())
    config = AlfworldConfig(
        split_mode="split_dir", split_dir=str(data), data_root=str(data), env_manager="fake"
    )
    with pytest.raises(BenchmarkSetupError, match=r"3 gamefile\(s\) not found.*ALFWORLD_DATA"):
        plugin.preflight(config)


def test_the_real_environment_without_the_package_names_the_extra_and_the_data_variable():
    try:
        import alfworld  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the alfworld package is installed here")
    with pytest.raises(BenchmarkSetupError) as raised:
        plugin.preflight(fixture_config(backend="openai"))
    assert "pip install 'skillopt[alfworld]'" in str(raised.value)
    assert "ALFWORLD_DATA" in str(raised.value)


def test_missing_game_data_names_the_data_variable(tmp_path):
    with pytest.raises(
        BenchmarkSetupError, match=r"ALFWORLD_DATA.*alfworld-download|alfworld-download.*ALFWORLD_DATA"
    ):
        game_data_root([])
    with pytest.raises(BenchmarkSetupError, match="logic/alfred.pddl"):
        game_data_root([tmp_path])
    (tmp_path / "logic").mkdir()
    for name in ("alfred.pddl", "alfred.twl2"):
        (tmp_path / "logic" / name).write_text("")
    assert game_data_root([FIXTURES, tmp_path]) == tmp_path


def test_gamefiles_resolve_under_the_data_folder_then_the_environment_variable(tmp_path):
    elsewhere = tmp_path / "downloads"
    game = elsewhere / "json_2.1.1" / "train" / "g" / "game.tw-pddl"
    game.parent.mkdir(parents=True)
    game.write_text("")
    bench = AlfworldBenchmark(env={"ALFWORLD_DATA": str(elsewhere)})
    assert bench.data_roots(AlfworldConfig(data_root=str(FIXTURES))) == [FIXTURES, elsewhere]
    assert bench.data_roots(AlfworldConfig(alfworld_data=str(tmp_path), data_root=str(FIXTURES))) == [
        tmp_path
    ]
    split_folder = tmp_path / "split"
    for split in ("train", "val", "test"):
        (split_folder / split).mkdir(parents=True)
        (split_folder / split / "items.json").write_text(
            json.dumps(
                [
                    {
                        "id": f"{split}:1",
                        "gamefile": "json_2.1.1/train/g/game.tw-pddl",
                        "task_type": "pick_and_place",
                    }
                ]
            )
        )
    config = AlfworldConfig(split_mode="split_dir", split_dir=str(split_folder), data_root=str(split_folder),
                            env_manager="fake")
    (item,) = bench.load_split(config, "train", run_dir=tmp_path)
    assert item["game_path"] == str(game)
    bench.preflight(config)


# --------------------------------------------------------------------------------------------- fake


def test_the_fake_world_welcomes_with_the_task_and_admissible_commands():
    world = FakeEnvManager(
        str(
            FIXTURES / "json_2.1.1/train/pick_heat_then_place_in_recep-Apple-None-CounterTop-12"
            "/trial_T20190001_000000_000001/game.tw-pddl"
        )
    )
    obs, infos = world.reset()
    assert "Your task is to: heat some apple and put it in countertop." in obs["text"][0]
    assert obs["image"] is None and "Welcome" in obs["anchor"][0]
    assert {"look", FAKE_WINNING_COMMAND, "help"} <= set(infos[0]["admissible_commands"])
    assert infos[0]["extra.gamefile"].endswith("game.tw-pddl")


def test_the_fake_world_wins_only_on_its_winning_command():
    world = FakeEnvManager(
        "json_2.1.1/valid_seen/look_at_obj_in_light-Book-None-DeskLamp-301/trial_T2/game.tw-pddl"
    )
    world.reset()
    obs, rewards, dones, infos = world.step(["go to desklamp 1"])
    assert (obs["text"][0], rewards, dones, infos[0]["won"]) == (NOTHING_HAPPENS, [0.0], [False], False)
    obs, rewards, dones, infos = world.step([FAKE_WINNING_COMMAND])
    assert (rewards, dones, infos[0]["won"]) == ([10.0], [True], True)


def test_goals_follow_the_task_type_templates():
    assert goal_of("a/pick_cool_then_place_in_recep-Egg-None-Fridge-2/trial_T1/game.tw-pddl") == \
        "cool some egg and put it in fridge."
    assert goal_of("a/look_at_obj_in_light-Book-None-DeskLamp-301/trial_T1/game.tw-pddl") == \
        "look at book under the desklamp."


# ------------------------------------------------------------------------------------------ episodes


@pytest.mark.parametrize(("reply", "action", "valid"), [
    ("<think>go</think><action>Go To Microwave 1</action>", "go to microwave 1", True),
    ("<action>look</action>", "look", False),
    ("no tags at all", "look", False),
    ("<think>x</think><action>  </action>", "look", False),
    ("<think>a</think><action>open drawer 1</action><action>look</action>", "open drawer 1", True),
])
def test_replies_become_one_lowercased_action_and_a_validity_flag(reply, action, valid):
    _, got, ok = parse_reply(reply)
    assert (got, ok) == (action, valid)


def test_the_winning_action_solves_the_heat_game_in_one_step(tmp_path):
    items = fixture_items(tmp_path)
    row, _ = roll(items[HEAT], fixture_config())
    assert (row.hard, row.soft, row.n_turns, row.fail_reason) == (1.0, 1.0, 1, "")
    steps = [event for event in row.trajectory if event["type"] == "env_step"]
    assert steps == [
        {
            "type": "env_step",
            "step": 1,
            "reasoning": steps[0]["reasoning"],
            "action": "go to microwave 1",
            "observation": steps[0]["observation"],
            "reward": 10.0,
            "done": True,
            "valid": True,
        }
    ]
    assert row.extras == {"gamefile": items[HEAT]["gamefile"], "invalid_actions": 0}
    assert row.trajectory[-1]["type"] == "evaluation"
    assert row.task_description == "heat some apple and put it in countertop."


def test_no_action_tag_sends_look_and_records_an_invalid_step(tmp_path):
    items = fixture_items(tmp_path, max_steps=3)
    row, target = roll(items[MUG], fixture_config(max_steps=3))
    steps = [event for event in row.trajectory if event["type"] == "env_step"]
    assert [(s["action"], s["valid"]) for s in steps] == [("look", False)] * 3
    assert (row.hard, row.fail_reason, row.n_turns) == (0.0, "wrong: step limit reached (3)", 3)
    assert row.extras["invalid_actions"] == 3
    assert len(target.requests) == 3


def test_help_is_never_shown_and_every_prompt_ends_with_commands_and_the_format(tmp_path):
    items = fixture_items(tmp_path, max_steps=3)
    _, target = roll(items[LAMP], fixture_config(max_steps=3))
    for request in target.requests:
        prompt = request.messages[-1].text()
        assert "'help'" not in prompt
        assert "'go to microwave 1'" in prompt
        assert prompt.rstrip().endswith("inside <action>…</action>.")
    later = target.requests[2].messages[-1].text()
    assert "## Task\nlook at book under the desklamp." in later
    assert "You have taken 2 step(s)" in later and "[Action 1] look" in later


def test_history_keeps_only_the_last_two_steps(tmp_path):
    items = fixture_items(tmp_path, max_steps=5)
    _, target = roll(items[LAMP], fixture_config(max_steps=5))
    fifth = target.requests[4].messages[-1].text()
    assert "[Action 3]" in fifth and "[Action 4]" in fifth and "[Action 2]" not in fifth


def test_an_episode_that_ends_without_winning_says_so(tmp_path):
    world = ScriptedWorld({"water plant 1": ("The plant drowns.", True, False)})
    bench = AlfworldBenchmark(env={}, env_factory=lambda item, config: world)
    target = PluginScriptedTarget(
        bench, rules(("water the plant", "<think>w</think><action>water plant 1</action>"))
    )
    row, _ = roll(fixture_items(tmp_path)[HEAT], fixture_config(), target=target, bench=bench)
    assert (row.hard, row.fail_reason, row.n_turns) == (0.0, "wrong: episode ended without success", 1)
    assert world.closed


def test_a_target_error_propagates_and_the_game_is_closed(tmp_path):
    world = ScriptedWorld({})
    bench = AlfworldBenchmark(env={}, env_factory=lambda item, config: world)
    target = PluginScriptedTarget(bench, [{"stage": "rollout", "error": "ServerError"}])
    with pytest.raises(ServerError):
        roll(fixture_items(tmp_path)[HEAT], fixture_config(), target=target, bench=bench)
    assert world.closed


def test_a_past_deadline_starts_no_call(tmp_path):
    item = fixture_items(tmp_path)[HEAT]
    target = PluginScriptedTarget(plugin)
    events: list[dict[str, Any]] = []
    messages = plugin.build_messages(item, "skill", fixture_config())
    result = plugin.run_episode(
        item,
        "skill",
        EpisodeContext(
            target=target,
            messages=messages,
            cfg=fixture_config(),
            record=events.append,
            deadline=time.monotonic() - 1,
        ),
    )
    assert target.requests == [] and result.n_turns == 0 and not result.answered


def test_the_deep_probe_readout_reaches_every_step(tmp_path):
    item = fixture_items(tmp_path, max_steps=2)[LAMP]
    target = PluginScriptedTarget(plugin)
    run_item(plugin, item, "skill", fixture_config(max_steps=2), target=target, judge=None,
             probe_instruction="Name the rule you used.")
    assert all(
        f"{READOUT_HEADING}\nName the rule you used." in r.messages[-1].text() for r in target.requests
    )


def test_the_skill_sits_in_the_system_prompt_only(tmp_path):
    item = fixture_items(tmp_path)[HEAT]
    system_text, user_text = (
        m.text() for m in plugin.build_messages(item, "Open every drawer.", fixture_config())
    )
    assert "## Skill\nOpen every drawer." in system_text and "Open every drawer." not in user_text
    assert "## Skill" not in plugin.build_messages(item, "  ", fixture_config())[0].text()


def test_the_expert_plan_reaches_only_the_analyst(tmp_path):
    items = fixture_items(tmp_path)
    row, target = roll(items[HEAT], fixture_config())
    prompts = "\n".join(m.text() for r in target.requests for m in r.messages)
    assert "HeatObject" not in prompts and "Put a heated apple" not in prompts
    evaluation = row.trajectory[-1]["content"]
    assert "Hidden reference" in evaluation and "HeatObject(apple, microwave)" in evaluation


def test_scripted_runs_solve_one_of_three(tmp_path):
    items = fixture_items(tmp_path, max_steps=4)
    rows = {key: roll(item, fixture_config(max_steps=4))[0] for key, item in items.items()}
    assert {key: row.hard for key, row in rows.items()} == {HEAT: 1.0, LAMP: 0.0, MUG: 0.0}
    assert rows[LAMP].extras["invalid_actions"] == 0 and rows[MUG].extras["invalid_actions"] == 4


def test_scripted_rules_are_valid_and_the_prompts_ship():
    parse_rules(list(fixture_rules(plugin)), where="alfworld")
    names = {path.name for path in plugin.prompts_dir.iterdir()}
    assert {"initial_skill.md", "analyst_error.md", "analyst_success.md"} <= names
    seed = (plugin.prompts_dir / "initial_skill.md").read_text(encoding="utf-8")
    assert "<think>" in seed and "<action>" in seed and "<answer>" not in seed


def test_importing_the_plugin_imports_no_heavy_package():
    code = ("import sys, skillopt.benchmarks.alfworld as m; m.plugin; print(sorted(n for n in ('alfworld', "
            "'textworld', 'gymnasium', 'omegaconf') if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_real_adapter_builds_one_game_from_its_trial_folder(monkeypatch, tmp_path):
    """The adapter against a stand-in for the documented ``alfworld`` API: ``get_environment("AlfredTWEnv")``
    → ``AlfredTWEnv(config, train_eval)`` → ``init_env(batch_size=1)`` → batched ``reset``/``step``."""
    import types

    from skillopt.benchmarks.alfworld.env import AlfworldEnvManager

    built: dict[str, Any] = {}

    class Game:
        def seed(self, seed):
            built["seed"] = seed

        def reset(self):
            return ["Your task is to: cool some egg and put it in fridge."], {
                "admissible_commands": [["look", "open fridge 1"]], "extra.gamefile": [built["gamefile"]]}

        def step(self, actions):
            built["actions"] = actions
            return ["You cool the egg."], [1], [True], {"won": [True], "admissible_commands": [["look"]],
                                                         "extra.gamefile": [built["gamefile"]]}

        def close(self):
            built["closed"] = True

    class AlfredTWEnv:
        def __init__(self, config, train_eval="train"):
            built["config"], built["train_eval"] = config, train_eval

        def init_env(self, batch_size):
            built["batch_size"] = batch_size
            return Game()

    module = types.ModuleType("alfworld.agents.environment")
    module.get_environment = lambda name: AlfredTWEnv if name == "AlfredTWEnv" else None
    for name, value in (
        ("alfworld", types.ModuleType("alfworld")),
        ("alfworld.agents", types.ModuleType("a")),
        ("alfworld.agents.environment", module),
    ):
        monkeypatch.setitem(sys.modules, name, value)
    gamefile = str(
        tmp_path
        / "json_2.1.1/valid_unseen/pick_cool_then_place_in_recep-Egg-None-Fridge-2/trial_T9/game.tw-pddl"
    )
    built["gamefile"] = gamefile
    game = AlfworldEnvManager(gamefile, data_root=tmp_path, seed=45, max_steps=7)
    assert (built["train_eval"], built["batch_size"], built["seed"]) == ("eval_out_of_distribution", 1, 45)
    assert built["config"]["dataset"]["eval_ood_data_path"] == str(Path(gamefile).parent)
    assert built["config"]["env"]["domain_randomization"] is False
    assert built["config"]["env"]["task_types"] == [1, 2, 3, 4, 5, 6]
    assert built["config"]["logic"]["domain"] == str(tmp_path / "logic" / "alfred.pddl")
    obs, infos = game.reset()
    assert infos == [
        {"extra.gamefile": gamefile, "admissible_commands": ["look", "open fridge 1"], "won": False}
    ]
    obs, rewards, dones, infos = game.step(["open fridge 1"])
    assert (obs["text"], rewards, dones, infos[0]["won"]) == (["You cool the egg."], [10.0], [True], True)
    assert obs["anchor"] == ["Your task is to: cool some egg and put it in fridge."]
    game.close()
    assert built["closed"] and built["actions"] == ["open fridge 1"]


def test_the_task_directory_decides_the_task_type_over_the_rows_label():
    path = "json_2.1.1/train/pick_and_place_simple-Mug-None-Shelf-1/trial_T1/game.tw-pddl"
    assert (
        normalise_row({"id": "a", "gamefile": path, "task_type": "pick_and_place_simple"})["task_type"]
        == "pick_and_place"
    )
    assert normalise_row({"id": "b", "gamefile": "games/g1/game.tw-pddl",
                          "task_type": "pick_two_obj_and_place"})["task_type"] == "pick_two_obj_and_place"
