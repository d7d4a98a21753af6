"""A run directory records the models its run calls: a backend or model chosen on the command line, or an
endpoint taken from the environment, is in ``config.yaml`` (and its hash) and in ``summary.json``'s config,
not the config file's choice that the run did not use."""

from __future__ import annotations

import pytest
import yaml

from skillopt.core.config import load_config
from skillopt.core.errors import ConfigError
from skillopt.llm.base import BackendRegistry
from skillopt.llm.roles import CliRoleOptions, recorded_config, resolve_roles
from skillopt.run.assembly import Run, RunSpec


def _loaded(tmp_path, *extra):
    return load_config("demo", overrides=[f"run.runs_dir={tmp_path / 'runs'}",
                                          f"run.cache_dir={tmp_path / 'cache'}", *extra], env={})


def _build(tmp_path, loaded, **cli_roles) -> Run:
    return Run.build(RunSpec.create(loaded, run_name="models", cli_roles=cli_roles), env={}, loaded=loaded)


def test_config_yaml_names_the_model_the_command_line_chose(tmp_path):
    loaded = _loaded(tmp_path)
    run = _build(tmp_path, loaded, model="model-a")
    recorded = yaml.safe_load(run.dir.config_path.read_text())
    for role in ("target", "optimizer", "judge"):
        assert recorded["model"][role]["model"] == "model-a"
        assert recorded["sources"][f"model.{role}.model"] == "cli"
    assert run.recorded_config.model.target.model == "model-a"
    assert loaded.config.model.target.model is None  # the loaded config itself is left as it was


def test_a_resume_with_another_model_is_refused_naming_the_change(tmp_path):
    loaded = _loaded(tmp_path)
    run = _build(tmp_path, loaded, model="model-a")
    run.dir.write_skill_snapshot(0, run.initial_skill)
    run.dir.history_path.write_text("")  # the run recorded a step: it holds results to keep
    with pytest.raises(ConfigError, match=r"changed: model\.judge\.model, model\.optimizer\.model, "
                                          r"model\.target\.model; resume it with the same config"):
        _build(tmp_path, loaded, model="model-b")
    with pytest.raises(ConfigError, match=r"changed: model\.judge\.model, model\.optimizer\.model, "
                                          r"model\.target\.model;"):
        _build(tmp_path, loaded)  # the flag forgotten: the config file's model is another one
    assert _build(tmp_path, loaded, model="model-a").dir.path == run.dir.path  # the same flags resume it


def test_a_backend_chosen_on_the_command_line_replaces_the_file_s_and_its_options(tmp_path):
    model_file = tmp_path / "tiny.gguf"
    model_file.write_bytes(b"GGUF")
    loaded = _loaded(tmp_path, f"model.target.options.model_path={model_file}")
    roles = resolve_roles(loaded, cli=CliRoleOptions(role_backend={"target": "local"}), env={},
                          registry=BackendRegistry.default())
    recorded = recorded_config(loaded, roles)
    target = recorded.config.model.target
    assert target.backend == "local" and target.options == {"model_path": str(model_file)}
    assert recorded.sources["model.target.backend"] == "cli"
    assert "model.target.options.rules" not in recorded.sources  # the demo's scripted rules were not used
    assert loaded.config.model.target.backend == "scripted"
    assert recorded.config.model.optimizer == loaded.config.model.optimizer


def test_an_endpoint_from_the_environment_is_recorded(tmp_path):
    loaded = _loaded(tmp_path, "model.target.backend=openai", "model.target.model=gpt-4.1-mini")
    roles = resolve_roles(loaded, env={"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"},
                          registry=BackendRegistry.default())
    recorded = recorded_config(loaded, roles)
    assert recorded.config.model.target.base_url == "http://127.0.0.1:8080/v1"
    assert recorded.sources["model.target.base_url"] == "env:OPENAI_BASE_URL"


def test_without_choices_outside_the_config_the_record_is_the_config_and_its_hash_unchanged(tmp_path):
    loaded = _loaded(tmp_path)
    roles = resolve_roles(loaded, env={}, registry=BackendRegistry.default())
    assert recorded_config(loaded, roles) is loaded
