"""A USD budget below a run's cost stops training cleanly between steps, keeps the best skill and says why.

The demo world runs over real HTTP (the `openai_compatible` backend against the loopback OpenAI fake,
tests/fakes/demo_world_http.py) and its target is a priced model: every call reports 1,000 prompt
tokens, which the price table below makes $0.01 a rollout. The optimizer is priced at 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.demo_world_http import DemoWorldServer, role_overrides

pytestmark = pytest.mark.slow

PRICES = """entries:
  - {match: "demo-target", input_per_mtok: 10, output_per_mtok: 10}
  - {match: "demo-optimizer", input_per_mtok: 0, output_per_mtok: 0}
"""


@pytest.fixture
def priced_demo(in_tmp) -> Iterator[list[str]]:
    """Overrides that send the demo's calls to the fake, with a $0.01 target call."""
    prices = in_tmp / "prices.yaml"
    prices.write_text(PRICES)
    world = DemoWorldServer()
    world.usage = {"prompt_tokens": 1000, "completion_tokens": 0}
    with world.server:
        yield [*role_overrides(world.server.openai_base_url), f"model.pricing_file={prices}"]


def test_max_usd_below_the_run_cost_stops_between_steps_and_keeps_the_best_skill(
    prefect_settings, priced_demo
):
    from skillopt.flows.train import skill_train

    overrides = [
        *priced_demo,
        # Baseline 12 rollouts ($0.12), step 1: 8 rollouts + a 12-item gate ($0.20); the next step's
        # projection ($0.20) would pass $0.35, so the run stops before epoch 1 step 2 (a full run: ~$1.70).
        "budget.max_usd=0.35",
    ]
    summary = skill_train(benchmark="demo", overrides=overrides, run_name="demo-budget")
    run_dir = Path(summary["run_dir"])

    assert summary["stopped_by"] == "budget"
    message = summary["stopped_message"]
    assert message.startswith("budget: $0.32 of $0.35 (target 100%) spent, and epoch 1 step 2/6 is "
                              "expected to take ~$0.20")
    assert "stopped before epoch 1 step 2/6; raise budget.max_usd and resume" in message
    assert (run_dir / "STOPPED").read_text().strip() == message
    assert json.loads((run_dir / "summary.json").read_text())["stopped_by"] == "budget"

    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in history] == [1]
    assert summary["usage"]["total"]["usd"] == pytest.approx(0.32)
    # nothing spent after the stop (the test split is skipped)
    assert summary["usage"]["total"]["usd"] <= 0.35
    assert "test" not in summary["scores"]["best"] and not (run_dir / "eval" / "best_test").exists()

    best = (run_dir / "best_skill.md").read_text()
    expected_best = (
        "step_0001.md" if history[0]["decision"] in ("accept", "accept_new_best") else "step_0000.md"
    )
    assert best == (run_dir / "skills" / expected_best).read_text()
    assert (run_dir / "report.html").is_file()


def test_before_the_first_step_the_dry_run_estimate_projects_the_step(prefect_settings, priced_demo):
    from skillopt.flows.train import skill_train

    overrides = [
        *priced_demo,
        # The baseline spends $0.12; the estimate of one step (8 rollouts and half a gate) would pass $0.15.
        "budget.max_usd=0.15",
    ]
    summary = skill_train(benchmark="demo", overrides=overrides, run_name="demo-budget-first")
    run_dir = Path(summary["run_dir"])
    assert summary["stopped_by"] == "budget"
    assert "stopped before epoch 1 step 1/6" in summary["stopped_message"]
    assert summary["usage"]["total"]["calls"] == 12  # the baseline only
    assert not (run_dir / "history.jsonl").exists() or not (run_dir / "history.jsonl").read_text().strip()
    assert (run_dir / "best_skill.md").read_text() == (run_dir / "skills" / "step_0000.md").read_text()


def test_a_budget_stopped_run_resumes_where_it_stopped_and_a_raised_cap_takes_it_further(
    prefect_settings, priced_demo, in_tmp
):
    """Re-running the stopped command replays its recorded step and stops at the same place, its best skill
    kept (the guard once counted the replayed step's spend before step 1 and reset the best skill to the
    initial one); with the cap raised, the same run goes on (a cap is not part of the config hash)."""
    from skillopt.flows.train import skill_train

    first = skill_train(benchmark="demo", overrides=[*priced_demo, "budget.max_usd=0.35"], run_name="resumed")
    run_dir = Path(first["run_dir"])
    best = (run_dir / "best_skill.md").read_text()
    assert first["stopped_by"] == "budget" and "epoch 1 step 2" in first["stopped_message"]

    again = skill_train(benchmark="demo", overrides=[*priced_demo, "budget.max_usd=0.35"], run_name="resumed")
    assert again["stopped_by"] == "budget" and "stopped before epoch 1 step 2/6" in again["stopped_message"]
    assert (run_dir / "best_skill.md").read_text() == best
    assert again["scores"]["best"]["selection"] == first["scores"]["best"]["selection"]

    assert (run_dir / "STOPPED").is_file()
    further = skill_train(benchmark="demo", overrides=[*priced_demo, "budget.max_usd=5"], run_name="resumed")
    assert further["stopped_by"] is None and not (run_dir / "STOPPED").exists()  # it once stayed, stale
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert len([r for r in history if r["kind"] == "step"]) > 1
    assert further["usage"]["total"]["usd"] <= 5


def test_the_test_evaluation_is_guarded_like_a_step(prefect_settings, priced_demo):
    """A cap that every step fits under but the test split would pass skips the test evaluation cleanly:
    stopped by budget, summary and report written, nothing spent past the cap."""
    from skillopt.flows.train import skill_train

    overrides = [*priced_demo, "train.epochs=1", "budget.max_usd=1.00"]  # steps $0.72, the test split $0.48
    summary = skill_train(benchmark="demo", overrides=overrides, run_name="no-test")
    run_dir = Path(summary["run_dir"])
    assert summary["stopped_by"] == "budget", summary["usage"]["total"]
    assert "stopped before the test evaluation" in summary["stopped_message"]
    assert summary["usage"]["total"]["usd"] <= 1.00
    assert "test" not in summary["scores"]["best"] and (run_dir / "report.html").is_file()


class _DearerAfterTheBaseline(DemoWorldServer):
    """The demo world whose replies report 5,000 prompt tokens ($0.05 a rollout) once the baseline's 12 have
    answered: a step that costs more than the projection the guard let it start on (long trajectories)."""

    def reply(self, request):
        with self.lock:
            if len(self.answered) >= 12:
                self.usage = {"prompt_tokens": 5000, "completion_tokens": 0}
        return super().reply(request)


def test_a_call_refused_at_the_hard_cap_inside_a_step_ends_the_run_as_a_budget_stop(prefect_settings, in_tmp):
    """The guard lets step 1 start ($0.12 spent, a $0.20 step projected, $0.40 cap); the step's rollouts then
    cost $0.05 each, and the call that would go past 1 x the cap is refused. The run ends as a budget stop
    (once it ended as 'N model calls in a row failed', advising to fix an endpoint or a credential, with no
    summary): summary, report and best skill written, the step unrecorded, the test split skipped."""
    from skillopt.flows.train import skill_train

    prices = in_tmp / "prices.yaml"
    prices.write_text(PRICES)
    world = _DearerAfterTheBaseline()
    world.usage = {"prompt_tokens": 1000, "completion_tokens": 0}
    with world.server:
        overrides = [*role_overrides(world.server.openai_base_url), f"model.pricing_file={prices}",
                     "budget.max_usd=0.40", "budget.hard_factor=1", "benchmark.workers=2"]
        summary = skill_train(benchmark="demo", overrides=overrides, run_name="hard-stop")
    run_dir = Path(summary["run_dir"])

    assert summary["stopped_by"] == "budget"
    message = summary["stopped_message"]
    assert message.startswith("budget: hard budget stop: spent $0.4"), message
    assert message.endswith("stopped in epoch 1 step 1/6, which is not recorded; raise budget.max_usd and "
                            "resume"), message
    assert (run_dir / "STOPPED").read_text().strip() == message
    assert json.loads((run_dir / "summary.json").read_text())["stopped_by"] == "budget"
    assert not (run_dir / "history.jsonl").exists() or not (run_dir / "history.jsonl").read_text().strip()
    assert (run_dir / "best_skill.md").read_text() == (run_dir / "skills" / "step_0000.md").read_text()
    assert "test" not in summary["scores"]["best"] and (run_dir / "report.html").is_file()
    # at most the calls in flight when the cap was reached go past it: two workers, $0.05 each
    assert summary["usage"]["total"]["usd"] <= 0.40 + 2 * 0.05 + 1e-9



def test_a_call_refused_at_the_hard_cap_in_the_baseline_ends_the_run_as_a_budget_stop(prefect_settings,
                                                                                       in_tmp, capfd):
    """The scripted demo's baseline makes 12 calls; under budget.max_calls 5 a call is refused once 6 are
    spent (1.2 x 5). The command ends as a stop inside a step does (it once ended with an `error:` line, exit
    status 2, no STOPPED and no summary): exit status 0, STOPPED and summary.json name the budget and where,
    nothing scored, best_skill.md the starting skill. Re-run with a raised cap, the run goes on and makes as
    many calls in all as an uninterrupted run (the baseline's finished calls come from the reply store)."""
    import re
    from io import StringIO

    from skillopt.shell.cli import main

    def demo(*overrides: str, run_name: str = "baseline-stop") -> tuple[int, str, str]:
        out, err = StringIO(), StringIO()
        argv = ["demo", "--run-name", run_name, "-o", "train.epochs=1"]
        code = main([*argv, *(part for o in overrides for part in ("-o", o))], stdout=out, stderr=err)
        return code, out.getvalue(), err.getvalue()

    code, out, err = demo("budget.max_calls=5")
    assert code == 0 and "error:" not in err, err
    # The planned stop is said once, not as Prefect's ERROR lines of every task and flow it ended.
    terminal = capfd.readouterr()
    assert "BudgetExceeded" not in terminal.out + terminal.err, terminal.err
    run_dir = in_tmp / "runs" / "baseline-stop"
    message = (run_dir / "STOPPED").read_text().strip()
    assert re.fullmatch(r"budget: hard budget stop: spent \d+ calls, past 1\.2 × budget\.max_calls 5 calls "
                        r"= 6 calls; no further calls are made; stopped in the baseline evaluation, which is "
                        r"not recorded; raise budget\.max_calls and resume", message), message
    assert "run baseline-stop finished (stopped by budget)" in out and message in out
    assert "  baseline  not scored\n  best      not scored\n" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["stopped_by"], summary["stopped_message"], summary["scores"]) == ("budget", message, {})
    assert 6 <= summary["usage"]["total"]["calls"] < 12
    assert (run_dir / "best_skill.md").read_text() == (run_dir / "skills" / "step_0000.md").read_text()
    assert (run_dir / "report.html").is_file()

    code, out, err = demo("budget.max_calls=1000")
    assert code == 0, err
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["stopped_by"] is None and not (run_dir / "STOPPED").exists()
    code, _, err = demo("run.cache_dir=other-cache", "run.runs_dir=other-runs", run_name="whole")
    assert code == 0, err
    whole = json.loads((in_tmp / "other-runs" / "whole" / "summary.json").read_text())
    assert resumed["usage"]["total"]["calls"] == whole["usage"]["total"]["calls"]
    assert resumed["scores"] == whole["scores"]
