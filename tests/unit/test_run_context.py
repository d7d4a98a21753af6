"""The run context reaches every task as one opaque parameter: Prefect must not walk into it.

Prefect visits each task parameter that is a collection, dataclass or pydantic model looking for futures, once
when the task is submitted and once when its inputs are resolved. A context it could walk made every task
submission visit every item of every split, the config and the clients.
"""

from __future__ import annotations

from prefect.utilities.collections import visit_collection

from skillopt.config import load_config
from skillopt.data import Item
from tasks.context import build_run_context


def _context(tmp_path):
    overrides = [f"run.runs_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'cache'}",
                 "benchmark.train_size=40", "train.batch_size=8"]
    return build_run_context(load_config("demo", overrides=overrides, env={}), env={}, run_name="context")


def test_prefect_sees_the_run_context_as_one_leaf(tmp_path):
    ctx = _context(tmp_path)
    item = ctx.items[ctx.split_ids["train"][0]]
    visited = []
    visit_collection({"ctx": ctx, "item": item, "skill": ctx.initial_skill},
                     lambda value: visited.append(value) or value, return_data=False)
    assert any(value is ctx for value in visited)
    # The one item passed on its own is visited; none of the context's 40 + 12 + 24 items are.
    assert [value.id for value in visited if isinstance(value, Item)] == [item.id]


def test_the_run_context_keeps_what_tasks_read(tmp_path):
    ctx = _context(tmp_path)
    assert len(ctx.split_ids["train"]) == 40
    assert [row.id for row in ctx.rows_of(ctx.split_ids["val"])] == ctx.split_ids["val"]
    assert ctx.config.train.batch_size == 8 and ctx.benchmark.id == "demo"
    assert ctx.benchmark_guidance.keys() == {"error", "success"}
    assert repr(ctx) == "RunContext(run_name='context', benchmark='demo')"


def test_model_calling_tasks_carry_their_prefect_tags_only_in_prefect_limit_mode(tmp_path):
    from tasks.optimize import reflect_minibatch
    from tasks.rollout import evaluate_skill, rollout_item

    local = _context(tmp_path / "local")
    assert local.bind(rollout_item).tags == set() and local.bind(reflect_minibatch).tags == set()
    assert local.bind(rollout_item, tags={"mine"}).tags == {"mine"}

    overrides = [f"run.runs_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'cache'}",
                 "model.rate_limit_mode=prefect"]
    shared = build_run_context(load_config("demo", overrides=overrides, env={}), env={}, run_name="prefect-mode")
    assert shared.bind(rollout_item).tags == {"llm:target"}
    assert shared.bind(reflect_minibatch).tags == {"llm:optimizer"}
    assert shared.bind(evaluate_skill).tags == set()  # never had one
    assert shared.bind(rollout_item).cache_key_fn is rollout_item.cache_key_fn
