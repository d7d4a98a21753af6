"""How ``bench/`` reads a finished run's rounds from ``usage.jsonl`` and the skill snapshots: step 1's calls
answered before the baseline's snapshot (its first batch's rollouts are prefetched, ``skillopt.run.prefetch``)
still count as step 1's."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from bench.e2e import critical_path, rounds_of
from bench.run import made_ahead

INITIAL, CANDIDATE = "aaaa", "bbbb"


def _call(at: float, stage: str, **tags: object) -> dict:
    ts = datetime.fromtimestamp(at, tz=UTC).isoformat().replace("+00:00", "Z")
    return {"ts": ts, "role": "target" if stage == "rollout" else "optimizer", "stage": stage, "tags": tags,
            "status": "ok", "cache_hit": False}


def _run(tmp_path: Path, calls: list[dict], snapshots: list[float]) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "skills").mkdir(parents=True)
    (run_dir / "usage.jsonl").write_text("".join(json.dumps(c) + "\n" for c in calls))
    for step, at in enumerate(snapshots):
        path = run_dir / "skills" / f"step_{step:04d}.md"
        path.write_text("skill")
        os.utime(path, (at, at))
    return run_dir


def test_step_one_calls_made_before_the_baseline_snapshot_are_step_one_rounds(tmp_path):
    t = 1_000_000.0
    calls = (
        [_call(t + 1, "rollout", skill_sha=INITIAL, item_id=f"v{i}") for i in range(4)]  # baseline
        + [_call(t + 1, "rollout", skill_sha=INITIAL, item_id=f"t{i}", training=True) for i in range(4)]
        + [_call(t + 2, "analyst"), _call(t + 2, "analyst")]  # step 1 ahead of the flow
        + [_call(t + 3, "rollout", skill_sha=CANDIDATE, item_id=f"v{i}") for i in range(4)]  # its candidate
        + [_call(t + 6, "rollout", skill_sha=CANDIDATE, item_id=f"t{i}", training=True) for i in range(4)]
        + [_call(t + 7, "analyst")]
    )
    run_dir = _run(tmp_path, calls, snapshots=[t + 4, t + 5, t + 8])  # baseline, step 1, step 2
    rounds = dict(rounds_of(run_dir))
    assert rounds == {"step 1 rollout": 4, "baseline eval": 4, "step 1 analyst": 2, "step 1 gate": 4,
                      "step 2 rollout": 4, "step 2 analyst": 1}
    assert critical_path(list(rounds.items()), workers=4, latency=0.5) == 3.0
    assert made_ahead(calls[8], INITIAL) and made_ahead(calls[10], INITIAL)
    assert not made_ahead(calls[0], INITIAL) and not made_ahead(calls[4], INITIAL)


def test_step_ones_first_batch_answered_on_both_sides_of_the_baseline_snapshot_is_one_round(tmp_path):
    """The baseline no longer waits for step 1's first batch: its snapshot may fall among those replies."""
    t = 1_000_000.0
    calls = (
        [_call(t + 1, "rollout", skill_sha=INITIAL, item_id=f"v{i}") for i in range(4)]  # baseline
        + [_call(t + 1, "rollout", skill_sha=INITIAL, item_id=f"t{i}", training=True) for i in range(5)]
        + [_call(t + 3, "rollout", skill_sha=INITIAL, item_id=f"t{i}", training=True) for i in range(5, 8)]
        + [_call(t + 4, "analyst")]
    )
    run_dir = _run(tmp_path, calls, snapshots=[t + 2, t + 5])  # baseline, step 1
    rounds = dict(rounds_of(run_dir))
    assert rounds == {"baseline eval": 4, "step 1 rollout": 8, "step 1 analyst": 1}
    assert critical_path(list(rounds.items()), workers=8, latency=0.5) == 1.5
