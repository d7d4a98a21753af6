"""Step 2's first rollouts leave once step 1's gate is decided ahead of the flow, and step 2 takes them.

`skillopt train` makes step 1's optimizer calls and its candidate's selection rollouts ahead of the flow
(``flows.stages.step_one_ahead``); that work now also decides step 1's gate, as ``update_and_gate`` will, and
starts step 2's first batch with the skill step 1 ends on. The command runs in a subprocess whose flow is held
before step 1 until the run's ledger holds every rollout of step 2's batch: without this look ahead, none of
them is made before the flow's own step 1 has ended. The world runs the demo's target and optimizer behind the
loopback OpenAI-compatible fake (a reply store, so the run starts its rollouts early).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, role_overrides

pytestmark = pytest.mark.slow

STEPS, BATCH = 2, 4

# `skillopt train`, its flow held before step 1 until step 2's first rollouts are in the ledger (or 60 s).
HELD_TRAIN = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path

    from skillopt.flows import train as train_flow

    original = train_flow.train_step

    def held(run, state, *args, **kwargs):
        if state.step == 1:
            wanted = set(run.epoch_plan(1).steps[1].batches[0].item_ids)
            usage = run.dir.path / "usage.jsonl"
            deadline = time.monotonic() + 60
            def made():
                text = usage.read_text() if usage.exists() else ""
                lines = [json.loads(line) for line in text.splitlines()]
                return {u["tags"]["item_id"] for u in lines if u["stage"] == "rollout"
                        and u["tags"].get("training") and u["tags"].get("item_id") in wanted}
            while time.monotonic() < deadline and made() != wanted:
                time.sleep(0.02)
            Path("held.json").write_text(json.dumps({"made_before_step_one": made() == wanted}))
        return original(run, state, *args, **kwargs)

    train_flow.train_step = held
    sys.argv = ["skillopt", *sys.argv[1:]]
    from skillopt.cli import entry
    entry(hand_over=False)
""")


def test_step_twos_rollouts_are_made_before_the_flow_begins_step_one(prefect_api, tmp_path: Path):
    world = DemoWorldServer()
    with world.server:
        overrides = [p for o in [*role_overrides(world.server.openai_base_url),
                                 f"benchmark.train_size={STEPS * BATCH}", f"train.batch_size={BATCH}",
                                 "benchmark.val_size=4", "train.epochs=1", "evaluation.eval_test=false"]
                     for p in ("-o", o)]
        env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": "WARNING"}
        command = [sys.executable, "-c", HELD_TRAIN, "train", "demo", "--run-name", "ahead", *overrides]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        answered = list(world.answered)

    assert json.loads((tmp_path / "held.json").read_text()) == {"made_before_step_one": True}
    run_dir = tmp_path / "runs" / "ahead"
    usage = [json.loads(line) for line in (run_dir / "usage.jsonl").read_text().splitlines()]
    calls = [u for u in usage if not u.get("cache_hit")]
    assert len(set(answered)) == len(answered), "each request reached the model once"
    assert len(calls) == len(answered), "the ledger holds each call once"
    assert [u for u in calls if u["status"] != "ok"] == []
    training = [u for u in calls if u["stage"] == "rollout" and u["tags"].get("training")]
    assert len(training) == STEPS * BATCH, "step 2 took the rollouts made ahead: none was made twice"
    assert not [u for u in usage if u.get("cache_hit") and u["tags"]], "no reply came from the reply store"
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history if h.get("kind", "step") == "step"] == [1, 2]
