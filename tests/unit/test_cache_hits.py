"""Cached task results are counted as cache hits in the run's usage ledger."""

from __future__ import annotations

from types import SimpleNamespace

from skillopt.llm.pricing import PriceTable
from skillopt.llm.usage import UsageLedger
from skillopt.tasks.cache_hits import cache_hit_hook


def context(tmp_path):
    role = SimpleNamespace(role="target", backend="openai", model="gpt-4.1-mini", price_model="gpt-4.1-mini")
    optimizer = SimpleNamespace(role="optimizer", backend="openai", model="gpt-4.1", price_model="gpt-4.1")
    roles = SimpleNamespace(get={"target": role, "optimizer": optimizer, "judge": None}.get)
    ledger = UsageLedger(tmp_path / "usage.jsonl", PriceTable.load(None))
    return SimpleNamespace(clients=SimpleNamespace(roles=roles, ledger=ledger))


def state(name: str, result=None):
    return SimpleNamespace(name=name, result=lambda: result)


def test_cached_model_calling_tasks_become_cache_hits_and_computed_ones_do_not(tmp_path):
    ctx = context(tmp_path)
    hook = cache_hit_hook(ctx)
    hook(SimpleNamespace(name="rollout_item"), None, state("Cached"))
    hook(SimpleNamespace(name="reflect_minibatch"), None, state("Cached"))
    hook(SimpleNamespace(name="rollout_item"), None, state("Completed"))  # it ran: its call is recorded
    hook(SimpleNamespace(name="apply_update"), None, state("Cached"))  # no model call behind it
    hook(SimpleNamespace(name="judge_item"), None, state("Cached"))  # no judge role in this run
    hook(SimpleNamespace(name="evaluate_skill"), None, state("Cached", SimpleNamespace(rows=[1, 2, 3])))
    totals = ctx.clients.ledger.totals()
    assert (totals.calls, totals.cache_hits, totals.usd) == (0, 5, 0.0)
    stages = [line.stage for line in ctx.clients.ledger.records()]
    assert stages == ["rollout", "analyst", "rollout", "rollout", "rollout"]
