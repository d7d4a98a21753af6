"""Cache keys are the requests, and training rollouts are new draws each epoch.

Every run here shares one cache folder and counts the model calls it really made (``usage.jsonl`` lines that
are not cache hits): editing one prompt must re-pay exactly the calls whose request holds it, and a later
epoch must send its training items to the target again unless ``train.resample_each_epoch`` is off.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import skillopt.benchmarks.demo as demo

pytestmark = pytest.mark.slow


def train(run_name: str, *overrides: str) -> Path:
    from skillopt.flows.train import skill_train

    return Path(skill_train(benchmark="demo", overrides=list(overrides), run_name=run_name)["run_dir"])


def paid_calls(run_dir: Path) -> list[dict]:
    """The model calls a run really made (a cache hit is recorded too, but costs nothing)."""
    lines = [json.loads(line) for line in (run_dir / "usage.jsonl").read_text().splitlines()]
    return [line for line in lines if not line.get("cache_hit")]


def by_stage(calls: list[dict]) -> Counter:
    return Counter((call["stage"], call["tags"].get("kind")) for call in calls)


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def test_editing_one_prompt_repays_exactly_the_calls_that_use_it(prefect_settings, in_tmp, editable_prompts,
                                                                 monkeypatch):
    reference = by_stage(paid_calls(train("reference")))
    assert reference[("analyst", "failure")] and reference[("slow_update", None)] == 1
    assert paid_calls(train("unchanged")) == []  # the same requests: every call comes from the cache

    # The demo's guidance for failure analysts: only the failure analysts' requests hold it.
    guidance = editable_prompts / "benchmarks" / "demo" / "analyst_error.md"
    append(guidance, "\nCheck the units before the rule.\n")
    assert by_stage(paid_calls(train("guidance-edited"))) == Counter(
        {("analyst", "failure"): reference[("analyst", "failure")]})

    # An optimizer template: only the slow update's request holds it.
    append(editable_prompts / "optimizer" / "slow_update.md", "\nKeep the guidance under ten lines.\n")
    assert by_stage(paid_calls(train("slow-update-edited"))) == Counter({("slow_update", None): 1})

    # The target's prompt (in the plug-in): every rollout is a new request, and nothing the optimizer asked
    # before is repaid unless its request shows the target's prompt (the analysts' trajectories do).
    monkeypatch.setattr(demo, "_SYSTEM_INTRO", demo._SYSTEM_INTRO + " Units are part of the answer.")
    repaid = by_stage(paid_calls(train("target-edited")))
    assert repaid[("rollout", None)] == reference[("rollout", None)]
    assert set(repaid) <= {("rollout", None), ("analyst", "failure"), ("analyst", "success")}


def _training_rollouts(run_dir: Path) -> dict[int, list[str]]:
    """Item ids of the paid training rollouts, by epoch (the epoch tag; replayed runs have none)."""
    found: dict[int, list[str]] = {}
    for call in paid_calls(run_dir):
        if call["stage"] == "rollout" and call["tags"].get("training"):
            found.setdefault(call["tags"].get("epoch", 0), []).append(call["tags"]["item_id"])
    return found


# A skill that never changes: no edit may be applied, and no guidance is written between the epochs.
UNCHANGED_SKILL = ["optimizer.learning_rate=0", "optimizer.min_learning_rate=0",
                   "optimizer.use_slow_update=false", "optimizer.use_meta_skill=false"]


def test_a_second_epoch_sends_every_training_item_to_the_target_again(prefect_settings, in_tmp):
    run_dir = train("resampled", *UNCHANGED_SKILL)
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert {r["decision"] for r in history} <= {"skip_no_patches", "skip_zero_budget"}
    assert len({r["skill_sha"] for r in history}) == 1 and [r["epoch"] for r in history] == [1, 1, 1, 2, 2, 2]
    train_ids = sorted(i for r in history if r["epoch"] == 1 for i in r["batch_ids"])
    drawn = _training_rollouts(run_dir)
    assert sorted(drawn[1]) == sorted(drawn[2]) == train_ids and len(set(train_ids)) == len(train_ids)


def test_replay_reuses_the_first_epoch_s_rollouts_for_an_unchanged_skill(prefect_settings, in_tmp):
    run_dir = train("replayed", *UNCHANGED_SKILL, "train.resample_each_epoch=false")
    drawn = _training_rollouts(run_dir)
    assert list(drawn) == [0] and len(drawn[0]) == len(set(drawn[0]))  # each item once, in epoch 1 only
