"""`skillopt serve` deployments and `skillopt skills`: what a person gets in the Prefect UI and at the shell."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from skillopt.cli import main
from skillopt.deployments.serve import build_deployments, chosen_benchmarks, registered_benchmarks
from skillopt.errors import ConfigError


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_one_nightly_deployment_per_benchmark_with_a_concurrency_limit_of_one():
    deployments = build_deployments(["demo", "qa"])
    assert [d.name for d in deployments] == ["demo", "qa"]
    demo = deployments[0]
    assert demo.flow_name == "skill-train"  # so the full name is skill-train/demo
    assert demo.entrypoint == "skillopt.flows.train.skill_train"
    assert demo.concurrency_limit == 1
    (schedule,) = demo.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone) == ("0 3 * * *", "UTC")
    assert demo.parameters == {"benchmark": "demo", "mode": "nightly"}


def test_every_form_field_of_the_deployment_is_typed_and_described():
    (deployment,) = build_deployments(["demo"], cron=None, overrides=["train.epochs=1"])
    assert deployment.schedules in (None, [])
    assert deployment.parameters["overrides"] == ["train.epochs=1"]
    schema = deployment._parameter_openapi_schema.model_dump()
    properties = schema["properties"]
    assert set(properties) >= {"benchmark", "config_file", "overrides", "run_name", "cli_roles", "mode"}
    for name, field in properties.items():
        assert field.get("description"), f"{name} has no description in the UI form"
        assert "type" in field or "anyOf" in field, f"{name} has no type"
    assert properties["mode"]["enum"] == ["train", "nightly"]
    assert properties["overrides"]["anyOf"][0] == {"items": {"type": "string"}, "type": "array"}


def test_serving_every_registered_benchmark_and_unknown_names_are_refused():
    assert chosen_benchmarks([]) == registered_benchmarks()
    assert "demo" in registered_benchmarks()
    with pytest.raises(ConfigError, match="unknown benchmark 'nosuch'; registered benchmarks: .*demo"):
        chosen_benchmarks(["demo", "nosuch"])


def test_a_bad_schedule_is_refused_with_the_expected_form():
    with pytest.raises(ConfigError, match="not a valid schedule: cron 'every night'"):
        build_deployments(["demo"], cron="every night")
    with pytest.raises(ConfigError, match="time zone 'Mars/Base'"):
        build_deployments(["demo"], timezone="Mars/Base")


def test_serve_without_a_prefect_server_says_what_to_set():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        code, _, err = run_cli("serve", "demo")
    assert code == 2
    assert "set PREFECT_API_URL" in err


def test_skills_promote_list_show_and_rollback_by_hand(tmp_path: Path):
    registry = str(tmp_path / "skills")
    first = tmp_path / "first.md"
    first.write_text("# Skill one\n")
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "best_skill.md").write_text("# Skill two\n")
    (run_dir / "summary.json").write_text(json.dumps(
        {"run_name": "r1", "scores": {"best": {"selection": {"hard": 0.75, "soft": 0.8}}}}))

    assert run_cli("skills", "promote", "demo", str(first), "--skills-dir", registry)[0] == 0
    code, out, _ = run_cli("skills", "promote", "demo", str(run_dir), "--skills-dir", registry)
    assert code == 0 and "version 2 is current (was 1)" in out
    assert (tmp_path / "skills" / "demo" / "current.md").read_text() == "# Skill two\n"

    code, out, _ = run_cli("skills", "list", "--skills-dir", registry)
    assert code == 0 and out.startswith("demo") and "version 2" in out
    code, out, _ = run_cli("skills", "list", "demo", "--skills-dir", registry)
    assert "* version 2" in out and "(run r1)" in out

    assert run_cli("skills", "show", "demo", "--skills-dir", registry)[1] == "# Skill two\n"
    code, out, _ = run_cli("skills", "rollback", "demo", "--skills-dir", registry)
    assert code == 0 and "from version 2 to version 1" in out
    assert run_cli("skills", "show", "demo", "--skills-dir", registry)[1] == "# Skill one\n"
    assert run_cli("skills", "show", "demo", "--version", "2", "--skills-dir", registry)[1] == "# Skill two\n"

    code, _, err = run_cli("skills", "rollback", "demo", "--skills-dir", registry)
    assert code == 2 and "no earlier version" in err
    # Nothing was lost: both versions and every decision are on disk.
    history = (tmp_path / "skills" / "demo" / "history.jsonl").read_text().splitlines()
    assert [json.loads(x)["action"] for x in history] == ["promote", "promote", "rollback"]
    assert sorted(p.name for p in (tmp_path / "skills" / "demo" / "versions").iterdir()) == ["0001.md", "0002.md"]


def test_skills_commands_name_what_is_missing(tmp_path: Path):
    registry = str(tmp_path / "skills")
    code, _, err = run_cli("skills", "show", "demo", "--skills-dir", registry)
    assert code == 2 and "nothing is promoted" in err
    code, _, err = run_cli("skills", "promote", "demo", str(tmp_path / "missing"), "--skills-dir", registry)
    assert code == 2 and "no skill at" in err


def test_skills_dir_comes_from_the_config_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.md").write_text("# Skill\n")
    assert run_cli("skills", "promote", "demo", "s.md", "-o", "run.skills_dir=reg")[0] == 0
    assert (tmp_path / "reg" / "demo" / "current.md").is_file()
