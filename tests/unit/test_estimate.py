"""`skillopt train --dry-run`: calls, tokens and USD per stage from the config, without a model call."""

from __future__ import annotations

import os
import textwrap

import pytest

from skillopt.core.config import load_config
from skillopt.run.estimate import dry_run, merge_calls
from skillopt.shell.cli import main


def estimate(*overrides: str):
    return dry_run(load_config("demo", overrides=list(overrides), env=os.environ), env=os.environ)


def stage(result, name: str):
    return next(s for s in result.stages if s.stage == name)


# 9 at fan-in 8: level 1 groups [8, 1] (one call, the lone patch passes through), level 2 merges the two.
@pytest.mark.parametrize(
    ("patches", "fan_in", "calls"),
    [(1, 8, 0), (2, 8, 1), (8, 8, 1), (9, 8, 2), (10, 8, 3), (17, 4, 6), (64, 8, 9)],
)
def test_merge_calls_follow_the_merge_tree(patches, fan_in, calls):
    assert merge_calls(patches, fan_in) == calls


def test_demo_counts_follow_split_sizes_batches_and_epochs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = estimate()
    assert result.split_sizes == {"train": 24, "val": 12, "test": 24} and result.steps == 6
    rollout = stage(result, "rollout")
    # Lowest: baseline 12 + 6 steps x 8 train items + the initial skill on test 24.
    assert rollout.calls_low == 12 + 6 * 8 + 24
    # Highest: + a gate on 12 items every step, 2 x 20 pair rollouts and a 12-item re-score at the epoch-2
    # boundary, the final selection check, and the best skill on test.
    assert rollout.calls_high == 12 + 6 * (8 + 12) + 40 + 12 + 12 + 2 * 24
    assert rollout.calls_low <= rollout.calls <= rollout.calls_high
    assert stage(result, "slow_update").calls == stage(result, "meta_skill").calls == 1  # one boundary
    assert stage(result, "analyst").calls_low == 6  # one minibatch of 8 per step at least
    assert not any(s.stage == "judge" for s in result.stages)  # the demo has no judge
    assert not (tmp_path / "runs").exists()  # a dry run writes no run directory


def test_counts_scale_with_epochs_and_batch_size(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = estimate()
    longer = estimate("train.epochs=4")
    assert longer.steps == 2 * base.steps
    assert stage(longer, "slow_update").calls == 3
    smaller = estimate("gradient.minibatch_size=2")
    assert stage(smaller, "analyst").calls_low == 6 * 4


def test_priced_models_give_usd_and_a_budget_verdict(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prices = tmp_path / "prices.yaml"
    prices.write_text(textwrap.dedent("""\
        entries:
          - {match: "priced-target", input_per_mtok: 1000, output_per_mtok: 2000}
    """))
    result = estimate(
        f"model.pricing_file={prices}",
        "model.target.backend=openai_compatible",
        "model.target.base_url=http://127.0.0.1:9/v1",
        "model.target.model=priced-target",
        "model.target.options={}",
        "budget.max_usd=1",
    )
    rollout = stage(result, "rollout")
    per_call = (rollout.prompt_tokens_per_call * 1000 + rollout.completion_tokens_per_call * 2000) / 1e6
    assert rollout.usd == pytest.approx(per_call * rollout.calls)
    assert rollout.usd_low < rollout.usd < rollout.usd_high
    assert stage(result, "analyst").usd == 0.0  # the scripted optimizer is free
    assert result.usd == pytest.approx(rollout.usd)
    assert result.budget is not None and result.budget.stop and result.budget.cap == "max_usd"
    assert result.per_step.by_role["target"].usd > 0


def test_dry_run_command_prints_stages_and_calls_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "demo", "--dry-run", "-o", "budget.max_tokens=1000000"]) == 0
    out = capsys.readouterr().out
    assert "no model was called" in out
    for name in ("rollout", "analyst", "slow_update", "meta_skill", "total"):
        assert f"\n{name} " in out
    assert "budget: the expected run fits" in out
    assert not (tmp_path / "runs").exists() and not (tmp_path / ".skillopt").exists()


def test_a_multi_turn_rollout_counts_up_to_max_turns_calls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one, three = stage(estimate(), "rollout"), stage(estimate("benchmark.max_turns=3"), "rollout")
    assert three.calls_low == one.calls_low and three.calls_high == 3 * one.calls_high
    assert three.calls == 2 * one.calls  # (1 + 3) / 2 calls per rollout expected


def test_output_tokens_per_call_never_exceed_the_roles_max_tokens(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    free = estimate()
    assert stage(free, "rollout").completion_tokens_per_call > 50
    assert stage(free, "analyst").completion_tokens_per_call > 300
    capped = estimate("model.target.max_tokens=50", "model.optimizer.max_tokens=300")
    assert stage(capped, "rollout").completion_tokens_per_call == 50
    assert stage(capped, "analyst").completion_tokens_per_call == 300
    assert stage(capped, "rollout").tokens < stage(free, "rollout").tokens


def test_merges_expected_never_pass_their_high_and_a_merge_reads_what_a_tree_holds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for epochs in (1, 2, 4):
        merge = stage(estimate(f"train.epochs={epochs}", "gradient.minibatch_size=2"), "merge")
        assert merge.calls_low <= merge.calls <= merge.calls_high, (epochs, merge)
    # Batch 8 read 8 at a time: one analyst per kind, so a merge reads the two trees' patches, not 8.
    wide = stage(estimate("gradient.minibatch_size=2"), "merge").prompt_tokens_per_call
    narrow = stage(estimate("gradient.minibatch_size=8"), "merge").prompt_tokens_per_call
    assert narrow < wide


def test_the_verdict_says_before_which_step_the_guard_would_stop(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    per_step = estimate().per_step.tokens
    baseline = 12 * sum(stage(estimate(), "rollout").model_dump(include={"prompt_tokens_per_call",
                                                                         "completion_tokens_per_call"}).values())
    assert estimate(f"budget.max_tokens={baseline + per_step // 2}").stops_before_step == 1
    assert estimate(f"budget.max_tokens={baseline + per_step + per_step // 2}").stops_before_step == 2
    fits = estimate("budget.max_tokens=100000000")
    assert fits.budget is not None and not fits.budget.stop and fits.stops_before_step is None
    assert main(["train", "demo", "--dry-run", "-o", f"budget.max_tokens={baseline + per_step // 2}"]) == 0
    assert (f"training would stop cleanly before its first step (one step is expected to take {per_step:,} "
            "tokens)") in capsys.readouterr().out


def test_an_episode_benchmark_counts_its_steps_as_target_calls(tmp_path, monkeypatch):
    """alfworld plays up to benchmark.max_steps steps, one target call each; max_turns says nothing of it."""
    from pathlib import Path

    from skillopt.core.data import data_overrides

    monkeypatch.chdir(tmp_path)
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "alfworld"

    def rollouts(steps: int):
        loaded = load_config("alfworld", env=os.environ, overrides=[
            *data_overrides(str(fixture)), "train.epochs=1", "model.target.backend=scripted",
            "model.optimizer.backend=scripted", f"benchmark.max_steps={steps}"])
        return stage(dry_run(loaded, env=os.environ), "rollout")

    assert rollouts(10).calls_high == 5 * rollouts(2).calls_high  # 10 steps an item against 2


def test_a_usd_cap_over_an_unpriced_model_is_said_to_refuse_the_run_not_to_fit(tmp_path, monkeypatch, capsys):
    """Training refuses to start under budget.max_usd when a model has no price; the dry run once said that
    the run fits within the caps."""
    monkeypatch.chdir(tmp_path)
    unpriced = ["model.target.backend=openai_compatible", "model.target.base_url=http://127.0.0.1:9/v1",
                "model.target.model=my-unknown-model", "budget.max_usd=0.01"]
    result = estimate(*unpriced)
    assert result.refused is not None and "no price is known for target" in result.refused
    assert estimate(*unpriced, "budget.allow_unpriced=true").refused is None
    assert main(["train", "demo", "--dry-run", *[f"-o{o}" for o in unpriced]]) == 0
    out = capsys.readouterr().out
    assert "budget: training would not start: budget.max_usd is set but no price is known for target" in out
    assert "fits within the caps" not in out
