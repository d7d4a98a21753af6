"""Kill -9 in the middle of `skillopt train`, run the same command again: the run finishes with the
same best skill and scores as an uninterrupted run, and no model call that had completed is made again.

Target and optimizer both go through the loopback OpenAI-compatible fake, which answers like the
demo world (the demo's scripted handlers behind a real HTTP protocol) and records every request.
The fake holds requests from a seeded random point on, the test waits until every answered call
has had time to be stored, then kills the whole process group.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, role_overrides

pytestmark = pytest.mark.slow


#: A skill that never changes over two epochs: epoch 2 sends the very prompts of epoch 1 again, as new draws.
UNCHANGED_SKILL = ("optimizer.learning_rate=0", "optimizer.min_learning_rate=0",
                   "optimizer.use_slow_update=false", "optimizer.use_meta_skill=false")


def train_command(url: str, extra: tuple[str, ...] = ()) -> list[str]:
    overrides = [part for override in (*role_overrides(url), *extra) for part in ("-o", override)]
    return [sys.executable, "-m", "skillopt.shell.cli", "train", "demo", "--run-name", "resume", *overrides]


def start(cwd: Path, api: str, url: str, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_LOGGING_LEVEL": "WARNING"}
    return subprocess.Popen(train_command(url, extra), cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-3000:]
    return output


@pytest.mark.parametrize("extra", [(), UNCHANGED_SKILL], ids=["training", "unchanged-skill-resampled"])
def test_kill_9_mid_step_then_rerun_repeats_no_completed_call(prefect_api, tmp_path, extra):
    world = DemoWorldServer()
    with world.server:
        url = world.server.openai_base_url

        reference_dir = tmp_path / "reference"
        reference_dir.mkdir()
        finish(start(reference_dir, prefect_api, url, extra))
        reference_calls = list(world.answered)
        assert len(set(reference_calls)) == len(reference_calls), "an uninterrupted run repeated a call"
        if extra == UNCHANGED_SKILL:
            # Each epoch drew every training item afresh: the same prompt, told apart by its draw's seed.
            draws = Counter(json.loads(body).get("seed") for body in reference_calls)
            assert draws[42 + 1000] == draws[42 + 2000] > 0

        # The interrupted run, in a fresh folder (its own cache): hold requests from a seeded point on.
        run_dir = tmp_path / "interrupted"
        run_dir.mkdir()
        world.answered.clear()
        world.hold_from = random.Random(20261130).randint(
            len(reference_calls) // 5, 4 * len(reference_calls) // 5
        )
        process = start(run_dir, prefect_api, url, extra)
        assert world.held.wait(timeout=300), "the run finished before the kill point"
        time.sleep(2.0)  # every answered call has been stored by now; the held ones never will be
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        answered_before_kill = set(world.answered)
        assert answered_before_kill, "nothing completed before the kill"

        world.hold_from = None
        world.release.set()
        world.answered.clear()
        finish(start(run_dir, prefect_api, url, extra))
        answered_after = list(world.answered)

    repeated = answered_before_kill & set(answered_after)
    assert repeated == set(), f"{len(repeated)} completed calls were made again"
    assert len(answered_before_kill) + len(answered_after) == len(reference_calls)

    reference_run = reference_dir / "runs" / "resume"
    resumed_run = run_dir / "runs" / "resume"
    assert (resumed_run / "best_skill.md").read_text() == (reference_run / "best_skill.md").read_text()
    reference_summary = json.loads((reference_run / "summary.json").read_text())
    resumed_summary = json.loads((resumed_run / "summary.json").read_text())
    assert resumed_summary["scores"] == reference_summary["scores"]
    reference_history = [json.loads(x) for x in (reference_run / "history.jsonl").read_text().splitlines()]
    resumed_history = [json.loads(x) for x in (resumed_run / "history.jsonl").read_text().splitlines()]
    assert [(r["step"], r["kind"], r["budget"], r["decision"]) for r in resumed_history] == \
        [(r["step"], r["kind"], r["budget"], r["decision"]) for r in reference_history]

    # Holdout: no selection or test item ever reached an optimizer call.
    for body in map(json.loads, reference_calls + answered_after + sorted(answered_before_kill)):
        text = json.dumps(body["messages"])
        if "## Edit budget" in text or "## Patches to merge" in text or "## Comparison" in text:
            assert "demo-val-" not in text and "demo-test-" not in text
