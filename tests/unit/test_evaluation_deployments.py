"""The evaluation deployments `skillopt serve` registers beside skill-train/<benchmark>: skill-eval/<b>,
skill-compare/<b> and skill-transfer/matrix, with typed, described Run forms."""

from __future__ import annotations

from skillopt.deployments.decisions import deployment_names
from skillopt.deployments.serve import evaluation_deployments, run_defaults


def test_eval_compare_per_benchmark_and_one_scheduled_transfer_over_the_common_targets():
    deployments = evaluation_deployments(["demo"], run_defaults(overrides=["evaluation.test_size=6"]))
    names = [f"{d.flow_name}/{d.name}" for d in deployments]
    assert names == ["skill-eval/demo", "skill-compare/demo", "skill-transfer/matrix"]
    assert names == deployment_names(["demo"])
    evaluate, compare, transfer = deployments
    assert evaluate.parameters == {"benchmark": "demo", "skill_file": "registry:",
                                   "overrides": ["evaluation.test_size=6"]}
    assert compare.parameters["skill_a"] == "initial" and compare.parameters["skill_b"] == "registry:"
    assert transfer.parameters["targets"] == ["scripted_a", "scripted_b"]  # what configs/demo.yaml defines
    assert transfer.parameters["benchmarks"] == ["demo"]
    assert not evaluate.schedules and not compare.schedules
    (schedule,) = transfer.schedules
    assert schedule.schedule.cron == "0 3 * * *"
    for deployment in deployments:
        assert deployment.concurrency_limit == 1
        properties = deployment._parameter_openapi_schema.model_dump()["properties"]
        for name, field in properties.items():
            assert field.get("description"), f"{deployment.flow_name}: {name} has no description"


def test_without_named_targets_the_transfer_deployment_waits_for_its_form(tmp_path):
    config = tmp_path / "plain.yaml"
    config.write_text("model:\n  targets: {}\n", encoding="utf-8")
    *_, transfer = evaluation_deployments(["demo"], run_defaults(config_file=str(config)), cron=None)
    assert transfer.parameters["targets"] == [] and not transfer.schedules
