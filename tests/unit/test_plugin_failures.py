"""A third-party benchmark plug-in's own bugs (``tests/fakes/broken_plugins.py``) stop the run with one line
naming the benchmark, the method, the item and the cause. They are never error rows (those are for model
calls that failed after their retries, and item timeouts) and never scores."""

from __future__ import annotations

import importlib.metadata
import io
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib.metadata import EntryPoint
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from skillopt.benchmarks import base
from skillopt.benchmarks.base import ENTRY_POINT_GROUP, Benchmark, load_benchmark
from skillopt.benchmarks.runner import first_messages, run_item
from skillopt.core.data import Item
from skillopt.core.error_rows import ErrorStreak
from skillopt.core.errors import BenchmarkPluginError, BenchmarkSetupError, DataError
from skillopt.core.records import ItemResult
from skillopt.llm.errors import ServerError
from skillopt.shell.cli import main
from tests.fakes import broken_plugins as plugins
from tests.fakes.benchmark_target import RecordingScriptedTarget

PERU = Item({"id": "pe", "question": "Capital of Peru?", "answer": "Lima", "task_type": "default"})
ITALY = Item({"id": "it", "question": "Capital of Italy?", "answer": "Rome", "task_type": "default"})
#: The end of every stop for a bug in a plug-in's rollout code.
BUG = ("— a bug in the plug-in, not a model failure; fix it and re-run the same command (finished calls are "
       "reused)")
#: Where the entry points of the broken plug-ins point.
FAKES = "tests.fakes.broken_plugins"


def rolled(benchmark: Benchmark[Any], item: Item = PERU, judge: Any = None) -> ItemResult:
    target = RecordingScriptedTarget([{"stage": "rollout", "text": "<answer>Lima</answer>"}])
    return run_item(benchmark, item, "", benchmark.Config(), target=target, judge=judge)


def registered(monkeypatch: pytest.MonkeyPatch, **plugins_by_name: str) -> None:
    """Register ``name="module:attribute"`` entry points beside the installed plug-ins."""
    installed = importlib.metadata.entry_points
    extra = [EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)
             for name, value in plugins_by_name.items()]

    def entry_points(**selection: Any) -> list[EntryPoint]:
        return [*installed(**selection), *(e for e in extra if selection.get("group") == ENTRY_POINT_GROUP)]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(base, "entry_points", entry_points)


# ------------------------------------------------------------------------------------------ rollouts


def test_a_crash_in_score_stops_the_run_naming_the_benchmark_method_item_and_exception():
    assert rolled(plugins.DividesByZero(), ITALY).phase == "done"  # the other items score as usual
    with pytest.raises(BenchmarkPluginError) as caught:
        rolled(plugins.DividesByZero())
    assert str(caught.value) == f"benchmark divides_by_zero: score() raised ZeroDivisionError on item pe: " \
                                f"division by zero {BUG}"
    assert isinstance(caught.value.__cause__, ZeroDivisionError)


def test_a_model_call_that_fails_inside_score_still_propagates_unchanged():
    def judge(item: Item, prediction: str) -> tuple[bool, str]:
        raise ServerError("HTTP 503", role="judge")

    with pytest.raises(ServerError):  # the rollout task fails and the item becomes an error row
        rolled(plugins.AsksTheJudge(), judge=judge)


def test_score_must_return_a_score_and_build_messages_a_list_of_messages():
    with pytest.raises(BenchmarkPluginError) as caught:
        rolled(plugins.ScoresAFloat())
    assert str(caught.value) == f"benchmark scores_a_float: score() returned float, not Score, on item pe " \
                                f"{BUG}"
    with pytest.raises(BenchmarkPluginError) as caught:
        first_messages(plugins.PromptIsAString(), PERU, "Be brief.", plugins.CapitalsConfig())
    assert str(caught.value) == (f"benchmark prompt_is_a_string: build_messages() returned str, not a list "
                                 f"of Message, on item pe {BUG}")


@pytest.mark.parametrize(("plugin", "field", "shown"), [(plugins.ScoresInPercent(), "hard", "100.0"),
                                                       (plugins.ScoresNaN(), "soft", "nan")])
def test_a_score_outside_zero_to_one_is_refused_naming_the_field_and_value(plugin, field, shown):
    with pytest.raises(BenchmarkPluginError) as caught:
        rolled(plugin)
    assert str(caught.value) == f"benchmark {plugin.id}: score() returned {field} {shown} on item pe, " \
                                f"outside [0, 1] {BUG}"


def _rollout_run(monkeypatch: pytest.MonkeyPatch, failures: dict[str, Exception]) -> tuple[Any, list[str]]:
    """A run whose rollouts raise ``failures`` by item id, and whose other items take 0.3 s each, in a plain
    thread pool: run_rollouts' own handling of what its items raised, without Prefect."""
    from skillopt.tasks import rollout as tasks

    finished: list[str] = []

    def roll(job: dict[str, Any]) -> ItemResult:
        item = job["item"]
        if item.id in failures:
            raise failures[item.id]
        time.sleep(0.3)
        finished.append(item.id)
        return ItemResult(id=item.id, task_type="default", hard=1.0, soft=1.0, answered=True)

    @contextmanager
    def pool_for(run: Any, stage: str, workers: int) -> Iterator[Any]:
        with ThreadPoolExecutor(max_workers=workers) as threads:
            yield SimpleNamespace(submit=lambda task, parameters: threads.submit(task, parameters))

    monkeypatch.setattr(tasks, "pool_for", pool_for)
    monkeypatch.setattr(tasks, "bound", lambda run, task: roll)
    run = SimpleNamespace(
        bench_cfg=SimpleNamespace(workers=3),
        items={item_id: Item(id=item_id, task_type="default") for item_id in ("a", "b", "c")},
        prefetch=SimpleNamespace(rollouts=lambda *args, **kwargs: None), error_streak=ErrorStreak(10),
        clients=SimpleNamespace(roles=SimpleNamespace(target=SimpleNamespace(label=lambda: "target"))))
    return run, finished


def test_the_rollout_pool_stops_on_a_plugin_bug_once_the_items_in_flight_have_finished(monkeypatch):
    from skillopt.tasks.rollout import PartialEvaluation, run_rollouts

    bug = BenchmarkPluginError("benchmark x: score() raised ZeroDivisionError on item a: division by zero")
    run, finished = _rollout_run(monkeypatch, {"a": bug})
    with pytest.raises(BenchmarkPluginError) as caught:
        run_rollouts(run, "skill", "val", ["a", "b", "c"], training=False)
    assert caught.value is bug and sorted(finished) == ["b", "c"]

    # A model call that failed after its retries is still an error row, left out of the scores.
    run, finished = _rollout_run(monkeypatch, {"a": ServerError("HTTP 503")})
    with pytest.raises(PartialEvaluation) as partial:
        run_rollouts(run, "skill", "val", ["a", "b", "c"], training=False)
    rows = partial.value.evaluation.rows
    assert [row.phase for row in rows] == ["error", "done", "done"] and "ServerError" in rows[0].fail_reason


# ------------------------------------------------------------------------------------------- loading


def test_a_plugin_that_cannot_be_loaded_is_one_line_naming_its_entry_point_and_the_cause(monkeypatch):
    registered(monkeypatch, gone="skillopt_gone_plugin:plugin", no_score=f"{FAKES}:NoScore",
               plain_model_config=f"{FAKES}:PlainModelConfig", no_id=f"{FAKES}:NoId",
               renamed=f"{FAKES}:Capitals")
    expected = {
        "gone": "benchmark gone (entry point skillopt_gone_plugin:plugin) cannot be loaded: "
                "ModuleNotFoundError: No module named 'skillopt_gone_plugin'; install the package that "
                "provides it",
        "no_score": f"benchmark no_score (entry point {FAKES}:NoScore) cannot be loaded: NoScore does not "
                    "implement score; a benchmark defines normalise_row, build_messages and score",
        "plain_model_config": f"benchmark plain_model_config (entry point {FAKES}:PlainModelConfig) cannot "
                              "be loaded: its Config (PlainConfig) does not subclass "
                              "skillopt.benchmarks.base.BenchmarkConfig",
        "no_id": f"benchmark no_id (entry point {FAKES}:NoId) cannot be loaded: NoId has no id; set the "
                 "class attribute id = 'no_id' (its entry-point name)",
        "renamed": f"benchmark renamed (entry point {FAKES}:Capitals) cannot be loaded: Capitals.id is "
                   "'capitals' but it is registered as 'renamed'; set id = 'renamed'",
    }
    for name, message in expected.items():
        with pytest.raises(BenchmarkPluginError) as caught:
            load_benchmark(name)
        assert str(caught.value).startswith(message), str(caught.value)

    # A command says it in one line, before Prefect starts.
    out, err = io.StringIO(), io.StringIO()
    assert main(["train", "no_score", "--backend", "scripted"], stdout=out, stderr=err) == 2
    assert err.getvalue() == f"error: {expected['no_score']}\n"


def test_one_broken_plugin_is_listed_unavailable_with_its_reason_and_the_others_still_listed(monkeypatch):
    registered(monkeypatch, no_default=f"{FAKES}:NoDefault", gone="skillopt_gone_plugin:plugin",
               capitals=f"{FAKES}:Capitals")
    out = io.StringIO()
    assert main(["benchmarks"], stdout=out, stderr=io.StringIO()) == 0
    lines = {line.split()[0]: line for line in out.getvalue().splitlines() if line.strip()}
    assert lines["no_default"].split(None, 1)[1] == "unavailable: its Config has no default for 'strictness'"
    assert "unavailable: benchmark gone (entry point skillopt_gone_plugin:plugin) cannot be loaded: " \
           "ModuleNotFoundError" in lines["gone"]
    assert "unavailable" not in lines["capitals"] and "unavailable" not in lines["docvqa"]


def test_config_show_of_a_plugin_that_cannot_be_loaded_shows_the_config_and_fails_naming_the_unchecked_key(
        monkeypatch):
    registered(monkeypatch, gone="skillopt_gone_plugin:plugin")
    out, err = io.StringIO(), io.StringIO()
    assert main(["config", "show", "gone", "-o", "benchmark.foo=1"], stdout=out, stderr=err) == 2
    assert "name: gone" in out.getvalue()
    assert err.getvalue().startswith("error: benchmark gone (entry point skillopt_gone_plugin:plugin) cannot "
                                     "be loaded: ModuleNotFoundError")
    assert err.getvalue().endswith("; so its own keys (benchmark.foo) are not checked\n")


# -------------------------------------------------------------------------------------------- data


def _split_folder(tmp_path: Path, first_row: dict[str, Any]) -> Path:
    rows = {"train": [first_row], "val": [{"id": "b", "question": "Capital of Peru?", "answer": "Lima"}],
            "test": [{"id": "c", "question": "Capital of Chad?", "answer": "N'Djamena"}]}
    for split, items in rows.items():
        (tmp_path / split).mkdir(parents=True)
        (tmp_path / split / "items.json").write_text(json.dumps(items))
    return tmp_path


def test_any_error_of_the_normaliser_names_the_row_and_the_exception(tmp_path):
    folder = _split_folder(tmp_path / "data", {"id": "it", "question": 5, "answer": "Rome"})
    config = plugins.CapitalsConfig(split_mode="split_dir", split_dir=str(folder))
    with pytest.raises(DataError) as caught:
        plugins.ReadsAnInt().load_split(config, "train", run_dir=tmp_path / "run")
    where = f"train split, {folder / 'train' / 'items.json'} row 1"
    assert str(caught.value) == f"{where}: normalise_row raised AttributeError: 'int' object has no " \
                                "attribute 'strip'"


def test_a_normaliser_that_drops_the_id_is_told_so_not_that_the_row_has_none(tmp_path):
    folder = _split_folder(tmp_path / "data", {"id": "it", "question": "Capital of Italy?", "answer": "Rome"})
    config = plugins.CapitalsConfig(split_mode="split_dir", split_dir=str(folder))
    with pytest.raises(DataError) as caught:
        plugins.DropsTheId().load_split(config, "train", run_dir=tmp_path / "run")
    where = f"train split, {folder / 'train' / 'items.json'} row 1"
    assert str(caught.value) == f"{where}: normalise_row returned no 'id' (the row has id 'it')"


def test_a_plugin_without_a_default_split_folder_and_no_data_is_told_how_to_give_it():
    """A third-party plug-in's Config has no split_dir default: with no --data, preflight says so with the
    plug-in's data_hint (the loader's bare 'split_dir mode needs benchmark.split_dir' came too late)."""
    plugin = plugins.Capitals()
    with pytest.raises(BenchmarkSetupError) as info:
        plugin.preflight(plugins.CapitalsConfig())
    assert str(info.value) == f"capitals: no data given (benchmark.split_dir is not set); {plugin.data_hint}"
