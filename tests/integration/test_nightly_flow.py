"""`mode: nightly` of skill-train on the demo: warm start from the promoted skill, promote only a better
one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skillopt.benchmarks.demo import plugin
from skillopt.run.registry import SkillRegistry
from skillopt.skill.document import skill_hash

pytestmark = pytest.mark.slow

SMALL = ["train.epochs=1"]


def nightly(run_name: str) -> dict:
    from skillopt.flows.train import skill_train

    return skill_train(benchmark="demo", overrides=SMALL, run_name=run_name, mode="nightly")


def test_nightly_warm_starts_from_the_promoted_skill_and_compares_like_for_like(
    prefect_settings, in_tmp: Path
):
    registry = SkillRegistry(in_tmp / "skills")
    initial = (plugin.prompts_dir / "initial_skill.md").read_text()
    registry.promote("demo", initial, source="test", reason="the starting point")

    first = nightly("nightly-1")
    run_dir = Path(first["run_dir"])
    assert skill_hash((run_dir / "skills" / "step_0000.md").read_text()) == skill_hash(initial)
    decision = first["promotion"]
    assert decision == json.loads((run_dir / "promotion.json").read_text())
    # The incumbent's score is the baseline of this very run; the candidate's is the best's.
    assert decision["incumbent_score"] == first["scores"]["baseline"]["selection"]["hard"]
    assert decision["candidate_score"] == first["scores"]["best"]["selection"]["hard"]
    assert decision["action"] == "promote" and (decision["version"], decision["previous"]) == (2, 1)
    assert registry.current("demo").text == (run_dir / "best_skill.md").read_text()

    second = nightly("nightly-2")
    second_dir = Path(second["run_dir"])
    assert skill_hash((second_dir / "skills" / "step_0000.md").read_text()) == \
        skill_hash(registry.version_text("demo", 2))
    again = second["promotion"]
    assert again["incumbent_score"] == pytest.approx(decision["candidate_score"])
    assert again["previous"] == 2
    if again["action"] == "keep":
        assert (
            again["candidate_score"] <= again["incumbent_score"]
            or again["candidate_sha"] == again["skill_sha"]
        )
        assert registry.current("demo").version == 2
    else:
        assert again["candidate_score"] > again["incumbent_score"]
    assert [e.action for e in registry.history("demo")][:2] == ["promote", "promote"]
    assert len(registry.history("demo")) == 3


def test_train_mode_ignores_the_registry(prefect_settings, in_tmp: Path):
    from skillopt.flows.train import skill_train

    SkillRegistry(in_tmp / "skills").promote("demo", "# A promoted skill\n", source="test", reason="test")
    summary = skill_train(
        benchmark="demo",
        overrides=[*SMALL, "benchmark.train_size=8", "evaluation.eval_test=false"],
        run_name="plain",
    )  # one step is enough to see where it started
    initial = (plugin.prompts_dir / "initial_skill.md").read_text()
    assert skill_hash((Path(summary["run_dir"]) / "skills" / "step_0000.md").read_text()) == skill_hash(
        initial
    )
    assert "promotion" not in summary
    assert len(SkillRegistry(in_tmp / "skills").history("demo")) == 1
