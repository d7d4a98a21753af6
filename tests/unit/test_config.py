"""Configuration: layering, typed overrides, provenance, and errors that name key and source."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from skillopt.core.config import (
    BenchmarkSection,
    SkillOptConfig,
    find_benchmark_config,
    flatten,
    load_config,
    load_config_file,
)
from skillopt.core.errors import ConfigError
from skillopt.core.resources import shipped_config_names, shipped_dir

SENTINEL = "sk-SENTINEL-7f3a9c1e5b2d4a6f"

ALL_BENCHMARKS = [
    "qa", "searchqa", "livemathematicianbench", "docvqa", "babyvision", "mathverse", "mmrb", "officeqa",
    "sealqa", "spreadsheetbench", "swebench", "alfworld", "demo",
]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_every_benchmark_has_a_shipped_config_that_loads_without_its_code():
    assert set(ALL_BENCHMARKS) <= set(shipped_config_names())
    for name in ALL_BENCHMARKS:
        loaded = load_config(name, env={})
        assert loaded.config.benchmark.name == name
        assert loaded.config.benchmark.split_mode in ("split_dir", "ratio", "generated")


def test_shipped_base_repeats_the_built_in_defaults_exactly():
    base = yaml.safe_load((shipped_dir("configs") / "_base_.yaml").read_text(encoding="utf-8"))
    defaults = flatten(SkillOptConfig().model_dump(mode="json"))
    for dotted, value in flatten(base).items():
        if dotted.startswith(("model.target.", "model.optimizer.")) and value is None:
            continue  # role fields stay null in _base_ on purpose: "defer to the next layer"
        assert dotted in defaults, f"_base_.yaml has {dotted}, which is not a config key"
        assert defaults[dotted] == value, (
            f"_base_.yaml {dotted}={value!r} but the default is {defaults[dotted]!r}"
        )


def test_benchmark_values_from_its_file_and_provenance_names_the_file():
    loaded = load_config("searchqa", env={})
    assert loaded.config.benchmark.workers == 24
    assert loaded.config.benchmark.model_extra == {"max_context_chars": 6000}
    assert loaded.source_of("benchmark.workers") == "shipped:configs/searchqa.yaml"
    assert loaded.source_of("train.epochs") == "shipped:configs/_base_.yaml"
    assert loaded.source_of("model.target.model") == "default"


def test_override_converts_by_field_type():
    loaded = load_config(
        "searchqa",
        overrides=[
            "optimizer.learning_rate=8",
            "benchmark.split_ratio=1:1:1",
            "evaluation.gate_mixed_weight=0.25",
            "model.target.extra_body={top_k: 20}",
            "model.target.options.thinking=on",
            "train.skill_init=null",
            "run.run_name=null",
        ],
        env={},
    )
    cfg = loaded.config
    assert cfg.optimizer.learning_rate == 8
    assert cfg.benchmark.split_ratio == "1:1:1"
    assert cfg.evaluation.gate_mixed_weight == 0.25
    assert cfg.model.target.extra_body == {"top_k": 20}
    assert cfg.model.target.options == {"thinking": "on"}  # YAML 1.2: `on` is not a boolean
    assert cfg.train.skill_init is None
    assert loaded.source_of("optimizer.learning_rate") == "-o optimizer.learning_rate"


def test_string_field_keeps_raw_text_even_when_it_looks_like_null_free_text():
    cfg = load_config("qa", overrides=["train.skill_init=skills/start.md", "run.run_name=007"], env={}).config
    assert cfg.train.skill_init == "skills/start.md"
    assert cfg.run.run_name == "007"


@pytest.mark.parametrize("benchmark,key,text", [
    ("alfworld", "alfworld_data", "2024"), ("mathverse", "problem_version", "007"),
    ("swebench", "hf_split", "2024"), ("qa", "data_root", "2024"), ("qa", "fields.question", "007"),
])
def test_a_plugin_string_key_keeps_the_raw_text_of_an_override(benchmark, key, text):
    from skillopt.benchmarks.base import benchmark_config, load_benchmark

    loaded = load_config(benchmark, overrides=[f"benchmark.{key}={text}"], env={})
    typed = benchmark_config(load_benchmark(benchmark), loaded.config.benchmark, loaded.source_of)
    value: object = typed
    for part in key.split("."):
        value = getattr(value, part)
    assert value == text


def test_a_plugin_number_key_is_still_read_as_a_number():
    loaded = load_config("swebench", overrides=["benchmark.step_limit=20"], env={})
    assert loaded.config.benchmark.model_extra["step_limit"] == 20


def test_overrides_apply_in_order():
    cfg = load_config("qa", overrides=["train.epochs=2", "train.epochs=3"], env={}).config
    assert cfg.train.epochs == 3


@pytest.mark.parametrize(
    "text,expected", [("yes", True), ("NO", False), ("1", True), ("0", False), ("True", True)]
)
def test_booleans_accept_true_false_yes_no_1_0_in_any_case(text, expected):
    cfg = load_config("qa", overrides=[f"evaluation.use_gate={text}"], env={}).config
    assert cfg.evaluation.use_gate is expected


def test_booleans_refuse_other_words():
    with pytest.raises(ConfigError, match=r"evaluation\.use_gate: expected a boolean"):
        load_config("qa", overrides=["evaluation.use_gate=on"], env={})


def test_wrong_type_names_key_and_override():
    with pytest.raises(ConfigError) as info:
        load_config("searchqa", overrides=["optimizer.learning_rate=abc"], env={})
    message = str(info.value)
    assert "optimizer.learning_rate" in message
    assert "-o optimizer.learning_rate" in message
    assert "abc" not in message


def test_typo_suggests_the_closest_key():
    with pytest.raises(
        ConfigError, match=r"optimizer\.learnin_rate: unknown key; did you mean 'learning_rate'\?"
    ):
        load_config("searchqa", overrides=["optimizer.learnin_rate=8"], env={})


def test_a_typo_in_an_entry_of_a_mapping_of_sections_suggests_the_closest_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config("searchqa", overrides=['model.providers={"k": {rmp: 5}}'], env={})
    assert str(info.value) == ("model.providers.k.rmp: unknown key; did you mean 'rpm'? "
                               "(from -o model.providers)")
    path = write(tmp_path / "my.yaml",
                 "_base_: searchqa.yaml\nmodel:\n  targets:\n    small: {bakend: openai}\n")
    with pytest.raises(ConfigError, match=r"model\.targets\.small\.bakend: unknown key; did you mean "
                                          r"'backend'\? \(from yaml:"):
        load_config_file(path, env={})


def test_unknown_section_suggests_the_closest_section(tmp_path):
    path = write(tmp_path / "my.yaml", "optimiser:\n  learning_rate: 3\n")
    with pytest.raises(ConfigError, match=r"optimiser: unknown key; did you mean 'optimizer'\?"):
        load_config_file(path, env={})


def test_unknown_key_in_yaml_names_the_file(tmp_path):
    path = write(tmp_path / "my.yaml", "_base_: searchqa.yaml\ngradient:\n  minibatch: 4\n")
    with pytest.raises(ConfigError) as info:
        load_config_file(path, env={})
    assert "gradient.minibatch: unknown key; did you mean 'minibatch_size'?" in str(info.value)
    assert "my.yaml" in str(info.value)


def test_unknown_enum_value_lists_the_allowed_values():
    with pytest.raises(ConfigError) as info:
        load_config("qa", overrides=["optimizer.lr_scheduler=cosin"], env={})
    assert "'constant', 'linear' or 'cosine'" in str(info.value)


def test_out_of_range_value_is_an_error_naming_the_key():
    with pytest.raises(
        ConfigError, match=r"gradient\.merge_batch_size: Input should be greater than or equal to 2"
    ):
        load_config("qa", overrides=["gradient.merge_batch_size=1"], env={})


@pytest.mark.parametrize(("url", "problem"), [
    ("http://localhost:99999/v1", "port out of range 0-65535"),
    ("http://localhost:abc/v1", "port could not be cast to integer value as 'abc'"),
    ("htp://127.0.0.1:8000/v1", "is not an http:// or https:// URL"),
    ("localhost:8000", "is not an http:// or https:// URL"),
    ("http:///v1", "names no host"),
])
def test_a_base_url_that_no_http_client_can_call_is_an_error_naming_the_key(url, problem):
    with pytest.raises(ConfigError) as info:
        load_config("qa", overrides=[f"model.optimizer.base_url={url}"], env={})
    assert str(info.value).startswith(f"model.optimizer.base_url: {url!r}"), str(info.value)
    assert problem in str(info.value) and "(from -o model.optimizer.base_url)" in str(info.value)
    assert load_config("qa", overrides=["model.optimizer.base_url=https://example.test:8443/v1"],
                       env={}).config.model.optimizer.base_url == "https://example.test:8443/v1"


def test_min_learning_rate_above_learning_rate_names_both_keys_and_their_sources():
    with pytest.raises(ConfigError) as info:
        load_config("qa", overrides=["optimizer.learning_rate=1"], env={})
    assert str(info.value) == (
        "optimizer.learning_rate 1 (from -o optimizer.learning_rate) is below optimizer.min_learning_rate 2 "
        "(from shipped:configs/_base_.yaml): lower optimizer.min_learning_rate or raise "
        "optimizer.learning_rate")
    with pytest.raises(ConfigError) as info:
        load_config("qa", overrides=["optimizer.min_learning_rate=9"], env={})
    assert str(info.value).startswith("optimizer.learning_rate 4 (from shipped:configs/_base_.yaml) is below "
                                      "optimizer.min_learning_rate 9 (from -o optimizer.min_learning_rate)")


@pytest.mark.parametrize("ratio,message", [
    ("banana", "must be three non-negative integers 'train:val:test' such as '2:1:7'"),
    ("0:0:0", "has weights summing to 0"),
])
def test_a_malformed_split_ratio_is_an_error_when_the_config_loads(tmp_path, ratio, message):
    path = write(tmp_path / "sr.yaml",
                 f"benchmark: {{split_mode: ratio, data_path: x.json, split_ratio: '{ratio}'}}\n")
    expected = rf"^benchmark\.split_ratio: .*{message}.*\(from yaml:\S*sr\.yaml\)$"
    with pytest.raises(ConfigError, match=expected):
        load_config_file(path, env={})


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(
        tmp_path / "bad.yaml", "train: {epochs: 0, batch_size: many}\noptimizer: {lr_scheduler: steps}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config_file(path, env={})
    message = str(info.value)
    for key in ("train.epochs", "train.batch_size", "optimizer.lr_scheduler"):
        assert key in message


def test_quoted_number_is_not_silently_coerced(tmp_path):
    path = write(tmp_path / "my.yaml", 'train:\n  epochs: "4"\n')
    with pytest.raises(ConfigError, match=r"train\.epochs: Input should be a valid integer"):
        load_config_file(path, env={})


def test_yaml_is_read_with_core_1_2_rules(tmp_path):
    path = write(
        tmp_path / "my.yaml",
        "benchmark:\n  split_ratio: 2:1:7\n  split_seed: 010\n  flag_word: yes\n  when: 2026-01-02\n",
    )
    cfg = load_config_file(path, env={}).config
    assert cfg.benchmark.split_ratio == "2:1:7"  # not the sexagesimal 7267
    assert cfg.benchmark.split_seed == 10  # not octal 8
    assert cfg.benchmark.model_extra == {"flag_word": "yes", "when": "2026-01-02"}


def test_duplicate_key_in_yaml_is_an_error_with_its_line(tmp_path):
    path = write(tmp_path / "dup.yaml", "train:\n  epochs: 2\n  epochs: 3\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml: line 3.*duplicate key 'epochs'"):
        load_config_file(path, env={})


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path / "broken.yaml", "train:\n  epochs: [1, 2\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: line \d+"):
        load_config_file(path, env={})


def test_non_utf8_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / "latin.yaml"
    path.write_bytes("run:\n  run_name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin\.yaml: not UTF-8 text \(invalid byte at offset \d+\)"):
        load_config_file(path, env={})


def test_top_level_must_be_a_mapping(tmp_path):
    path = write(tmp_path / "list.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config_file(path, env={})


def test_base_chain_deep_merges_dicts_and_replaces_lists(tmp_path):
    write(tmp_path / "a.yaml", "train: {epochs: 2, batch_size: 8}\nbenchmark: {docs_dirs: [x, y], workers: "
                               "3}\n")
    write(tmp_path / "sub" / "b.yaml", "_base_: ../a.yaml\ntrain: {epochs: 5}\nbenchmark: {docs_dirs: [z]}\n")
    loaded = load_config_file(tmp_path / "sub" / "b.yaml", env={})
    cfg = loaded.config
    assert (cfg.train.epochs, cfg.train.batch_size) == (5, 8)
    assert cfg.benchmark.model_extra["docs_dirs"] == ["z"]
    assert cfg.benchmark.workers == 3
    assert loaded.source_of("train.batch_size").endswith("a.yaml")
    assert loaded.source_of("train.epochs").endswith("b.yaml")


def test_base_cycle_is_detected(tmp_path):
    write(tmp_path / "a.yaml", "_base_: b.yaml\n")
    write(tmp_path / "b.yaml", "_base_: a.yaml\n")
    with pytest.raises(ConfigError, match=r"_base_ cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        load_config_file(tmp_path / "a.yaml", env={})


def test_missing_base_names_the_including_file(tmp_path):
    write(tmp_path / "a.yaml", "_base_: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"a\.yaml: _base_ file not found: nowhere\.yaml"):
        load_config_file(tmp_path / "a.yaml", env={})


def test_user_file_may_name_a_shipped_config_as_base(tmp_path):
    path = write(tmp_path / "mine.yaml", "_base_: searchqa.yaml\noptimizer: {learning_rate: 6}\n")
    cfg = load_config_file(path, env={}).config
    assert cfg.benchmark.split_dir == "data/searchqa_split"
    assert cfg.optimizer.learning_rate == 6


def test_user_file_layers_over_the_benchmark_config(tmp_path):
    path = write(tmp_path / "mine.yaml", "train: {batch_size: 12}\n")
    loaded = load_config("searchqa", config_file=path, env={})
    assert loaded.config.train.batch_size == 12
    assert loaded.config.benchmark.workers == 24


def test_a_file_or_override_naming_another_benchmark_is_an_error_naming_both(tmp_path):
    path = write(tmp_path / "bn.yaml", "benchmark: {name: qa}\n")
    expected = (r"^benchmark\.name: yaml:.*bn\.yaml names 'qa', but the command names 'searchqa'; "
                r"remove benchmark\.name from that file or name qa on the command line$")
    with pytest.raises(ConfigError, match=expected):
        load_config("searchqa", config_file=path, env={})
    with pytest.raises(ConfigError, match=r"^benchmark\.name: -o benchmark\.name names 'qa', but the command "
                                          r"names 'demo'; drop that override"):
        load_config("demo", overrides=["benchmark.name=qa"], env={})


def test_a_saved_config_reused_for_its_own_benchmark_keeps_the_command_line_name(tmp_path):
    saved = flatten(load_config("searchqa", env={}).config.model_dump(mode="json"))
    path = write(tmp_path / "saved.yaml", yaml.safe_dump(
        {"benchmark": {k.split(".", 1)[1]: v for k, v in saved.items() if k.startswith("benchmark.")}}))
    loaded = load_config("searchqa", config_file=path, env={})
    assert loaded.config.benchmark.name == "searchqa"
    assert loaded.source_of("benchmark.name") == "cli"


def test_local_configs_folder_overrides_the_shipped_file(tmp_path):
    write(tmp_path / "configs" / "searchqa.yaml", "_base_: _base_.yaml\nbenchmark: {workers: 2}\n")
    assert find_benchmark_config("searchqa", cwd=tmp_path) == tmp_path / "configs" / "searchqa.yaml"
    cfg = load_config("searchqa", env={}, cwd=tmp_path).config
    assert cfg.benchmark.workers == 2
    assert cfg.train.epochs == 4  # _base_ fell back to the shipped one


def test_unknown_benchmark_suggests_a_known_one():
    with pytest.raises(ConfigError, match=r"no config for benchmark 'serchqa'; did you mean 'searchqa'\?"):
        load_config("serchqa", env={})
    with pytest.raises(ConfigError, match=r"benchmark 'nosuch'\. Known: alfworld, .*searchqa, .*\.$"):
        load_config("nosuch", env={})


# ---- model roles: environment layer, nulls, aliases -----------------------------------------


def test_environment_fills_role_fields_that_yaml_leaves_null():
    env = {"SKILLOPT_TARGET_BACKEND": "anthropic", "SKILLOPT_TARGET_MAX_TOKENS": "2048",
           "SKILLOPT_TARGET_MODEL_PATH": "models/x.gguf"}
    loaded = load_config("searchqa", env=env)
    target = loaded.config.model.target
    assert target.backend == "anthropic"
    assert target.max_tokens == 2048
    assert target.options == {"model_path": "models/x.gguf"}
    assert loaded.source_of("model.target.backend") == "env:SKILLOPT_TARGET_BACKEND"


def test_yaml_backend_beats_environment_and_override_beats_yaml(tmp_path):
    path = write(tmp_path / "mine.yaml", "model:\n  target: {backend: openai_compatible}\n")
    env = {"SKILLOPT_TARGET_BACKEND": "anthropic"}
    assert load_config("qa", config_file=path, env=env).config.model.target.backend == "openai_compatible"
    cfg = load_config("qa", config_file=path, env=env, overrides=["model.target.backend=local"]).config
    assert cfg.model.target.backend == "local"


def test_backend_aliases_are_normalised():
    cfg = load_config(
        "qa", overrides=["model.target.backend=claude", "model.optimizer.backend=azure"], env={}
    ).config
    assert (cfg.model.target.backend, cfg.model.optimizer.backend) == ("anthropic", "azure_openai")


def test_judge_block_of_nulls_counts_as_absent_and_explicit_null_disables(tmp_path):
    path = write(tmp_path / "j.yaml", "model:\n  judge: {backend: null, model: null}\n")
    judge = load_config("qa", config_file=path, env={}).config.model.judge
    assert judge is not None and judge.backend is None and judge.max_tokens == 512
    assert load_config("qa", overrides=["model.judge=null"], env={}).config.model.judge is None


def test_demo_runs_every_role_on_the_scripted_backend():
    cfg = load_config("demo", env={}).config
    assert {cfg.model.target.backend, cfg.model.optimizer.backend, cfg.model.judge.backend} == {"scripted"}


# ---- secrets: references only, never echoed --------------------------------------------------


def test_literal_key_in_yaml_is_refused_without_echoing_it(tmp_path):
    path = write(
        tmp_path / "leak.yaml", f"model:\n  target:\n    backend: anthropic\n    api_key: {SENTINEL}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config_file(path, env={})
    message = str(info.value)
    assert SENTINEL not in message
    assert "model.target.api_key: literal keys are not accepted" in message
    assert "ANTHROPIC_API_KEY" in message and "model.target.api_key_env" in message
    assert "leak.yaml" in message


def test_a_refused_key_names_the_variable_of_the_backend_the_role_ends_up_with(tmp_path):
    """The file names no backend for the target; the command line (``cli_roles``), a later override or the
    benchmark's config does, and the refusal names that backend's key variable, not the default's."""
    path = write(tmp_path / "leak.yaml", f"model:\n  target:\n    api_key_env: {SENTINEL}\n")

    def refusal(benchmark="qa", **kwargs) -> str:
        with pytest.raises(ConfigError) as info:
            load_config(benchmark, config_file=path, env={}, **kwargs)
        message = str(info.value)
        assert SENTINEL not in message and message.count("\n") == 0
        assert message.startswith("yaml:") and "leak.yaml: model.target.api_key_env: literal keys" in message
        return message

    assert "export OPENAI_API_KEY" in refusal()
    assert "export ANTHROPIC_API_KEY" in refusal(cli_roles={"role_backend": {"target": "anthropic"}})
    assert "export ANTHROPIC_API_KEY" in refusal(cli_roles={"role_backend": {"target": "claude"}})  # an alias
    assert "export ANTHROPIC_API_KEY" in refusal(cli_roles={"backend": "anthropic"})
    assert "export ANTHROPIC_API_KEY" in refusal(overrides=["model.target.backend=anthropic"])
    # the backend for every role does not override a role's backend given with -o, as in resolve_roles
    assert "export OPENAI_API_KEY" in refusal(overrides=["model.target.backend=openai"],
                                              cli_roles={"backend": "anthropic"})
    assert "export AZURE_OPENAI_API_KEY" in refusal(overrides=["model.target.backend=openai"],
                                                    cli_roles={"backend": "anthropic",
                                                               "role_backend": {"target": "azure"}})
    base = write(tmp_path / "base.yaml", "model:\n  target:\n    backend: anthropic\n")
    write(tmp_path / "child.yaml", f"_base_: {base.name}\n")
    path = write(tmp_path / "leak.yaml",
                 f"_base_: child.yaml\nmodel:\n  target:\n    api_key_env: {SENTINEL}\n")
    assert "export ANTHROPIC_API_KEY" in refusal()  # a base file of the file names it


@pytest.mark.parametrize("backend", ["scripted", "local"])
def test_a_key_written_for_a_backend_that_needs_none_is_refused_saying_so(tmp_path, backend):
    """A key pasted into the config of a role whose backend sends no key anywhere: the refusal says to remove
    it, not to export a provider's variable the backend never reads (it said export OPENAI_API_KEY)."""
    text = f"model:\n  target:\n    backend: {backend}\n    api_key_env: {SENTINEL}\n"
    path = write(tmp_path / "leak.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config("qa", config_file=path, env={})
    message = str(info.value)
    assert SENTINEL not in message and "export" not in message
    assert message.endswith(f"leak.yaml: model.target.api_key_env: secrets are not accepted in config, and "
                            f"the {backend} backend needs no key: remove it"), message
    with pytest.raises(ConfigError, match="export OPENAI_API_KEY"):  # a role given a keyed backend after all
        load_config("qa", config_file=path, env={}, cli_roles={"role_backend": {"target": "openai"}})


def test_a_plain_key_named_key_outside_model_is_an_unknown_key_not_a_secret():
    with pytest.raises(ConfigError, match=r"evaluation.key: unknown key; valid keys: use_gate"):
        load_config("demo", overrides=["evaluation.key=1"], env={})
    with pytest.raises(ConfigError, match=r"model.target.key: secrets are not accepted in config"):
        load_config("demo", overrides=["model.target.key=1"], env={})
    with pytest.raises(ConfigError, match=r"evaluation.key: literal keys are not accepted") as info:
        load_config("demo", overrides=[f"evaluation.key={SENTINEL}"], env={})  # a key-shaped value still is
    assert SENTINEL not in str(info.value)


def test_key_shaped_value_under_any_name_is_refused(tmp_path):
    path = write(
        tmp_path / "leak.yaml", f"model:\n  optimizer:\n    extra_body: {{auth: 'Bearer {SENTINEL}'}}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config_file(path, env={})
    assert SENTINEL not in str(info.value)
    assert "model.optimizer.extra_body.auth" in str(info.value)


def test_literal_key_in_override_is_refused_without_echoing_it():
    with pytest.raises(ConfigError) as info:
        load_config("qa", overrides=[f"model.target.options.token={SENTINEL}"], env={})
    assert SENTINEL not in str(info.value)
    assert "-o model.target.options.token" in str(info.value)


def test_no_config_error_echoes_the_value():
    secretish = "not-a-number-SENTINEL-value"
    for override in (f"train.epochs={secretish}", f"optimizer.lr_scheduler={secretish}",
                     f"evaluation.use_gate={secretish}", f"train.nope={secretish}"):
        with pytest.raises(ConfigError) as info:
            load_config("qa", overrides=[override], env={})
        assert "SENTINEL" not in str(info.value), override


def test_credential_references_are_accepted():
    cfg = load_config(
        "qa", overrides=["model.target.api_key_env=MY_KEY", "model.judge.api_key_secret=judge-key"], env={}
    ).config
    assert cfg.model.target.api_key_env == "MY_KEY"
    assert cfg.model.judge.api_key_secret == "judge-key"


def test_benchmark_section_keeps_plugin_keys_for_the_plugin_to_validate():
    section = BenchmarkSection.model_validate({"name": "x", "max_context_chars": 10})
    assert section.model_extra == {"max_context_chars": 10}


@pytest.mark.parametrize("item", ["optimizer.learning_rate", "=3", "a..b=1"])
def test_malformed_override_is_an_error(item):
    with pytest.raises(ConfigError, match="override"):
        load_config("qa", overrides=[item], env={})
