"""One concurrency budget for every call a run makes: ``benchmark.workers`` bounds the rollouts in flight and
``model.providers.<key>.max_concurrency`` the calls per provider, the prefetched calls
(``skillopt.run.prefetch``) and the flow's own together.

The target is the demo world behind its own loopback OpenAI-compatible server, 0.5 s per reply, which counts
the requests it is answering at once; the optimizer has a server of its own. A batch of 40 with the test split
prefetched from the start and the baseline and step 1's batch in flight together is the case that once had
twice ``benchmark.workers`` target calls in flight.
"""

from __future__ import annotations

import json

import pytest

from tests.fakes.demo_world_http import DemoWorldServer

BATCH_40 = ["benchmark.train_size=40", "train.batch_size=40", "benchmark.val_size=24",
            "benchmark.test_size=24", "train.epochs=1", "benchmark.workers=24"]


def _train(run_name: str, *overrides: str) -> tuple[DemoWorldServer, list[dict]]:
    from skillopt.flows import train as train_flow

    target, optimizer = DemoWorldServer(latency_s=0.5), DemoWorldServer()
    with target.server, optimizer.server:
        roles = []
        for role, world in (("target", target), ("optimizer", optimizer)):
            roles += [f"model.{role}.backend=openai_compatible",
                      f"model.{role}.base_url={world.server.openai_base_url}",
                      f"model.{role}.model=demo-{role}", f"model.{role}.options={{}}"]
        limits = [o.format(port=target.server.port) for o in overrides]
        summary = train_flow.skill_train(benchmark="demo", run_name=run_name,
                                         overrides=[*roles, "model.judge=null", *BATCH_40, *limits])
    usage_path = summary["run_dir"] + "/usage.jsonl"
    with open(usage_path, encoding="utf-8") as usage:
        records = [json.loads(line) for line in usage]
    return target, records


@pytest.mark.parametrize(("overrides", "bound"), [
    ((), 24),
    (("model.providers={{'openai_compatible:127.0.0.1:{port}': {{max_concurrency: 8}}}}",), 8),
], ids=["workers", "provider-limit"])
def test_the_target_never_has_more_calls_in_flight_than_the_budget(prefect_settings, in_tmp, overrides,
                                                                   bound):
    target, records = _train(f"budget-{bound}", *overrides)
    rollouts = [r for r in records if r["role"] == "target" and not r.get("cache_hit")]
    assert len(rollouts) >= 40 + 24 + 24, "the batch, the baseline and the test split were rolled out"
    assert len(set(target.answered)) == len(target.answered), "each request reached the model once"
    assert len(rollouts) == len(target.answered), "the ledger holds each call once, prefetched ones included"
    # A task that read a prefetched reply made that call: no reply-store hit (it carries its request's tags).
    assert not [r for r in records if r.get("cache_hit") and r["tags"]]
    # The peer's own count: never above the budget, and the budget was used (the calls did run side by side).
    assert bound // 2 < target.server.max_in_flight <= bound


@pytest.mark.slow
def test_the_command_line_path_keeps_the_budget_too(prefect_api, tmp_path):
    """``skillopt train`` in a process of its own: the run built and prefetched before Prefect loads
    (``skillopt.run.prefetch.start_before_flow``), then adopted by the flow, stays within
    ``benchmark.workers``."""
    import os
    import subprocess
    import sys

    target, optimizer = DemoWorldServer(latency_s=0.5), DemoWorldServer()
    with target.server, optimizer.server:
        overrides = []
        for role, world in (("target", target), ("optimizer", optimizer)):
            overrides += [f"model.{role}.backend=openai_compatible",
                          f"model.{role}.base_url={world.server.openai_base_url}",
                          f"model.{role}.model=demo-{role}", f"model.{role}.options={{}}"]
        argv = [sys.executable, "-m", "skillopt.shell.cli", "train", "demo", "--run-name", "budget-cli"]
        for override in [*overrides, "model.judge=null", *BATCH_40]:
            argv += ["-o", override]
        env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": "WARNING"}
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(set(target.answered)) == len(target.answered) >= 40 + 24 + 24
    assert 12 < target.server.max_in_flight <= 24
