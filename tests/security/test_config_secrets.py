"""Secrets that do not look like keys are refused in config too, and redacted wherever config is shown.

A URL's userinfo (``https://user:password@host``) and the values of credential-named keys in
``extra_body`` or headers (``Authorization``, ``api-key``, ``X-Auth-Token``, ``password``…) are refused
in config files, ``-o`` overrides and ``SKILLOPT_<ROLE>_<KEY>`` variables, naming the variable to use
instead and never quoting the value. Dumps of a config redact them all the same.
"""

from __future__ import annotations

import re

import pytest

from skillopt.core.config import dump_config, load_config
from skillopt.core.errors import ConfigError
from skillopt.core.redact import REDACTED, Redactor, names_credential, redact_tree

PASSWORD = "hunter2-SENTINEL-p4ss"


def refused(*, overrides=(), env=None, config_file=None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config("qa", overrides=list(overrides), env=env or {}, config_file=config_file)
    message = str(caught.value)
    assert PASSWORD not in message
    return message


def test_a_password_in_a_base_url_is_refused_in_a_file_an_override_and_a_variable(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("model:\n  target:\n    backend: openai_compatible\n"
                    f"    base_url: https://me:{PASSWORD}@llm.example.com/v1\n", encoding="utf-8")
    message = refused(config_file=mine)
    assert "model.target.base_url: credentials in a URL (user:password@host) are not accepted" in message
    assert "export OPENAI_COMPATIBLE_API_KEY or set model.target.api_key_env" in message

    message = refused(overrides=["model.optimizer.backend=anthropic",
                                 f"model.optimizer.base_url=http://me:{PASSWORD}@127.0.0.1:9/"])
    assert message.startswith("-o model.optimizer.base_url: model.optimizer.base_url: credentials in a URL")
    assert "ANTHROPIC_API_KEY" in message

    message = refused(env={"SKILLOPT_TARGET_BASE_URL": f"http://{PASSWORD}@127.0.0.1:9/v1"})
    assert "env:SKILLOPT_TARGET_BASE_URL: model.target.base_url: credentials in a URL" in message


@pytest.mark.parametrize("key", ["Authorization", "api-key", "X-Api-Key", "x-auth-token", "password",
                                 "client_secret", "Ocp-Apim-Subscription-Key", "Cookie"])
def test_credential_named_keys_in_extra_body_are_refused(tmp_path, key):
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"model:\n  judge:\n    extra_body:\n      nested:\n        \"{key}\": \"{PASSWORD}\"\n",
                    encoding="utf-8")
    # (``api-key`` is also an api_key-like name, refused anywhere as a literal key.)
    refusal = re.compile(rf"model\.judge\.extra_body\.nested\.{re.escape(key)}: "
                         r"(credentials are not accepted in request bodies or headers|literal keys are not "
                         r"accepted).*set model\.judge\.api_key_env")
    assert refusal.search(refused(config_file=mine))
    message = refused(overrides=[f'model.target.extra_body={{"{key}": "{PASSWORD}"}}'])
    assert f"model.target.extra_body.{key}: " in message and "are not accepted" in message


def test_ordinary_body_keys_that_mention_tokens_or_keys_are_accepted():
    loaded = load_config("qa", overrides=[
        'model.target.extra_body={"skip_special_tokens": true, "max_tokens": 5, "prompt_cache_key": "run-1", '
        '"top_k": 20}'], env={})
    assert loaded.config.model.target.extra_body["prompt_cache_key"] == "run-1"
    for name in ("max_tokens", "skip_special_tokens", "prompt_cache_key", "keywords", "author"):
        assert not names_credential(name), name


def test_dumps_redact_url_passwords_and_credential_keys_even_if_they_got_in():
    redactor = Redactor()
    text = f"connecting to https://me:{PASSWORD}@llm.example.com/v1 now"
    assert PASSWORD not in redactor(text) and "https://[REDACTED]@llm.example.com/v1" in redactor(text)
    tree = {"model": {"target": {"extra_body": {"headers": {"Authorization": PASSWORD, "x-trace": "keep"}},
                                 "api_key_env": "MY_KEY", "base_url": f"http://u:{PASSWORD}@h/"}}}
    redacted = redact_tree(tree, redactor)
    headers = redacted["model"]["target"]["extra_body"]["headers"]
    assert headers == {"Authorization": REDACTED, "x-trace": "keep"}
    assert redacted["model"]["target"]["api_key_env"] == "MY_KEY"
    assert PASSWORD not in str(redacted)


def test_config_show_data_is_redacted():
    loaded = load_config("qa", overrides=["model.target.api_key_env=MY_TARGET_KEY"], env={})
    data = dump_config(loaded)
    assert data["model"]["target"]["api_key_env"] == "MY_TARGET_KEY"
