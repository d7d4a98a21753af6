"""`skillopt train` starts the run's first rollouts before Prefect has loaded (``skillopt.run.prefetch``), and
the flow's tasks take their replies as their own calls instead of calling again.

The run goes through the loopback OpenAI-compatible fake playing the demo world, which records every
request; the flow run's start time comes from the Prefect API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from tests.fakes.demo_world_http import DemoWorldServer, role_overrides


def _usage(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "usage.jsonl").read_text().splitlines()]


def _flow_run(api: str, name: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        by_name = FlowRunFilter(name=FlowRunFilterName(any_=[name]))
        runs = client.read_flow_runs(flow_run_filter=by_name)
    return min(runs, key=lambda run: run.created)  # the first run of that name (a re-run makes another)


def _flow_run_by_id(api: str, flow_run_id: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def _first_task_run_start(api: str, flow_run_id: str, task_name: str) -> float:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterName,
    )
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                                     task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=task_name)))
    starts = [run.start_time.timestamp() for run in runs if run.start_time is not None]
    assert starts, f"no {task_name} task run in flow run {flow_run_id}"
    return min(starts)


def test_train_prefetches_before_the_flow_starts_and_makes_each_call_once(prefect_api, tmp_path):
    world = DemoWorldServer()
    with world.server:
        # Minibatches of 2: step 1 has several analysts and merges them.
        overrides = [p for o in [*role_overrides(world.server.openai_base_url), "gradient.minibatch_size=2"]
                     for p in ("-o", o)]
        env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": "WARNING"}
        command = [sys.executable, "-m", "skillopt.shell.cli", "train", "demo", "--run-name", "prefetched",
                   *overrides]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        answered = list(world.answered)
        wall_minus_monotonic = time.time() - time.monotonic()
        analysts = [r.received_at + wall_minus_monotonic for r in world.server.requests
                    if r.route == "/v1/chat/completions" and "## Edit budget" in r.last_user_text]
        merges = [r.received_at + wall_minus_monotonic for r in world.server.requests
                  if r.route == "/v1/chat/completions" and "## Patches to merge" in r.last_user_text]
        lines_before = len(_usage(tmp_path / "runs" / "prefetched"))
        flow_record = json.loads((tmp_path / "runs" / "prefetched" / "flow_run.json").read_text())
        # The same command again: every task is served from Prefect's cache.
        again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        answered_again = list(world.answered)[len(answered):]

    run_dir = tmp_path / "runs" / "prefetched"
    usage = _usage(run_dir)[:lines_before]  # the first run's
    calls = [u for u in usage if not u.get("cache_hit")]
    # Each request reached the model once, and the ledger holds each call once, prefetched ones included.
    assert len(set(answered)) == len(answered)
    assert len(calls) == len(answered)
    # A prefetched call must not fail while Prefect imports httpx in the main thread.
    assert [u for u in calls if u["status"] != "ok"] == []

    # The first calls were made before Prefect started the flow run: the run's first rollouts.
    flow_run = _flow_run(prefect_api, "prefetched")
    first = datetime.fromisoformat(calls[0]["ts"])
    assert calls[0]["stage"] == "rollout"
    assert flow_run.start_time is not None and first < flow_run.start_time

    # The baseline's rows are the prefetched rollouts' results, none an error.
    rows = [json.loads(line) for line in
            (run_dir / "eval" / "baseline_selection" / "results.jsonl").read_text().splitlines()]
    prefetched = [u for u in calls if datetime.fromisoformat(u["ts"]) < flow_run.start_time]
    assert rows and not [r for r in rows if r.get("error")]
    assert len(prefetched) >= len(rows)

    # The initial skill's test split starts with the baseline, not after training: its first call comes
    # before the first optimizer call, and the final stage did not call for it again.
    test_ids = {json.loads(line)["id"] for line in
                (run_dir / "eval" / "baseline_test" / "results.jsonl").read_text().splitlines()}
    initial_sha = calls[0]["tags"]["skill_sha"]
    test_calls = [u for u in calls if u["stage"] == "rollout" and not u["tags"].get("training")
                  and u["tags"]["item_id"] in test_ids and u["tags"]["skill_sha"] == initial_sha]
    first_optimizer = min(datetime.fromisoformat(u["ts"]) for u in calls if u["role"] == "optimizer")
    assert test_ids and len(test_calls) == len(test_ids)
    assert min(datetime.fromisoformat(u["ts"]) for u in test_calls) < first_optimizer

    # Step 1's analysts read only the starting skill and step 1's first batch: they leave once that batch
    # has answered, before the first epoch's sub-flow starts (the step itself asks for them inside it).
    first_epoch = _flow_run_by_id(prefect_api, flow_record["sub_flow_run_ids"][0])
    assert first_epoch.name == "epoch-1" and first_epoch.start_time is not None
    assert analysts and min(analysts) < first_epoch.start_time.timestamp()
    # The merges of their patches follow them the same way: step 1's first merge call left before the step's
    # first analyst task run started (the step itself can ask for a merge only once its analysts are done).
    first_analyst_task = _first_task_run_start(prefect_api, str(first_epoch.id), "reflect_minibatch")
    assert merges and min(merges) < first_analyst_task

    # The flow's tasks took the prefetched replies as their own calls: nothing came from the reply store (a
    # reply-store hit carries its request's tags; the untagged hits are evaluations found in a cache).
    store_hits = [(u["stage"], u["tags"], u["ts"]) for u in usage if u.get("cache_hit") and u["tags"]]
    assert not store_hits, f"calls answered from the reply store: {store_hits}"

    # The re-run called no model, and nothing was prefetched for a task the cache served (it would have found
    # its reply stored, a reply-store hit with its request's tags).
    assert answered_again == []
    rerun = _usage(run_dir)[lines_before:]
    assert rerun and all(u.get("cache_hit") for u in rerun)
    assert not [u for u in rerun if u["tags"]]


def test_the_best_skill_s_test_split_leaves_with_the_step_that_settles_it(prefect_api, tmp_path):
    """A one-epoch run whose last skill is its best: the best skill's test rollouts are hinted once the last
    step has decided, so they start before the epoch's sub-flow ends (``finish`` would ask for them only
    after it), and each call is made once.

    The hint leaves while the step's records and artifacts are written; the rest of the test split may still
    be in flight when the sub-flow ends, so only the first of its requests is held to that bound."""
    world = DemoWorldServer()
    with world.server:
        overrides = [p for o in [*role_overrides(world.server.openai_base_url), "train.epochs=1"]
                     for p in ("-o", o)]
        env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": "WARNING"}
        command = [sys.executable, "-m", "skillopt.shell.cli", "train", "demo", "--run-name", "settled",
                   *overrides]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        answered = list(world.answered)
        wall_minus_monotonic = time.time() - time.monotonic()
        chats = [r for r in world.server.requests if r.route == "/v1/chat/completions"]

    from skillopt.skill.document import skill_hash, target_text

    run_dir = tmp_path / "runs" / "settled"
    best_sha = skill_hash((run_dir / "best_skill.md").read_text())
    last_skill = max(run_dir.glob("skills/step_[0-9][0-9][0-9][0-9].md"))
    assert last_skill.name != "step_0000.md" and skill_hash(last_skill.read_text()) == best_sha, \
        "the demo's last skill is not its best here: the hint does not apply"
    best_test = [json.loads(line) for line in
                 (run_dir / "eval" / "best_test" / "results.jsonl").read_text().splitlines()]
    test_questions = {row["task_description"] for row in best_test}
    best_skill = target_text((run_dir / "best_skill.md").read_text())
    best_test_arrivals = [r.received_at + wall_minus_monotonic for r in chats
                          if r.last_user_text in test_questions
                          and best_skill in r.body["messages"][0]["content"]]
    assert best_test and len(best_test_arrivals) == len(best_test)
    calls = [u for u in _usage(run_dir) if not u.get("cache_hit")]
    assert len(set(answered)) == len(answered) == len(calls)
    (epoch_id,) = json.loads((run_dir / "flow_run.json").read_text())["sub_flow_run_ids"]
    epoch = _flow_run_by_id(prefect_api, epoch_id)
    assert epoch.name == "epoch-1" and epoch.end_time is not None
    assert min(best_test_arrivals) < epoch.end_time.timestamp()
