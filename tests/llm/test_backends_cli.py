"""`skillopt backends` and `skillopt backends check`, the preflight a user runs before a long job."""

from __future__ import annotations

import io
import socket

from skillopt.shell.cli import main
from tests.fakes.http_fakes import ok


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def compat_target(base_url: str) -> list[str]:
    return ["--role", "target", "-o", "model.target.backend=openai_compatible",
            "-o", f"model.target.base_url={base_url}", "-o", "model.target.model=m"]


def test_check_succeeds_against_an_openai_compatible_server(openai_server):
    openai_server.plan("/v1/chat/completions", ok(text="ok", model="m-served",
                                                  usage={"prompt_tokens": 12, "completion_tokens": 1}))
    code, out, err = run("backends", "check", *compat_target(openai_server.openai_base_url))
    assert code == 0, err
    assert "target: openai_compatible/m ok" in out
    assert "served by m-served" in out and "tokens in/out 12/1" in out
    assert openai_server.calls("/v1/chat/completions") == 1
    assert openai_server.last("/v1/chat/completions").body["max_tokens"] == 1


def test_check_warns_when_the_server_lists_other_models_than_the_one_configured(openai_server):
    """llama-cpp-python answers whatever model is asked for: only its listing tells a wrong id."""
    openai_server.models = ("SmolLM2-135M-Instruct.Q4_1.gguf",)
    code, out, err = run("backends", "check", *compat_target(openai_server.openai_base_url))
    assert code == 0, err
    warning = ("warning: the server lists SmolLM2-135M-Instruct.Q4_1.gguf, not model.target.model 'm'; the "
               "price table, the known context windows and the cache go by that id: set it to the listed one")
    assert warning in out, out
    openai_server.models = ("m", "other")
    code, out, err = run("backends", "check", *compat_target(openai_server.openai_base_url))
    assert code == 0 and "warning" not in out, out


def test_check_fails_clearly_when_the_server_is_down():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, out, err = run("backends", "check", *compat_target(f"http://127.0.0.1:{port}/v1"))
    assert code != 0
    assert "target: openai_compatible/m FAILED" in out
    assert f"cannot reach 127.0.0.1:{port}" in err and "is the server running?" in err


def test_a_malformed_base_url_from_the_environment_is_one_line_not_a_traceback(monkeypatch):
    """OPENAI_BASE_URL fills model.target.base_url after the config's own URL check: the endpoint probe
    says what is wrong with it instead of raising."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:99999/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    code, out, err = run("backends", "check", "--role", "target", "-o", "model.target.backend=openai",
                         "-o", "model.target.model=m")
    assert code != 0
    assert "error: target: 'http://localhost:99999/v1': port out of range 0-65535; correct the URL " \
           "(model.target.base_url)" in err, err


def test_check_fails_clearly_on_401(openai_server, monkeypatch):
    openai_server.require_key = "the-right-key"
    monkeypatch.setenv("OPENAI_COMPATIBLE_API_KEY", "sk-SENTINEL-wrongkey-123456")
    code, out, err = run("backends", "check", *compat_target(openai_server.openai_base_url))
    assert code != 0
    assert "AuthError" not in err  # the message says what happened, not the class
    assert "HTTP 401" in err and "set OPENAI_COMPATIBLE_API_KEY or model.target.api_key_env" in err
    assert "SENTINEL" not in out + err


def test_check_without_a_key_fails_before_any_call(openai_server):
    code, _, err = run("backends", "check", "--role", "target", "-o",
                       f"model.target.base_url={openai_server.openai_base_url}")
    assert code != 0
    assert "no credential: export OPENAI_API_KEY or set model.target.api_key_env" in err
    assert openai_server.calls() == 0


def test_listing_shows_backends_and_roles_without_secrets(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-SENTINEL-0000111122223333")
    code, out, _ = run("backends", "--optimizer-backend", "anthropic")
    assert code == 0
    for name in ("openai", "azure_openai", "anthropic", "openai_compatible", "codex_exec", "claude_code_exec",
                 "local", "scripted"):
        assert f"  {name} " in out
    assert "optimizer  backend           anthropic" in out
    assert "set (env:ANTHROPIC_API_KEY)" in out
    assert "SENTINEL" not in out


def test_scripted_roles_check_offline(socket_guard):
    code, out, err = run("backends", "check", "--backend", "scripted")
    assert code == 0, err
    assert out.count(" ok") == 3
