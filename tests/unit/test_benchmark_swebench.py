"""The ``swebench`` benchmark.

Items come from tests/fixtures/swebench (split_dir form) or its raw copy (ratio, repository-
stratified). The agent runner is the fake one (one target call), the target the real ``scripted``
backend with the plug-in's own rules, and the harness the fake one, which copies the plain-file
repository snapshot in tests/fixtures/swebench/repos/, runs ``git init`` on the copy, applies the
patches and runs the instance's tests in the sandbox.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from skillopt.benchmarks.base import Benchmark, BenchmarkSetupError, EpisodeContext, benchmark_config
from skillopt.benchmarks.runner import run_item
from skillopt.benchmarks.swebench import (
    SwebenchBenchmark,
    SwebenchConfig,
    normalise_row,
    parse_response,
    plugin,
    stratified_partition,
)
from skillopt.benchmarks.swebench.agents import RoleModel, docker_image, extract_patch
from skillopt.benchmarks.swebench.harness import (
    DockerHarness,
    FakeHarness,
    HarnessError,
    read_report,
    report_path,
)
from skillopt.core.config import load_config
from skillopt.core.data import Item, SplitSpec
from skillopt.core.errors import DataError
from skillopt.llm.base import BackendContext, BackendRegistry
from skillopt.llm.chat import ChatResponse
from skillopt.llm.clients import ModelClients
from skillopt.llm.scripted import parse_rules
from skillopt.sandbox import process_group
from tests.fakes.benchmark_target import PluginScriptedTarget, fixture_config_of, fixture_rules, items_by_id
from tests.processes import exit_while_making

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "swebench"
RESIZE, REPR, UNITS = "acme__widgets-101", "acme__widgets-102", "acme__widgets-103"


def fixture_config(backend: str = "scripted", **overrides: Any) -> SwebenchConfig:
    """The config of ``skillopt train swebench --data tests/fixtures/swebench --backend <backend> -o …``,
    after the run settles the ``auto`` runner and harness."""
    config = fixture_config_of(plugin, [f"benchmark.{key}={value}" for key, value in overrides.items()])
    bound, _ = plugin.bind_target(config, backend=backend, kind="chat")
    assert isinstance(bound, SwebenchConfig)
    return bound


def fixture_items(tmp_path: Path, bench: SwebenchBenchmark | None = None) -> dict[str, Item]:
    return items_by_id(bench or plugin, fixture_config(), tmp_path)


def roll(item, *, bench=None, target=None, config=None):
    bench = bench or plugin
    target = target or PluginScriptedTarget(bench)
    return run_item(
        bench, item, "Fix the root cause.", config or fixture_config(), target=target, judge=None
    ), target


def episode(patch: str, status: str = "Submitted") -> str:
    return json.dumps({"model_patch": patch, "exit_status": status})


class CountingHarness:
    """Records calls; writes a report resolving ``resolved`` (or nothing at all with ``write=False``)."""

    def __init__(self, resolved: bool = True, write: bool = True) -> None:
        self.calls = 0
        self.resolved, self.write = resolved, write

    def evaluate(self, instance, patch, work_dir, run_id):
        self.calls += 1
        path = report_path(work_dir, run_id)
        if self.write:
            path.write_text(json.dumps({"resolved_ids": [instance["instance_id"]] if self.resolved else []}))
        return path, "counting harness"


# ------------------------------------------------------------------------------------- config, load


def test_the_plugin_implements_the_protocol_and_declares_its_extra():
    assert isinstance(plugin, Benchmark)
    assert plugin.extras == ("swebench",)


def test_the_default_config_with_data_loads_binds_the_fakes_and_passes_preflight(tmp_path):
    config = fixture_config_of(plugin)
    bound, notes = plugin.bind_target(config, backend="scripted", kind="chat")
    assert (bound.agent_runner, bound.harness) == ("fake", "fake")
    assert any("simulated" in note for note in notes)
    plugin.preflight(bound)
    items = items_by_id(plugin, bound, tmp_path)
    assert sorted(items) == [RESIZE, REPR, UNITS]
    assert items[RESIZE].task_type == "acme/widgets"
    assert plugin.task_types(list(items.values())) == ["acme/widgets"]


def test_the_shipped_config_keys_are_all_valid_for_the_plugin_config():
    loaded = load_config("swebench", env={})
    config = benchmark_config(plugin, loaded.config.benchmark)
    assert (config.dataset, config.step_limit, config.cost_limit, config.harness) == ("lite", 50, 3.0, "auto")
    # the item deadline never cuts the agent short
    assert config.task_timeout >= config.timeout_per_instance + 60


def test_a_chat_backend_gets_the_real_runner_and_harness():
    bound, notes = plugin.bind_target(fixture_config_of(plugin), backend="openai", kind="chat")
    assert (bound.agent_runner, bound.harness, notes) == ("minisweagent", "docker", [])


def test_the_real_runner_without_its_packages_names_the_extra(tmp_path):
    try:
        import minisweagent  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("mini-swe-agent is installed here")
    with pytest.raises(BenchmarkSetupError, match=r"pip install 'skillopt\[swebench\]'"):
        plugin.preflight(fixture_config(backend="openai"))


def test_the_docker_harness_without_an_engine_is_a_setup_error(monkeypatch):
    bench = SwebenchBenchmark(agent_factory=lambda config: None)
    monkeypatch.setitem(sys.modules, "swebench", sys.modules[__name__])  # the package "imports"
    monkeypatch.setenv("PATH", "")
    with pytest.raises(BenchmarkSetupError, match="docker command is not installed.*harness: fake"):
        bench.preflight(fixture_config(backend="openai"))


def test_ratio_mode_without_data_says_how_to_export_the_dataset():
    with pytest.raises(BenchmarkSetupError, match="princeton-nlp/SWE-bench_Lite.*to_json"):
        plugin.preflight(SwebenchConfig(agent_runner="fake", harness="fake"))


def test_the_raw_copy_splits_one_one_one_by_repository_and_round_trips(tmp_path):
    config = SwebenchConfig(split_mode="ratio", data_path=str(FIXTURES / "raw" / "instances.json"),
                            agent_runner="fake", harness="fake")
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [len(loaded[split]) for split in ("train", "val", "test")] == [1, 1, 1]
    manifest = json.loads(next(tmp_path.glob("splits/*/split_manifest.json")).read_text())
    assert manifest["strategy"] == "stratified_by_repo"
    assert (manifest["dataset_name"], manifest["hf_split"]) == ("princeton-nlp/SWE-bench_Lite", "test")
    written = json.loads(next(tmp_path.glob("splits/*/train/items.json")).read_text())
    assert all("evaluation_settings" not in row for row in written)
    again = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert {s: [i.id for i in items] for s, items in again.items()} == {s: [i.id for i in items]
                                                                          for s, items in loaded.items()}


def _items(repo: str, n: int) -> list[Item]:
    return [Item({"id": f"{repo}-{k}", "repo": repo}) for k in range(n)]


@pytest.mark.parametrize(("n", "expected"), [(1, (0, 0, 1)), (2, (1, 0, 1)), (3, (1, 1, 1)), (10, (2, 1, 7)),
                                             (4, (1, 1, 2))])
def test_each_repository_is_split_on_its_own(n, expected):
    parts = stratified_partition(_items("o/r", n), SplitSpec(split_mode="ratio", split_ratio="2:1:7"))
    assert tuple(len(parts[name]) for name in ("train", "val", "test")) == expected


def test_repositories_are_stratified_and_the_split_is_seeded():
    items = _items("a/x", 10) + _items("b/y", 3)
    spec = SplitSpec(split_mode="ratio", split_ratio="2:1:7", split_seed=7)
    first, second = stratified_partition(list(items), spec), stratified_partition(list(reversed(items)), spec)
    assert {k: [i.id for i in v] for k, v in first.items()} == {
        k: [i.id for i in v] for k, v in second.items()
    }
    assert sorted(i["repo"] for i in first["val"]) == ["a/x", "b/y"]


def test_a_row_without_a_problem_statement_is_an_error_naming_the_file_and_row(tmp_path):
    rows = json.loads((FIXTURES / "raw" / "instances.json").read_text())
    del rows[1]["problem_statement"]
    source = tmp_path / "instances.jsonl"
    source.write_text("\n".join(json.dumps(row) for row in rows))
    config = SwebenchConfig(split_mode="ratio", data_path=str(source))
    with pytest.raises(
        DataError, match=r"instances\.jsonl.*2.*problem_statement|problem_statement.*instances"
    ):
        plugin.load_split(config, "train", run_dir=tmp_path)


def test_test_lists_must_be_lists():
    row = {"instance_id": "a__b-1", "repo": "a/b", "problem_statement": "x", "FAIL_TO_PASS": "not json"}
    with pytest.raises(ValueError, match="FAIL_TO_PASS"):
        normalise_row(row)
    ok = normalise_row({**row, "FAIL_TO_PASS": "[]"})
    assert normalise_row(ok) == ok and ok["id"] == "a__b-1"


# ------------------------------------------------------------------------------------------- prompts


def test_the_prompt_has_the_issue_but_no_patch_tests_or_hints(tmp_path):
    items = fixture_items(tmp_path)
    for item in items.values():
        text = "\n".join(m.text() for m in plugin.build_messages(item, "skill", fixture_config()))
        assert item["problem_statement"] in text
        for gold in ("patch", "test_patch"):
            assert item[gold].strip().splitlines()[-1] not in text
        assert "Use repr() on the label." not in text
        for test in json.loads(item["FAIL_TO_PASS"]):
            assert test.split("::")[1] not in text


def test_hints_are_shown_only_with_use_hints(tmp_path):
    item = fixture_items(tmp_path)[REPR]
    text = plugin.build_messages(item, "", fixture_config(use_hints="true"))[1].text()
    assert "## Hints\nUse repr() on the label." in text


# ---------------------------------------------------------------------------------- harness, scoring


@pytest.mark.parametrize("instance", [RESIZE, REPR, UNITS])
def test_the_fake_harness_resolves_each_gold_patch_on_the_repository_copy(tmp_path, instance):
    item = fixture_items(tmp_path)[instance]
    score = plugin.score(item, episode(item["patch"]), judge=None)
    assert (score.hard, score.fail_reason) == (1.0, ""), score.detail
    assert "PASSED" in score.detail


def test_the_fake_harness_leaves_the_unfixed_repository_failing(tmp_path):
    items = fixture_items(tmp_path)
    elsewhere = items[RESIZE]["patch"]  # applies cleanly but fixes another issue
    score = plugin.score(items[UNITS], episode(elsewhere), judge=None)
    assert (score.hard, score.fail_reason) == (0.0, "wrong: unresolved (Submitted)")
    assert "tests/test_units.py::test_px: FAILED" in score.detail
    assert "tests/test_units.py::test_em: PASSED" in score.detail


def test_a_patch_that_does_not_apply_is_unresolved(tmp_path):
    item = fixture_items(tmp_path)[RESIZE]
    score = plugin.score(item, episode("diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 "
                                       "+1 @@\n-a\n+b\n"), judge=None)
    assert score.hard == 0.0 and "does not apply" in score.detail


def test_without_a_repository_snapshot_the_fake_harness_compares_with_the_gold_patch(tmp_path):
    item = fixture_items(tmp_path)[RESIZE]
    harness = FakeHarness(repos_root=tmp_path / "no-repos")
    gold, _ = harness.evaluate(item, "\n" + item["patch"] + "  \n", tmp_path, "r1")
    assert read_report(gold) == {RESIZE}
    other, _ = harness.evaluate(item, "diff --git a/x b/x\n", tmp_path, "r2")
    assert read_report(other) == set()


def test_an_exit_while_the_harness_copies_the_repository_leaves_no_folder(tmp_path, monkeypatch):
    """Skillopt exits (Ctrl-C, SIGTERM, an error) while a rollout's patch is being scored: the scoring
    folder is made and the repository copy is about to be. The clean-up at exit removes every folder, and a
    forced exit (``os._exit`` the moment that clean-up returns) leaves none behind. The scoring stops
    without scoring the item."""
    monkeypatch.setattr(process_group, "_exiting", False)  # restored after the test
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    item = fixture_items(tmp_path)[RESIZE]

    def folders() -> list[Path]:
        return sorted(temp.glob("skillopt-*"))

    def score() -> None:
        plugin.score(item, episode(item["patch"]), judge=None)

    left, raised = exit_while_making(monkeypatch, "skillopt-swebench-", score, folders)
    assert left == [] and folders() == []
    assert len(raised) == 1 and isinstance(raised[0], process_group.Exiting), raised


def test_an_injected_harness_resolves_exactly_its_ids(tmp_path):
    bench = SwebenchBenchmark(harness_factory=lambda item: FakeHarness(resolved_ids=[RESIZE]))
    items = fixture_items(tmp_path, bench)
    scores = {
        key: bench.score(item, episode("diff --git a/x b/x\n"), judge=None).hard
        for key, item in items.items()
    }
    assert scores == {RESIZE: 1.0, REPR: 0.0, UNITS: 0.0}


def test_an_empty_patch_is_wrong_without_a_harness_call(tmp_path):
    harness = CountingHarness()
    bench = SwebenchBenchmark(harness_factory=lambda item: harness)
    item = fixture_items(tmp_path, bench)[RESIZE]
    for response in (episode("   \n"), episode("", "LimitsExceeded")):
        score = bench.score(item, response, judge=None)
        assert (score.hard, score.fail_reason) == (0.0, "wrong: empty patch")
    assert harness.calls == 0


def test_a_missing_report_aborts_instead_of_scoring_zero(tmp_path):
    bench = SwebenchBenchmark(harness_factory=lambda item: CountingHarness(write=False))
    item = fixture_items(tmp_path, bench)[RESIZE]
    with pytest.raises(HarnessError, match="no report"):
        bench.score(item, episode(item["patch"]), judge=None)


def test_an_unreadable_report_is_a_harness_error(tmp_path):
    broken = tmp_path / "skillopt.r.json"
    broken.write_text("{not json")
    with pytest.raises(HarnessError, match="unreadable"):
        read_report(broken)
    broken.write_text("{}")
    with pytest.raises(HarnessError, match="resolved_ids"):
        read_report(broken)


def test_the_docker_harness_runs_the_documented_command(tmp_path):
    harness = DockerHarness(dataset="verified", hf_split="test", eval_workers=3, timeout_s=10)
    command = harness.command(tmp_path / "preds.json", "skillopt_1", RESIZE)
    assert command[1:3] == ["-m", "swebench.harness.run_evaluation"]
    assert command[3:] == [
        "--dataset_name",
        "SWE-bench/SWE-bench_Verified",
        "--split",
        "test",
        "--predictions_path",
        str(tmp_path / "preds.json"),
        "--max_workers",
        "3",
        "--run_id",
        "skillopt_1",
        "--instance_ids",
        RESIZE,
    ]
    assert report_path(tmp_path, "skillopt_1", "org/model").name == "org__model.skillopt_1.json"


def test_unresolved_rows_carry_the_agent_exit_status(tmp_path):
    bench = SwebenchBenchmark(harness_factory=lambda item: CountingHarness(resolved=False))
    item = fixture_items(tmp_path, bench)[RESIZE]
    assert bench.score(item, episode("diff --git a/x b/x\n", "LimitsExceeded"), judge=None).fail_reason == \
        "wrong: unresolved (LimitsExceeded)"


# ----------------------------------------------------------------------------------- agent, episodes


def test_diffs_are_taken_from_fenced_blocks_or_the_first_diff_line():
    assert extract_patch("Fix:\n```diff\ndiff --git a/x b/x\n+1\n```\nthanks") == "diff --git a/x b/x\n+1\n"
    assert extract_patch("```python\nprint(1)\n```\n--- a/x\n+++ b/x\n") == "--- a/x\n+++ b/x\n"
    assert extract_patch("no diff here") == ""
    assert parse_response("```diff\ndiff --git a/y b/y\n```") == ("diff --git a/y b/y\n", "Submitted")


def test_scripted_runs_resolve_one_of_three_through_the_fakes(tmp_path):
    rows = {key: roll(item)[0] for key, item in fixture_items(tmp_path).items()}
    assert {key: row.hard for key, row in rows.items()} == {RESIZE: 1.0, REPR: 0.0, UNITS: 0.0}
    assert rows[REPR].fail_reason == "wrong: unresolved (Submitted)"
    assert "tests/test_repr.py::test_newline_label: FAILED" in rows[REPR].trajectory[-1]["content"]
    assert rows[UNITS].fail_reason == "wrong: empty patch"
    assert all(row.n_turns == 1 and row.answered for row in rows.values())


def test_agent_calls_go_through_the_target_role_and_are_accounted(tmp_path):
    loaded = load_config("swebench", overrides=["model.target.backend=scripted"], env={})
    clients = ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default(),
                                       context=BackendContext(scripted_target_rules=fixture_rules(plugin)),
                                       usage_path=tmp_path / "usage.jsonl")
    item = fixture_items(tmp_path)[RESIZE]
    row = run_item(plugin, item, "skill", fixture_config(), target=clients.target, judge=None)
    assert row.hard == 1.0
    records = [json.loads(line) for line in (tmp_path / "usage.jsonl").read_text().splitlines()]
    assert [(r["role"], r["stage"]) for r in records] == [("target", "rollout")]


def test_the_mini_swe_agent_model_adapter_calls_the_target_and_keeps_the_deadline(tmp_path):
    class Stop(Exception):
        pass

    replies = iter(["first", "second"])

    class Target:
        requests: list[Any] = []

        def chat(self, request):
            self.requests.append(request)
            return ChatResponse(text=next(replies), cost_usd=0.25)

    ctx = EpisodeContext(target=Target(), messages=[], cfg=fixture_config(), record=lambda event: None,
                         deadline=time.monotonic() + 60, tags={"item_id": RESIZE})
    model = RoleModel(
        ctx, deadline=time.monotonic() + 60, model_name="m", max_tokens=100, limits_exceeded=Stop
    )
    answer = model.query([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert answer == {"content": "first"}
    assert (model.n_calls, model.cost) == (1, 0.25)
    request = Target.requests[0]
    assert (request.stage, request.max_tokens, request.tags["item_id"]) == ("rollout", 100, RESIZE)
    assert model.get_template_vars()["n_model_calls"] == 1
    model.deadline = time.monotonic() - 1
    with pytest.raises(Stop):
        model.query([{"role": "user", "content": "u"}])


def test_docker_images_follow_the_swebench_naming():
    assert (
        docker_image({"instance_id": "django__django-1"})
        == "swebench/sweb.eval.x86_64.django_1776_django-1:latest"
    )
    assert docker_image({"instance_id": "x", "image_name": "mine:1"}) == "mine:1"


def test_scripted_rules_are_valid_and_the_prompts_ship():
    parse_rules(list(fixture_rules(plugin)), where="swebench")
    names = {path.name for path in plugin.prompts_dir.iterdir()}
    assert {"initial_skill.md", "analyst_error.md", "analyst_success.md"} <= names
    seed = (plugin.prompts_dir / "initial_skill.md").read_text(encoding="utf-8")
    assert "unified diff" in seed and "<answer>" not in seed


def test_importing_the_plugin_imports_no_heavy_package():
    code = ("import sys, skillopt.benchmarks.swebench as m; m.plugin; print(sorted(n for n in ('swebench', "
            "'minisweagent', 'datasets', 'litellm') if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_mini_swe_agent_runner_drives_the_documented_agent_api(monkeypatch, tmp_path):
    """The runner against a stand-in for mini-swe-agent 1.x: the SWE-bench config file under
    ``builtin_config_dir/extra``, ``DockerEnvironment(image=…)``, ``DefaultAgent(model, env, **agent)``
    and ``agent.run(task) -> (exit_status, result)``; the agent's model calls reach the target role."""
    import types

    from skillopt.benchmarks.swebench.agents import MiniSweAgentRunner

    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "swebench.yaml").write_text(
        "agent:\n  system_template: You are a helpful assistant.\n  instance_template: 'Task: {{task}}'\n"
        "environment:\n  cwd: /testbed\n  timeout: 60\n")
    seen: dict[str, Any] = {}

    class LimitsExceeded(Exception):
        pass

    class DockerEnvironment:
        def __init__(self, **kwargs):
            seen["environment"] = kwargs

        def cleanup(self):
            seen["cleaned"] = True

    class DefaultAgent:
        def __init__(self, model, env, **kwargs):
            self.model, self.env, self.settings = model, env, kwargs
            self.messages: list[dict[str, str]] = []

        def run(self, task):
            self.messages = [{"role": "system", "content": self.settings["system_template"]},
                             {"role": "user", "content": f"Task: {task}"}]
            reply = self.model.query(self.messages)
            self.messages.append({"role": "assistant", **reply})
            seen["settings"] = self.settings
            return "Submitted", "diff --git a/x b/x\n"

    modules = {"minisweagent": types.ModuleType("minisweagent"),
               "minisweagent.agents": types.ModuleType("minisweagent.agents"),
               "minisweagent.agents.default": types.ModuleType("minisweagent.agents.default"),
               "minisweagent.config": types.ModuleType("minisweagent.config"),
               "minisweagent.environments": types.ModuleType("minisweagent.environments"),
               "minisweagent.environments.docker": types.ModuleType("minisweagent.environments.docker")}
    modules["minisweagent.agents.default"].DefaultAgent = DefaultAgent
    modules["minisweagent.agents.default"].LimitsExceeded = LimitsExceeded
    modules["minisweagent.config"].builtin_config_dir = tmp_path
    modules["minisweagent.environments.docker"].DockerEnvironment = DockerEnvironment
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)

    item = fixture_items(tmp_path / "run")[RESIZE]
    target = PluginScriptedTarget(plugin, [{"stage": "rollout", "text": "THOUGHT: look\n```bash\nls\n```"}])
    events: list[dict[str, Any]] = []
    ctx = EpisodeContext(target=target, messages=[], cfg=fixture_config(), record=events.append,
                         deadline=time.monotonic() + 60, tags={"item_id": RESIZE})
    outcome = MiniSweAgentRunner(step_limit=7, cost_limit=1.5, model_name="m").run(
        item, "Reproduce first.", ctx, task=item["problem_statement"], timeout_s=30)
    assert (outcome.patch, outcome.exit_status, outcome.n_calls) == ("diff --git a/x b/x\n", "Submitted", 1)
    assert seen["settings"]["system_template"].endswith("## Skill\nReproduce first.")
    assert (seen["settings"]["step_limit"], seen["settings"]["cost_limit"]) == (7, 1.5)
    assert seen["environment"]["image"] == "swebench/sweb.eval.x86_64.acme_1776_widgets-101:latest"
    assert seen["environment"]["cwd"] == "/testbed" and seen["cleaned"]
    assert [event["role"] for event in events] == ["user", "assistant"]  # the system message is left out
    assert target.requests[0].messages[-1].text() == f"Task: {item['problem_statement']}"


def test_the_fake_agent_reaches_a_real_backend_over_http_and_each_call_is_accounted(openai_server, tmp_path):
    """No litellm: the agent's call goes through the target role's own backend (the real ``openai`` SDK
    against the loopback OpenAI-compatible fake), lands in usage.jsonl and the fix still resolves."""
    from tests.fakes.http_fakes import ok

    resize_fix = fixture_rules(plugin)[0]["text"]  # the fixture rules' right fix, a fenced diff
    openai_server.handler = lambda request: ok(text=f"Derive the height.\n{resize_fix}")
    overrides = [
        "model.target.backend=openai_compatible",
        f"model.target.base_url={openai_server.openai_base_url}",
        "model.target.model=fixture-model",
    ]
    loaded = load_config("swebench", overrides=overrides, env={})
    clients = ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default(),
                                       usage_path=tmp_path / "usage.jsonl")
    config = fixture_config(backend="openai_compatible", agent_runner="fake", harness="fake")
    item = items_by_id(plugin, config, tmp_path)[RESIZE]
    row = run_item(plugin, item, "Fix the root cause.", config, target=clients.target, judge=None)
    assert (row.hard, row.n_turns) == (1.0, 1)
    body = openai_server.last("/v1/chat/completions").body
    assert "Widget.resize() ignores keep_aspect" in body["messages"][-1]["content"]
    records = [json.loads(line) for line in (tmp_path / "usage.jsonl").read_text().splitlines()]
    assert [(r["role"], r["stage"], r["backend"]) for r in records] == [
        ("target", "rollout", "openai_compatible")
    ]
