"""`skillopt serve` deployments and `skillopt skills`: what a person gets in the Prefect UI and at the
shell."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from skillopt.core.errors import ConfigError, in_deployment_terms
from skillopt.deployments.serve import (
    build_deployments,
    registered_benchmarks,
    run_defaults,
    servable_benchmarks,
)
from skillopt.shell.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_one_nightly_deployment_per_benchmark_with_a_concurrency_limit_of_one():
    deployments = build_deployments(["demo", "qa"], run_defaults())
    assert [d.name for d in deployments] == ["demo", "qa"]
    demo = deployments[0]
    assert demo.flow_name == "skill-train"  # so the full name is skill-train/demo
    assert demo.entrypoint == "skillopt.flows.train.skill_train"
    assert demo.concurrency_limit == 1
    (schedule,) = demo.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone) == ("0 3 * * *", "UTC")
    assert demo.parameters == {"benchmark": "demo", "mode": "nightly"}


def test_every_form_field_of_the_deployment_is_typed_and_described():
    (deployment,) = build_deployments(["demo"], run_defaults(overrides=["train.epochs=1"]), cron=None)
    assert deployment.schedules in (None, [])
    assert deployment.parameters["overrides"] == ["train.epochs=1"]
    schema = deployment._parameter_openapi_schema.model_dump()
    properties = schema["properties"]
    assert set(properties) >= {"benchmark", "data", "config_file", "overrides", "run_name", "cli_roles",
                               "mode", "verbose", "epochs", "batch_size", "learning_rate", "skill", "backend",
                               "model", "target_backend", "target_model", "optimizer_backend",
                               "optimizer_model", "judge_backend", "judge_model"}
    for name, field in properties.items():
        assert field.get("description"), f"{name} has no description in the UI form"
        assert "§" not in field["description"], f"{name}: the description cites a design document"
        assert "type" in field or "anyOf" in field, f"{name} has no type"
    for name in ("epochs", "batch_size", "learning_rate"):
        assert properties[name]["anyOf"][0] == {"type": "integer"}, name
    # The common choices come first in the form, the catch-all overrides after them.
    order = [properties[name]["position"] for name in ("benchmark", "data", "epochs", "backend", "overrides")]
    assert order == sorted(order)
    assert properties["mode"]["enum"] == ["train", "nightly"]
    assert properties["overrides"]["anyOf"][0] == {"items": {"type": "string"}, "type": "array"}
    assert properties["data"]["anyOf"][0] == {"type": "string"}
    roles = schema["definitions"]["CliRoleOptions"]["properties"]
    assert roles["backend"]["anyOf"][0] == roles["model"]["anyOf"][0] == {"type": "string"}


def test_data_backend_model_config_and_overrides_become_the_default_parameters(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(FIXTURES.parent.parent)
    config = tmp_path / "mine.yaml"
    config.write_text("train:\n  epochs: 1\n")
    defaults = run_defaults(mode="train", data="tests/fixtures/babyvision", config_file=str(config),
                            overrides=["optimizer.learning_rate=2"],
                            cli_roles={"backend": "scripted", "model": None, "role_backend": {},
                                       "effort": {}})
    (deployment,) = build_deployments(["babyvision"], defaults)
    assert deployment.parameters == {
        "benchmark": "babyvision", "mode": "train", "data": str(FIXTURES / "babyvision"),
        "config_file": str(config), "overrides": ["optimizer.learning_rate=2"], "backend": "scripted",
    }
    (deployment,) = build_deployments(["demo"], run_defaults(cli_roles={
        "backend": "openai", "model": "gpt-4.1-mini", "role_backend": {"judge": "anthropic"},
        "role_model": {"target": "m1"}, "effort": {"optimizer": "high"}}))
    assert deployment.parameters == {
        "benchmark": "demo", "mode": "nightly", "backend": "openai", "model": "gpt-4.1-mini",
        "judge_backend": "anthropic", "target_model": "m1", "cli_roles": {"effort": {"optimizer": "high"}}}
    assert servable_benchmarks(["babyvision"], defaults) == (["babyvision"], [])


def test_serve_with_no_names_serves_what_has_data_and_says_why_it_skips_the_rest(monkeypatch, tmp_path: Path):
    monkeypatch.chdir(tmp_path)  # no data/ folder here: only the generated demo has data
    served, skipped = servable_benchmarks([], run_defaults())
    assert served == ["demo"]
    reasons = {skip.benchmark: skip.reason for skip in skipped}
    assert set(reasons) == set(registered_benchmarks()) - {"demo"}
    assert "no data at data/babyvision" in reasons["babyvision"]
    assert reasons["qa"] == "qa: no data: pass --data FILE or set benchmark.data_path"


def test_serve_refuses_a_benchmark_without_data_unknown_names_and_data_for_several(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="skillopt serve babyvision: babyvision: no data at data/"):
        servable_benchmarks(["babyvision"], run_defaults())
    with pytest.raises(ConfigError, match="unknown benchmark 'nosuch'; registered benchmarks: .*demo"):
        servable_benchmarks(["demo", "nosuch"], run_defaults())
    with pytest.raises(ConfigError, match="--data is one benchmark's data: name exactly that benchmark"):
        servable_benchmarks(["demo", "qa"], run_defaults(data=str(tmp_path)))
    with pytest.raises(ConfigError, match="--data: nothing at"):
        servable_benchmarks(["qa"], run_defaults(data="missing.jsonl"))


def test_a_deployment_run_is_told_which_parameter_to_set_never_a_command_line_option(monkeypatch, tmp_path):
    """Every plug-in's complaint about missing data, in a deployment's terms."""
    monkeypatch.chdir(tmp_path)
    _, skipped = servable_benchmarks([], run_defaults())
    assert len(skipped) == len(registered_benchmarks()) - 1
    flags = re.compile(r"(?<![\w-])(--data|--backend|--model|--run-name|--no-cache|-c FILE|-o)\b")
    for skip in skipped:
        assert flags.search(skip.reason), skip.reason  # the command line's wording names a flag ...
        reworded = in_deployment_terms(skip.reason)
        assert not flags.search(reworded), reworded  # ... a deployment run's names the parameter
        assert "deployment parameter data" in reworded, reworded
    assert in_deployment_terms("babyvision: no data at x; download it and pass --data DIR") == \
        "babyvision: no data at x; download it and set the deployment parameter data to DIR"
    assert in_deployment_terms("-o benchmark.nosuch: unknown key; choose another name with --run-name") == (
        "the overrides entry benchmark.nosuch: unknown key; choose another name with the deployment "
        "parameter run_name")
    assert in_deployment_terms("set --judge-backend or --backend") == (
        "set the deployment parameter judge_backend or the deployment parameter backend")
    from skillopt.flows.parameters import CONFIG_PARAMETERS

    named = "train.epochs: Input should be greater than or equal to 1 (from -o train.epochs)"
    assert in_deployment_terms(named, CONFIG_PARAMETERS) == (
        "train.epochs: Input should be greater than or equal to 1 (from the deployment parameter epochs (or "
        "the overrides entry train.epochs))")


def test_a_bad_schedule_is_refused_with_the_expected_form():
    with pytest.raises(ConfigError, match="not a valid schedule: cron 'every night'"):
        build_deployments(["demo"], run_defaults(), cron="every night")
    with pytest.raises(ConfigError, match="time zone 'Mars/Base'"):
        build_deployments(["demo"], run_defaults(), timezone="Mars/Base")


def test_serve_without_a_prefect_server_and_no_local_one_allowed_says_what_to_set(monkeypatch, tmp_path):
    """Without an API, serve starts the local server (tests/integration/test_background_server.py); where
    SKILLOPT_PREFECT_SERVER=temporary forbids that, it cannot serve on a server that ends with the command."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("SKILLOPT_PREFECT_SERVER", "temporary")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))  # no local server recorded there
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        code, _, err = run_cli("serve", "demo")
    assert code == 2
    assert "SKILLOPT_PREFECT_SERVER=temporary" in err and "set PREFECT_API_URL" in err, err
    assert not (tmp_path / "prefect-home" / "skillopt-server.json").exists()


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
    assert sorted(p.name for p in (tmp_path / "skills" / "demo" / "versions").iterdir()) == [
        "0001.md",
        "0002.md",
    ]


def test_skills_commands_name_what_is_missing(tmp_path: Path):
    registry = str(tmp_path / "skills")
    code, _, err = run_cli("skills", "show", "demo", "--skills-dir", registry)
    assert code == 2 and "nothing is promoted" in err
    code, _, err = run_cli("skills", "promote", "demo", str(tmp_path / "missing"), "--skills-dir", registry)
    assert code == 2 and "no skill at" in err


def test_skills_promote_refuses_a_file_that_is_not_a_markdown_skill(tmp_path: Path):
    """A skill is a markdown document: a .py, a .json or a binary file is refused in one line naming it, and
    so is a .md that is not UTF-8 text or holds binary content; nothing is promoted."""
    registry = str(tmp_path / "skills")
    files = {"helper.py": b"print('hi')\n", "skill.json": b'{"a": 1}\n', "logo.png": b"\x89PNG\r\n\x00\x01",
             "latin.md": b"# Caf\xe9\n", "nul.md": b"# a\x00b\n"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        code, out, err = run_cli("skills", "promote", "demo", str(tmp_path / name), "--skills-dir", registry)
        assert code == 2 and out == "", name
        assert err.count("\n") == 1 and name in err and "Traceback" not in err, err
        if not name.endswith(".md"):
            assert "not a markdown file" in err, err
    assert not (tmp_path / "skills").exists()
    (tmp_path / "upper.MD").write_text("# Skill\n")
    assert run_cli("skills", "promote", "demo", str(tmp_path / "upper.MD"), "--skills-dir", registry)[0] == 0


def test_skills_dir_comes_from_the_config_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.md").write_text("# Skill\n")
    assert run_cli("skills", "promote", "demo", "s.md", "-o", "run.skills_dir=reg")[0] == 0
    assert (tmp_path / "reg" / "demo" / "current.md").is_file()
