"""The run reaches every task as one opaque parameter, and any process can rebuild it from its small spec.

Prefect visits each task parameter that is a collection, dataclass or pydantic model looking for futures, once
when the task is submitted and once when its inputs are resolved. A run it could walk made every task
submission visit every item of every split, the config and the clients.
"""

from __future__ import annotations

import pickle

from prefect.utilities.collections import visit_collection

from skillopt.core.config import load_config
from skillopt.core.data import Item
from skillopt.run.assembly import Run, RunSpec, open_run, remember_run
from skillopt.tasks.cache import bound


def _overrides(tmp_path, *extra):
    return [f"run.runs_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'cache'}", *extra]


def _run(tmp_path):
    overrides = _overrides(tmp_path, "benchmark.train_size=40", "train.batch_size=8")
    return Run.from_config(load_config("demo", overrides=overrides, env={}), env={}, run_name="context")


def test_prefect_sees_the_run_as_one_leaf(tmp_path):
    run = _run(tmp_path)
    item = run.items[run.split_ids["train"][0]]
    visited = []
    visit_collection({"run": run, "item": item, "skill": run.initial_skill},
                     lambda value: visited.append(value) or value, return_data=False)
    assert any(value is run for value in visited)
    # The one item passed on its own is visited; none of the run's 40 + 12 + 24 items are.
    assert [value.id for value in visited if isinstance(value, Item)] == [item.id]


def test_the_run_keeps_what_tasks_read(tmp_path):
    run = _run(tmp_path)
    assert len(run.split_ids["train"]) == 40
    assert [row.id for row in run.rows_of(run.split_ids["val"])] == run.split_ids["val"]
    assert run.config.train.batch_size == 8 and run.benchmark.id == "demo"
    assert run.benchmark_guidance.keys() == {"error", "success", "probe"}  # probe: an optional deep_probe.md
    assert run.update_mode.name == "patch"
    assert repr(run) == "Run(run_name='context', benchmark='demo')"


def test_a_process_rebuilds_the_same_run_from_the_pickled_spec_once(tmp_path, monkeypatch):
    overrides = _overrides(tmp_path, "benchmark.train_size=40",
                           "optimizer.skill_update_mode=full_rewrite_minibatch")
    spec = RunSpec.create(load_config("demo", overrides=overrides, env={}), run_name="spec")
    travelled = pickle.loads(pickle.dumps(spec))
    assert travelled == spec and travelled.key() == spec.key()

    # Another working directory: the run's relative paths still resolve where the run started.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rebuilt = open_run(travelled)
    assert rebuilt is open_run(spec)  # built once per process
    assert rebuilt.dir.path == tmp_path / "runs" / "spec" and rebuilt.cache_dir == tmp_path / "cache"
    assert rebuilt.split_ids["train"] and rebuilt.update_mode.name == "full_rewrite_minibatch"


def test_the_flow_s_own_run_is_the_one_its_spec_opens(tmp_path):
    loaded = load_config("demo", overrides=_overrides(tmp_path), env={})
    spec = RunSpec.create(loaded, run_name="flow")
    run = remember_run(Run.build(spec, env={}, loaded=loaded))
    assert open_run(spec) is run


def test_model_calling_tasks_carry_their_prefect_tags_only_in_prefect_limit_mode(tmp_path):
    from skillopt.tasks.optimize import reflect_minibatch
    from skillopt.tasks.rollout import evaluate_skill, rollout_item

    local = _run(tmp_path / "local")
    assert bound(local, rollout_item).tags == set() and bound(local, reflect_minibatch).tags == set()
    assert bound(local, rollout_item, tags={"mine"}).tags == {"mine"}

    overrides = _overrides(tmp_path, "model.rate_limit_mode=prefect")
    loaded = load_config("demo", overrides=overrides, env={})
    from skillopt.tasks.run import limiter_for

    shared = Run.build(RunSpec.create(loaded, run_name="prefect-mode"), env={}, loaded=loaded,
                       limiter=limiter_for(loaded.config))
    assert bound(shared, rollout_item).tags == {"llm:target"}
    assert bound(shared, reflect_minibatch).tags == {"llm:optimizer"}
    assert bound(shared, evaluate_skill).tags == set()  # never had one
    assert bound(shared, rollout_item).cache_key_fn is rollout_item.cache_key_fn
