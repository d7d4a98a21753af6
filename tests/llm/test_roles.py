"""Resolving the three roles: precedence, judge inheritance, backend defaults, provenance."""

from __future__ import annotations

import pytest

from skillopt.core.config import load_config
from skillopt.core.errors import ConfigError
from skillopt.llm import anthropic, azure_openai, openai, openai_compatible
from skillopt.llm.base import BackendRegistry
from skillopt.llm.roles import CliRoleOptions, credential_state, resolve_roles

REGISTRY = BackendRegistry([openai.INFO, anthropic.INFO, openai_compatible.INFO, azure_openai.INFO])


def roles(*overrides: str, env: dict | None = None, cli: CliRoleOptions | None = None, benchmark: str = "qa"):
    env = env or {}
    loaded = load_config(benchmark, overrides=list(overrides), env=env)
    return resolve_roles(loaded, cli=cli, env=env, registry=REGISTRY)


def test_defaults_resolve_to_openai_with_its_default_model_and_key_variable():
    resolved = roles()
    assert resolved.target.backend == "openai"
    assert resolved.target.model == "gpt-4.1-mini"
    assert resolved.target.api_key_env == "OPENAI_API_KEY"
    assert resolved.target.rate_limit_key == "openai:api.openai.com"
    assert resolved.target.max_tokens == 4096 and resolved.optimizer.max_tokens == 16384
    assert resolved.target.provenance["model"] == "default"


def test_a_backend_named_explicitly_brings_its_own_default_model():
    resolved = roles("model.target.backend=anthropic")
    assert (resolved.target.backend, resolved.target.model) == ("anthropic", "claude-sonnet-4-6")
    assert resolved.target.provenance["backend"] == "-o model.target.backend"


def test_global_backend_yields_to_a_per_role_override():
    cli = CliRoleOptions(backend="anthropic")
    resolved = roles("model.optimizer.backend=openai", cli=cli)
    assert resolved.target.backend == "anthropic"
    assert resolved.optimizer.backend == "openai"
    assert resolved.target.provenance["backend"] == "cli"


def test_per_role_cli_option_beats_everything():
    cli = CliRoleOptions(
        backend="openai",
        role_backend={"target": "anthropic"},
        role_model={"target": "claude-x"},
        effort={"target": "low"},
    )
    resolved = roles("model.target.backend=openai", cli=cli)
    assert (resolved.target.backend, resolved.target.model, resolved.target.reasoning_effort) == (
        "anthropic", "claude-x", "low")


def test_environment_applies_when_yaml_is_null_and_conventional_variables_fill_the_endpoint():
    env = {"SKILLOPT_TARGET_BACKEND": "openai_compatible", "OPENAI_COMPATIBLE_BASE_URL": "http://127.0.0.1:9/v1",
           "SKILLOPT_TARGET_MODEL": "m"}
    resolved = roles(env=env)
    assert resolved.target.backend == "openai_compatible"
    assert resolved.target.base_url == "http://127.0.0.1:9/v1"
    assert resolved.target.provenance["base_url"] == "env:OPENAI_COMPATIBLE_BASE_URL"
    assert resolved.target.provenance["backend"] == "env:SKILLOPT_TARGET_BACKEND"


def test_judge_without_a_block_inherits_only_the_connection_of_the_optimizer():
    resolved = roles("model.optimizer.backend=anthropic", "model.optimizer.model=claude-opus-4",
                     "model.optimizer.max_tokens=9000", env={"ANTHROPIC_API_KEY": "x" * 20})
    judge = resolved.judge
    assert judge is not None and resolved.judge_problem is None
    assert (judge.backend, judge.model) == ("anthropic", "claude-opus-4")
    assert judge.provenance["backend"] == "inherited:optimizer"
    assert judge.max_tokens == 512 and judge.temperature == 0.0


def test_judge_without_a_credential_cannot_be_resolved_and_says_why():
    resolved = roles()
    assert resolved.judge_problem is not None
    assert "OPENAI_API_KEY" in resolved.judge_problem


def test_judge_switched_off():
    resolved = roles("model.judge=null")
    assert resolved.judge is None
    assert "switched off" in resolved.judge_problem


def test_presets_give_endpoint_and_key_variable():
    resolved = roles("model.target.backend=openai_compatible", "model.target.options.preset=vllm",
                     "model.target.model=Qwen/Qwen3-8B")
    target = resolved.target
    assert target.base_url == "http://127.0.0.1:8000/v1"
    assert target.api_key_env == "VLLM_API_KEY"
    assert target.key_required is False
    assert target.label() == "openai_compatible(vllm)/Qwen/Qwen3-8B"
    qwen = roles("model.target.backend=openai_compatible", "model.target.options.preset=qwen").target
    assert qwen.key_required is True and qwen.api_key_env == "DASHSCOPE_API_KEY"


def test_a_key_variable_the_user_names_is_required_even_where_the_preset_needs_no_key():
    """A misspelt variable sent no key and failed every call with HTTP 401, after the run had started."""
    named = roles("model.target.backend=openai_compatible", "model.target.options.preset=vllm",
                  "model.target.api_key_env=MYKEY_TYPO").target
    assert named.key_required is True and named.api_key_env == "MYKEY_TYPO"
    assert credential_state(named, {}) == "missing (env:MYKEY_TYPO)"


def test_unknown_backend_option_is_an_error_naming_its_path():
    with pytest.raises(ConfigError) as raised:
        roles("model.target.options.temprature=1")
    assert str(raised.value) == ("model.target.options.temprature: unknown option; valid options: api, "
                                 "organization, project, store (backend openai, from "
                                 "-o model.target.options.temprature)")


def test_a_mistyped_backend_option_gets_the_closest_name_and_where_it_was_set():
    with pytest.raises(ConfigError) as raised:
        roles("model.target.backend=openai_compatible", "model.target.base_url=http://127.0.0.1:8000/v1",
              "model.target.options.prest=vllm")
    assert str(raised.value) == ("model.target.options.prest: unknown option; did you mean 'preset'? "
                                 "(backend openai_compatible, from -o model.target.options.prest)")
    env = {"SKILLOPT_TARGET_BACKEND": "openai_compatible", "SKILLOPT_TARGET_PREST": "vllm",
           "OPENAI_COMPATIBLE_BASE_URL": "http://127.0.0.1:8000/v1"}
    with pytest.raises(ConfigError, match=r"did you mean 'preset'\? \(backend openai_compatible, from "
                                          r"env:SKILLOPT_TARGET_PREST\)"):
        roles(env=env)


def test_fingerprint_changes_with_what_changes_a_reply_and_never_holds_secrets():
    base = roles().target
    assert base.fingerprint() == roles().target.fingerprint()
    assert base.fingerprint() != roles("model.target.temperature=0.5").target.fingerprint()
    assert base.fingerprint() == roles("model.target.api_key_env=OTHER_KEY").target.fingerprint()


def test_credential_state_never_shows_the_value():
    target = roles().target
    assert credential_state(target, {"OPENAI_API_KEY": "sk-SENTINEL-abcdefgh"}) == "set (env:OPENAI_API_KEY)"
    assert credential_state(target, {}) == "missing (env:OPENAI_API_KEY)"


def test_a_mistyped_backend_is_one_line_naming_the_known_backends():
    with pytest.raises(ConfigError) as raised:
        roles(cli=CliRoleOptions(backend="opnai"))
    message = str(raised.value)
    assert message.startswith("--backend (or --target-backend): unknown backend 'opnai'; the backends are: ")
    assert "openai, anthropic" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"--backend \(or --judge-backend\): unknown backend 'x'"):
        roles(cli=CliRoleOptions(role_backend={"judge": "x"}))


def test_a_backend_the_registry_lacks_is_refused_like_a_typo():
    with pytest.raises(
        ConfigError, match="model.target.backend: unknown backend 'local'; the backends are: "
    ):
        roles("model.target.backend=local")


def test_demo_with_another_backend_replaces_the_scripted_roles_and_their_rules():
    registry = BackendRegistry.default()
    loaded = load_config("demo", env={})
    resolved = resolve_roles(loaded, cli=CliRoleOptions(backend="openai"), env={}, registry=registry)
    for role in (resolved.target, resolved.optimizer, resolved.judge):
        assert role is not None and role.backend == "openai" and "rules" not in role.options

    local = load_config("demo", overrides=["model.target.options.model_path=m.gguf"], env={})
    mixed = resolve_roles(local, cli=CliRoleOptions(role_backend={"target": "local"}), env={},
                          registry=registry)
    assert mixed.target.backend == "local" and mixed.target.options["model_path"] == "m.gguf"
    assert "rules" not in mixed.target.options
    assert mixed.optimizer.backend == "scripted" and mixed.optimizer.options["rules"] == "demo"  # untouched


def test_a_users_file_naming_another_backend_drops_the_options_of_the_benchmarks_own_config(tmp_path,
                                                                                            monkeypatch):
    """The demo's config read from the working directory's configs/ folder, as from the shipped copy: a file
    of the user's that names another backend drops the scripted ``rules`` it gave; the file's own options for
    the new backend stay."""
    import shutil

    from skillopt.core.resources import shipped_dir

    shutil.copytree(shipped_dir("configs"), tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "p5.yaml"
    mine.write_text("model:\n  target: {backend: openai_compatible, base_url: http://127.0.0.1:8000/v1, "
                    "options: {preset: vllm}}\n", encoding="utf-8")
    loaded = load_config("demo", config_file=mine, env={})
    assert loaded.source_of("model.target.options.rules") == "yaml:configs/demo.yaml"
    resolved = resolve_roles(loaded, env={}, registry=BackendRegistry.default())
    assert resolved.target.backend == "openai_compatible" and "rules" not in resolved.target.options
    assert resolved.target.options["preset"] == "vllm"
    assert resolved.optimizer.backend == "scripted" and resolved.optimizer.options["rules"] == "demo"


def test_an_option_the_user_gives_a_replaced_backend_is_still_checked():
    loaded = load_config("demo", overrides=["model.target.options.modle_path=m.gguf"], env={})
    with pytest.raises(ConfigError, match="model.target.options.modle_path: unknown option"):
        resolve_roles(loaded, cli=CliRoleOptions(backend="local"), env={}, registry=BackendRegistry.default())


def test_a_provider_entry_that_limits_no_role_is_an_error_naming_the_keys_the_roles_have():
    target = ("model.target.backend=openai_compatible", "model.target.base_url=http://127.0.0.1:45481/v1",
              "model.judge=null")
    with pytest.raises(ConfigError) as raised:
        roles(*target, 'model.providers={"openai_compatible:127.0.0.1": {max_concurrency: 1}}')
    assert str(raised.value) == (
        "model.providers: 'openai_compatible:127.0.0.1' (from -o model.providers) limits no role; the roles' "
        "keys are openai_compatible:127.0.0.1:45481 (target), openai:api.openai.com (optimizer); a key is "
        "<backend>:<host[:port]> or a role's rate_limit_key")
    limited = roles(*target, 'model.providers={"openai_compatible:127.0.0.1:45481": {max_concurrency: 1}}')
    assert limited.target.rate_limit_key == "openai_compatible:127.0.0.1:45481"


def test_a_provider_entry_for_a_mistyped_rate_limit_key_is_an_error_and_a_matching_one_is_not(tmp_path):
    shared = ("model.target.rate_limit_key=llama", "model.optimizer.rate_limit_key=llama")
    assert roles(*shared, "model.providers.llama.max_concurrency=1").judge is not None
    path = tmp_path / "mine.yaml"
    path.write_text("model:\n  providers:\n    lama: {max_concurrency: 1}\n", encoding="utf-8")
    loaded = load_config("qa", config_file=path, overrides=list(shared), env={})
    with pytest.raises(ConfigError, match=r"^model\.providers: 'lama' \(from yaml:.*mine\.yaml\) limits no "
                                          r"role; the roles' keys are llama \(target, optimizer\), "
                                          r"openai:api\.openai\.com \(judge\);"):
        resolve_roles(loaded, env={}, registry=REGISTRY)


def test_a_provider_entry_for_a_named_target_is_in_use():
    small = ("model.targets={small: {backend: openai_compatible, base_url: 'http://127.0.0.1:9000/v1', "
             "model: s}}")
    resolved = roles(small, "model.providers={'openai_compatible:127.0.0.1:9000': {max_concurrency: 1}}")
    assert resolved.target.backend == "openai"
    with pytest.raises(ConfigError, match=r"openai_compatible:127\.0\.0\.1:9000 \(targets\.small\)"):
        roles(small, "model.providers={'openai_compatible:127.0.0.1:9001': {max_concurrency: 1}}")
