"""The HTTP backends through the real openai and anthropic SDKs, against loopback fakes.

Everything a user relies on is checked on the wire: retries and Retry-After, errors that are not
retried, timeouts that cancel, usage and cost per stage, the shared limiter, structured output with
one re-ask, thinking switches, and that keys go only where they belong.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from pydantic import BaseModel

from skillopt.core.config import load_config
from skillopt.core.errors import ConfigError, SecurityError
from skillopt.llm import anthropic, azure_openai, openai, openai_compatible
from skillopt.llm.base import BackendRegistry
from skillopt.llm.chat import ChatRequest, ImagePart, TextPart, system, user
from skillopt.llm.clients import ModelClients
from skillopt.llm.errors import (
    AuthError,
    BadRequest,
    CallTimeout,
    ConnectionFailed,
    ContextLengthExceeded,
    ParseError,
    PermissionDenied,
    RateLimited,
)
from skillopt.llm.pricing import PriceTable
from tests.fakes.http_fakes import drip, malformed_body, ok, reset, slow, status, truncated

KEY = "sk-SENTINEL-5c1d2e3f4a5b6c7d"
REGISTRY = BackendRegistry([openai.INFO, anthropic.INFO, openai_compatible.INFO, azure_openai.INFO])
CHAT = "/v1/chat/completions"


class Sleeps(list):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def clients(*overrides: str, env: dict | None = None, sleeps: Sleeps | None = None) -> ModelClients:
    env = env if env is not None else {"OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY}
    loaded = load_config(None, overrides=list(overrides), env=env)
    return ModelClients.from_config(
        loaded, env=env, registry=REGISTRY, sleep=sleeps if sleeps is not None else Sleeps()
    )


def openai_chat(server, *more: str, **kwargs) -> ModelClients:
    return clients(f"model.target.base_url={server.openai_base_url}", "model.target.model=gpt-4.1-mini",
                   "model.target.options.api=chat_completions", *more, **kwargs)


def ask(text: str = "What is 2+2?", stage: str = "rollout", **kwargs) -> ChatRequest:
    return ChatRequest(messages=[system("You answer briefly."), user(text)], stage=stage, **kwargs)


class Verdict(BaseModel):
    verdict: str
    reason: str


# ---- OpenAI -----------------------------------------------------------------------------------


def test_chat_completion_text_usage_and_cost(openai_server):
    openai_server.plan(CHAT, ok(text="4", usage={"prompt_tokens": 1000, "completion_tokens": 200,
                                                 "cached_tokens": 400}))
    bundle = openai_chat(openai_server)
    response = bundle.target.chat(ask())
    assert response.text == "4"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens,
            response.usage.cached_prompt_tokens) == (1000, 200, 400)
    assert response.usage.reasoning_tokens is None  # not reported stays None, never 0
    wire = openai_server.last(CHAT)
    assert wire.api_key == KEY
    assert wire.body["max_completion_tokens"] == 4096
    assert wire.body["messages"][0] == {"role": "system", "content": "You answer briefly."}
    entry = bundle.ledger.prices.lookup("openai", "gpt-4.1-mini")
    expected = (
        600 * entry.input_per_mtok + 400 * entry.cached_input_per_mtok + 200 * entry.output_per_mtok
    ) / 1e6
    assert response.cost_usd == pytest.approx(expected)


def test_responses_api_is_the_default_for_openai(openai_server):
    openai_server.plan("/v1/responses", ok(text="Paris", reasoning="thinking about capitals", usage={
        "prompt_tokens": 50, "completion_tokens": 30, "reasoning_tokens": 20, "cached_tokens": 10}))
    bundle = clients(f"model.target.base_url={openai_server.openai_base_url}", "model.target.model=o4-mini",
                     "model.target.reasoning_effort=high")
    response = bundle.target.chat(ask("Capital of France?"))
    assert response.text == "Paris"
    assert response.reasoning_text == "thinking about capitals"
    assert (response.usage.reasoning_tokens, response.usage.cached_prompt_tokens) == (20, 10)
    body = openai_server.last("/v1/responses").body
    assert body["instructions"] == "You answer briefly."
    assert body["reasoning"] == {"effort": "high"}
    assert body["max_output_tokens"] == 4096
    assert body["store"] is False


def test_temperature_is_left_out_for_a_reasoning_model_and_strict_params_refuses(openai_server, caplog):
    bundle = openai_chat(openai_server, "model.target.model=o3", "model.target.temperature=0.7")
    bundle.target.chat(ask())
    bundle.target.chat(ask())
    assert "temperature" not in openai_server.last(CHAT).body
    assert caplog.text.count("temperature is not sent") == 1  # warned once per role
    strict = openai_chat(openai_server, "model.target.model=o3", "model.target.temperature=0.7",
                         "model.target.strict_params=true")
    with pytest.raises(ConfigError, match="strict_params"):
        strict.target.chat(ask())


def test_429_then_500_then_success_retries_and_honours_retry_after(openai_server):
    openai_server.plan(CHAT, status(429, retry_after=2), status(500), ok(text="done"))
    sleeps = Sleeps()
    bundle = openai_chat(openai_server, sleeps=sleeps)
    response = bundle.target.chat(ask())
    assert response.text == "done"
    assert response.attempts == 3
    assert openai_server.calls(CHAT) == 3  # no hidden SDK retries
    assert sleeps[0] >= 2.0  # Retry-After is a minimum
    # The fake sleep does not move the clock, so the next call still meets the 429's shared pause: it waits
    # the pause out plus its own jitter of up to half the pause.
    assert sleeps[0] - 0.5 <= sleeps[1] <= sleeps[0] * 1.5
    assert 1.0 <= sleeps[2] <= 2.0  # second backoff: d = 2 s, equal jitter
    records = bundle.ledger.records()
    assert [r.attempts for r in records] == [3]


@pytest.mark.parametrize("code,error,extra", [
    (400, BadRequest, {}),
    (401, AuthError, {}),
    (403, PermissionDenied, {}),
    (400, ContextLengthExceeded, {"code": "context_length_exceeded"}),
])
def test_errors_that_are_never_retried_make_exactly_one_call(openai_server, code, error, extra):
    openai_server.plan(CHAT, status(code, **extra))
    bundle = openai_chat(openai_server)
    with pytest.raises(error) as info:
        bundle.target.chat(ask())
    assert openai_server.calls(CHAT) == 1
    message = str(info.value)
    assert message.startswith("[target] openai/gpt-4.1-mini (stage rollout): HTTP")
    assert "after 1 attempt" in message
    assert KEY not in message
    errors = [r for r in bundle.ledger.records() if r.status == "error"]
    assert [r.error_class for r in errors] == [error.__name__]


def test_auth_error_names_the_variable_to_set(openai_server):
    openai_server.plan(CHAT, status(401))
    with pytest.raises(AuthError, match=r"set OPENAI_API_KEY or model\.target\.api_key_env"):
        openai_chat(openai_server).target.chat(ask())


def test_a_retry_after_beyond_the_limit_fails_at_once(openai_server):
    openai_server.plan(CHAT, status(429, retry_after=900))
    with pytest.raises(RateLimited, match="asked to wait 900 s"):
        openai_chat(openai_server).target.chat(ask())
    assert openai_server.calls(CHAT) == 1


@pytest.mark.parametrize("entry", [slow(5), drip(5, chunks=10)], ids=["slow-headers", "dripped-body"])
def test_timeouts_cancel_the_call(openai_server, entry):
    openai_server.plan(CHAT, entry)
    bundle = openai_chat(openai_server, "model.target.timeout_s=1", "model.retry.max_attempts=1")
    started = time.monotonic()
    with pytest.raises(CallTimeout):
        bundle.target.chat(ask())
    assert time.monotonic() - started < 1 + 1.5


def test_connection_reset_and_malformed_body_are_retried(openai_server):
    openai_server.plan(CHAT, reset(), malformed_body("html"), ok(text="fine"))
    response = openai_chat(openai_server).target.chat(ask())
    assert response.text == "fine" and response.attempts == 3


def test_connection_refused_is_a_clear_error():
    bundle = clients(
        "model.target.base_url=http://127.0.0.1:9/v1",
        "model.target.options.api=chat_completions",
        "model.retry.max_attempts=2",
    )
    with pytest.raises(ConnectionFailed, match=r"\[target\] openai/gpt-4.1-mini .*cannot reach"):
        bundle.target.chat(ask())


def test_images_go_as_data_uris(openai_server, tmp_path):
    image = tmp_path / "chart.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 16)
    request = ChatRequest(messages=[user([TextPart(text="What is shown?"), ImagePart(source=str(image),
                                                                                   detail="low")])],
                          stage="rollout")
    openai_chat(openai_server).target.chat(request)
    content = openai_server.last(CHAT).body["messages"][0]["content"]
    assert content[1]["type"] == "image_url"
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert content[1]["image_url"]["detail"] == "low"


# ---- structured output ------------------------------------------------------------------------


def test_structured_output_sends_a_strict_schema_and_validates(openai_server):
    openai_server.plan(CHAT, ok(json={"verdict": "correct", "reason": "same city", "extra": 1}))
    verdict, response = openai_chat(openai_server).target.structured(ask(stage="rollout"), Verdict)
    assert verdict == Verdict(verdict="correct", reason="same city")
    schema = openai_server.last(CHAT).body["response_format"]["json_schema"]
    assert schema["strict"] is True and schema["schema"]["additionalProperties"] is False


def test_a_bad_reply_gets_exactly_one_re_ask_then_a_parse_error(openai_server):
    openai_server.plan(CHAT, ok(text="I think it is correct."), ok(text="still prose"))
    with pytest.raises(ParseError) as info:
        openai_chat(openai_server).target.structured(ask(), Verdict)
    assert openai_server.calls(CHAT) == 2
    assert info.value.role == "target"
    first, reask = (r.body["messages"] for r in openai_server.requests_for(CHAT))
    # A short correction in the same user turn: never the bad reply, never the schema again.
    assert [m["role"] for m in reask] == [m["role"] for m in first]
    assert "I think it is correct." not in json.dumps(reask)
    correction = reask[-1]["content"].removeprefix(first[-1]["content"])
    assert correction.startswith("\n\nYour previous reply could not be used: ")
    assert '"verdict", "reason"' in correction and len(correction) < 400


def test_a_truncated_reply_is_re_asked_with_double_the_tokens(openai_server):
    openai_server.plan(CHAT, truncated('{"verdict": "corr'), ok(json={"verdict": "correct", "reason": "r"}))
    verdict, _ = openai_chat(openai_server, "model.target.max_tokens=100").target.structured(ask(), Verdict)
    assert verdict.verdict == "correct"
    bodies = [r.body for r in openai_server.requests_for(CHAT)]
    assert [b["max_completion_tokens"] for b in bodies] == [100, 200]


# ---- usage per stage and the shared limiter ---------------------------------------------------


def test_usage_is_counted_per_stage_and_role(openai_server):
    bundle = clients(
        f"model.target.base_url={openai_server.openai_base_url}",
        f"model.optimizer.base_url={openai_server.openai_base_url}",
        "model.target.options.api=chat_completions",
        "model.optimizer.options.api=chat_completions",
    )
    openai_server.default = ok(text="x", usage={"prompt_tokens": 10, "completion_tokens": 5})
    bundle.target.chat(ask(stage="rollout"))
    bundle.target.chat(ask(stage="rollout"))
    bundle.optimizer.chat(ask(stage="analyst"))
    summary = bundle.ledger.summary()
    by_stage = {row["stage"]: row for row in summary["by_stage"]}
    assert by_stage["rollout"]["calls"] == 2 and by_stage["rollout"]["prompt_tokens"] == 20
    assert by_stage["analyst"]["calls"] == 1 and by_stage["analyst"]["completion_tokens"] == 5
    assert bundle.ledger.totals().calls == 3


def test_concurrent_calls_respect_max_concurrency(openai_server):
    openai_server.default = slow(0.3, then=ok(text="x"))
    key = f"openai:127.0.0.1:{openai_server.port}"
    bundle = openai_chat(openai_server, f"model.providers={{'{key}': {{max_concurrency: 2}}}}")
    in_flight, peak = 0, 0
    lock = threading.Lock()
    original = bundle.target.backend.attempt

    def counting(request, *, timeout_s):
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        try:
            return original(request, timeout_s=timeout_s)
        finally:
            with lock:
                in_flight -= 1

    bundle.target.backend.attempt = counting
    threads = [threading.Thread(target=bundle.target.chat, args=(ask(),)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert openai_server.calls(CHAT) == 6
    assert peak == 2


# ---- Anthropic --------------------------------------------------------------------------------


def anthropic_clients(server, *more: str) -> ModelClients:
    return clients("model.target.backend=anthropic", f"model.target.base_url={server.url}",
                   "model.target.model=claude-sonnet-4-6", *more)


def test_anthropic_text_usage_with_prompt_cache(anthropic_server):
    anthropic_server.plan(
        "/v1/messages",
        ok(
            text="4",
            usage={
                "prompt_tokens": 1000,
                "completion_tokens": 50,
                "cached_tokens": 600,
                "cache_write_tokens": 100,
            },
        ),
    )
    response = anthropic_clients(anthropic_server, "model.target.temperature=0.2").target.chat(ask())
    assert response.text == "4"
    assert (response.usage.prompt_tokens, response.usage.cached_prompt_tokens,
            response.usage.cache_write_tokens) == (1000, 600, 100)
    body = anthropic_server.last("/v1/messages").body
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["temperature"] == 0.2
    assert body["max_tokens"] == 4096
    assert "thinking" not in body
    assert anthropic_server.last("/v1/messages").api_key == KEY


def test_anthropic_thinking_budget_below_max_tokens_and_no_temperature(anthropic_server, caplog):
    anthropic_server.plan("/v1/messages", ok(text="42", reasoning="let me think"))
    bundle = anthropic_clients(
        anthropic_server, "model.target.reasoning_effort=high", "model.target.temperature=0.5"
    )
    response = bundle.target.chat(ask())
    body = anthropic_server.last("/v1/messages").body
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 24576}
    assert body["max_tokens"] == 24576 + 4096  # raised above the budget
    assert "temperature" not in body
    assert response.reasoning_text == "let me think" and response.text == "42"
    assert "thinking budget" in caplog.text


def test_anthropic_structured_output_uses_one_forced_tool(anthropic_server):
    anthropic_server.plan("/v1/messages", ok(json={"verdict": "incorrect", "reason": "different"}))
    verdict, _ = anthropic_clients(anthropic_server).target.structured(ask(), Verdict)
    assert verdict.verdict == "incorrect"
    body = anthropic_server.last("/v1/messages").body
    assert body["tool_choice"] == {"type": "tool", "name": "respond"}
    assert body["tools"][0]["input_schema"]["required"] == ["verdict", "reason"]


def test_anthropic_overloaded_529_is_retried_and_max_tokens_stop_is_truncated(anthropic_server):
    anthropic_server.plan("/v1/messages", status(529), truncated("partial"))
    response = anthropic_clients(anthropic_server).target.chat(ask())
    assert response.attempts == 2 and response.truncated and response.text == "partial"


def test_anthropic_400_is_called_once(anthropic_server):
    anthropic_server.plan("/v1/messages", status(400, message="bad field"))
    with pytest.raises(
        BadRequest, match=r"^\[target\] anthropic/claude-sonnet-4-6 \(stage rollout\): HTTP 400"
    ):
        anthropic_clients(anthropic_server).target.chat(ask())
    assert anthropic_server.calls("/v1/messages") == 1


# ---- OpenAI-compatible presets ----------------------------------------------------------------


def compat(server, *more: str, env: dict | None = None) -> ModelClients:
    return clients(
        "model.target.backend=openai_compatible",
        f"model.target.base_url={server.openai_base_url}",
        "model.target.model=Qwen/Qwen3-8B",
        *more,
        env=env if env is not None else {},
    )


def test_generic_server_needs_no_key_and_server_default_sends_no_thinking_field(openai_server, caplog):
    compat(openai_server).target.chat(ask())
    body = openai_server.last(CHAT).body
    assert not {"chat_template_kwargs", "enable_thinking", "reasoning_effort"} & set(body)
    assert body["max_tokens"] == 4096
    assert openai_server.last(CHAT).api_key == openai_compatible.PLACEHOLDER_KEY
    assert "thinking is the server's default" in caplog.text


def test_a_preset_without_a_thinking_switch_says_where_to_pin_it_instead(openai_server, caplog, monkeypatch):
    from skillopt.llm.http_common import SERVER_NOTES

    monkeypatch.setattr(SERVER_NOTES, "_seen", set())  # said once per process: as if this one were new
    settings = (("backend", "openai_compatible"), ("base_url", openai_server.openai_base_url),
                ("model", "Qwen/Qwen3-8B"), ("options.preset", "llamacpp"))
    same_model = [f"model.{role}.{key}={value}" for role in ("target", "optimizer")
                  for key, value in settings]
    both = compat(openai_server, *same_model)
    both.target.chat(ask())
    both.optimizer.chat(ask())
    # one note for the two roles that share the model
    (note,) = [line for line in caplog.text.splitlines() if "thinking is the server's default" in line]
    assert "the llamacpp preset has no on/off switch: pin it where the server is launched or with its own " \
           "field in model.<role>.extra_body" in note
    assert "options.thinking" not in note  # setting it is refused for this preset


def test_generic_server_answering_401_names_the_key_variable(openai_server):
    openai_server.require_key = "right-key"
    with pytest.raises(AuthError, match="OPENAI_COMPATIBLE_API_KEY or model.target.api_key_env"):
        compat(openai_server).target.chat(ask())


def test_vllm_thinking_switch_and_think_tags(openai_server):
    openai_server.plan(CHAT, ok(text="<think>hmm</think>Answer: 4"))
    response = compat(openai_server, "model.target.options.preset=vllm", "model.target.reasoning_effort=none"
                      ).target.chat(ask())
    assert openai_server.last(CHAT).body["chat_template_kwargs"] == {"enable_thinking": False}
    assert response.text == "Answer: 4" and response.reasoning_text == "hmm"


def test_thinking_on_a_preset_without_a_switch_is_a_config_error(openai_server):
    with pytest.raises(ConfigError, match="has no on/off switch; send the server's own field"):
        compat(openai_server, "model.target.options.thinking=on").target.chat(ask())


def test_qwen_thinking_calls_are_streamed_and_reassembled(openai_server):
    openai_server.plan(CHAT, ok(text="Beijing", reasoning="capital of China",
                                usage={"prompt_tokens": 9, "completion_tokens": 4}))
    bundle = compat(openai_server, "model.target.options.preset=qwen", "model.target.options.thinking=on",
                    "model.target.options.thinking_budget=500", env={"DASHSCOPE_API_KEY": KEY})
    response = bundle.target.chat(ask())
    request = openai_server.last(CHAT)
    assert request.body["stream"] is True and request.body["enable_thinking"] is True
    assert request.body["thinking_budget"] == 500
    assert (response.text, response.reasoning_text) == ("Beijing", "capital of China")
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (9, 4)
    assert request.api_key == KEY


def test_qwen_without_its_key_is_a_config_error(openai_server):
    with pytest.raises(ConfigError, match="export DASHSCOPE_API_KEY"):
        compat(openai_server, "model.target.options.preset=qwen").target.chat(ask())


def test_deepseek_reasoning_content_never_becomes_the_answer(openai_server):
    openai_server.plan(CHAT, ok(text="7", reasoning="3+4"))
    response = compat(
        openai_server,
        "model.target.options.preset=deepseek",
        "model.target.model=deepseek-reasoner",
        env={"DEEPSEEK_API_KEY": KEY},
    ).target.chat(ask())
    assert (response.text, response.reasoning_text) == ("7", "3+4")


# ---- Azure ------------------------------------------------------------------------------------


def test_azure_deployment_path_and_api_key_header(openai_server):
    env = {"AZURE_OPENAI_API_KEY": KEY}
    bundle = clients("model.target.backend=azure", f"model.target.base_url={openai_server.url}",
                     "model.target.model=my-gpt4o", "model.target.price_model=gpt-4o", env=env)
    openai_server.plan("/v1/chat/completions", ok(text="hi"))
    assert bundle.target.chat(ask()).text == "hi"
    request = openai_server.last()
    assert request.path == "/openai/deployments/my-gpt4o/chat/completions"
    assert request.query["api-version"] == azure_openai.DEFAULT_API_VERSION
    assert request.headers["api-key"] == KEY


def test_azure_bearer_tokens_never_go_to_an_untrusted_host():
    with pytest.raises(SecurityError, match="refusing to send an Azure bearer token to http://127.0.0.1"):
        azure_openai.check_token_host("http://127.0.0.1:8080", [])
    with pytest.raises(SecurityError):
        azure_openai.check_token_host("https://evil.example.com", [])
    azure_openai.check_token_host("https://myres.openai.azure.com", [])
    azure_openai.check_token_host("https://gateway.corp", ["gateway.corp"])


def test_azure_without_any_credential_lists_the_fixes(monkeypatch):
    monkeypatch.setenv("PATH", "")
    bundle = clients("model.target.backend=azure", "model.target.base_url=https://r.openai.azure.com",
                     "model.target.model=dep", env={})
    monkeypatch.setattr(azure_openai, "_identity_available", lambda: False)
    with pytest.raises(ConfigError, match="AZURE_OPENAI_API_KEY.*skillopt\\[azure\\].*az login"):
        bundle.target.chat(ask())
    # A key variable of the user's own is the one to export, named with the role's key.
    bundle = clients("model.target.backend=azure", "model.target.base_url=https://r.openai.azure.com",
                     "model.target.model=dep", "model.target.api_key_env=MY_AZ_KEY", env={})
    with pytest.raises(ConfigError, match=r"Fix one of: export MY_AZ_KEY \(or set "
                                          r"model\.target\.api_key_env\)"):
        bundle.target.chat(ask())


def test_az_cli_token_is_cached_and_refreshed_before_expiry():
    calls = []
    now = [1000.0]

    class Proc:
        returncode = 0

        def __init__(self, expires):
            self.stdout = f'{{"accessToken": "tok-{len(calls)}", "expires_on": {expires}}}'

    def run(argv, **kwargs):
        calls.append(argv)
        return Proc(now[0] + 3600)

    token = azure_openai.AzCliToken(azure_openai.DEFAULT_SCOPE, az="az", run=run, clock=lambda: now[0])
    assert token() == "tok-1" and token() == "tok-1"
    assert calls[0] == ["az", "account", "get-access-token", "--resource", "https://cognitiveservices.azure.com",
                        "-o", "json"]
    now[0] += 3600 - 200  # inside the five-minute refresh margin
    assert token() == "tok-2"


# ---- reply store ------------------------------------------------------------------------------


def test_a_reply_is_stored_the_moment_it_arrives_and_never_paid_for_twice(openai_server, tmp_path):
    from skillopt.llm.reply_store import ReplyStore

    def bundle(refresh: bool = False) -> ModelClients:
        env = {"OPENAI_API_KEY": KEY}
        loaded = load_config(None, overrides=[f"model.target.base_url={openai_server.openai_base_url}",
                                              "model.target.options.api=chat_completions"], env=env)
        return ModelClients.from_config(loaded, env=env, registry=REGISTRY,
                                        replies=ReplyStore(tmp_path / "replies", refresh=refresh))

    openai_server.plan(CHAT, ok(text="first", usage={"prompt_tokens": 10, "completion_tokens": 2}),
                       ok(text="second"))
    first = bundle()
    assert first.target.chat(ask()).text == "first"
    again = bundle()  # a new process after a crash: same request, same store
    response = again.target.chat(ask())
    assert response.text == "first" and response.cost_usd == 0.0
    assert openai_server.calls(CHAT) == 1
    hits = [r for r in again.ledger.records() if r.cache_hit]
    assert len(hits) == 1 and again.ledger.totals().calls == 0
    assert bundle().target.chat(ask("another question")).text == "second"  # other content: a real call
    assert openai_server.calls(CHAT) == 2
    assert bundle(refresh=True).target.chat(ask()).text == "ok"  # --no-cache calls again
    assert openai_server.calls(CHAT) == 3


def test_no_cache_calls_again_what_earlier_runs_stored_not_what_this_run_paid_for(openai_server, tmp_path):
    """``--no-cache`` (``refresh``) reads only the replies stored since the run first started: a resumed
    ``--no-cache`` run takes the calls its interrupted attempt paid for, and pays again only for older
    ones."""
    import os

    from skillopt.llm.reply_store import ReplyStore

    def bundle(**store) -> ModelClients:
        env = {"OPENAI_API_KEY": KEY}
        loaded = load_config(None, overrides=[f"model.target.base_url={openai_server.openai_base_url}",
                                              "model.target.options.api=chat_completions"], env=env)
        return ModelClients.from_config(loaded, env=env, registry=REGISTRY,
                                        replies=ReplyStore(tmp_path / "replies", **store))

    openai_server.plan(CHAT, ok(text="an earlier run's"), ok(text="this run's"), ok(text="this run's too"))
    assert bundle().target.chat(ask("old")).text == "an earlier run's"
    (old,) = (tmp_path / "replies").glob("*/*.json")
    os.utime(old, (1000.0, 1000.0))  # stored long before this run started
    started = 2000.0
    first_attempt = bundle(refresh=True, since=started)
    assert first_attempt.target.chat(ask("old")).text == "this run's"  # recomputed
    assert first_attempt.target.chat(ask("new")).text == "this run's too"
    assert openai_server.calls(CHAT) == 3
    resumed = bundle(refresh=True, since=started)  # the same --no-cache command again, after a Ctrl-C
    assert [resumed.target.chat(ask(q)).text for q in ("old", "new")] == ["this run's", "this run's too"]
    assert openai_server.calls(CHAT) == 3 and resumed.ledger.totals().calls == 0


def test_a_reply_is_in_the_store_before_its_usage_line_so_a_kill_between_them_pays_nothing(
    openai_server, tmp_path
):
    from skillopt.llm.reply_store import ReplyStore
    from skillopt.llm.usage import UsageLedger

    class KilledWhileRecording(UsageLedger):
        """The process dies as the usage line is written: only what is on disk by then survives."""

        def record(self, **fields):
            if fields.get("status") == "ok" and not fields.get("cache_hit"):
                raise SystemExit("killed")
            return super().record(**fields)

    env = {"OPENAI_API_KEY": KEY}
    loaded = load_config(None, overrides=[f"model.target.base_url={openai_server.openai_base_url}",
                                          "model.target.options.api=chat_completions"], env=env)
    openai_server.plan(CHAT, ok(text="paid once"), ok(text="paid twice"))
    dying = ModelClients.from_config(
        loaded,
        env=env,
        registry=REGISTRY,
        replies=ReplyStore(tmp_path / "r"),
        ledger=KilledWhileRecording(tmp_path / "usage.jsonl", PriceTable.load(None)),
    )
    with pytest.raises(SystemExit):
        dying.target.chat(ask())
    restarted = ModelClients.from_config(
        loaded, env=env, registry=REGISTRY, replies=ReplyStore(tmp_path / "r")
    )
    assert restarted.target.chat(ask()).text == "paid once"
    assert openai_server.calls(CHAT) == 1


def test_a_request_in_flight_is_asked_once_and_a_prefetched_reply_is_the_asking_task_s_own_call(
    openai_server, tmp_path
):
    from skillopt.llm.reply_store import PREFETCH, ReplyStore

    env = {"OPENAI_API_KEY": KEY}
    loaded = load_config(None, overrides=[f"model.target.base_url={openai_server.openai_base_url}",
                                          "model.target.options.api=chat_completions"], env=env)
    clients = ModelClients.from_config(loaded, env=env, registry=REGISTRY, replies=ReplyStore(tmp_path / "r"))

    # Prefetched (skillopt.run.prefetch) while the task asks for the same request: one call, one usage line,
    # and
    # the task's answer is that call's, not a cache hit.
    openai_server.plan(CHAT, slow(0.5, ok(text="prefetched", usage={"prompt_tokens": 10,
                                                                     "completion_tokens": 2})))
    answers: dict[str, str] = {}

    def prefetch() -> None:
        token = PREFETCH.set(True)
        try:
            answers["prefetched"] = clients.target.chat(ask()).text
        finally:
            PREFETCH.reset(token)

    worker = threading.Thread(target=prefetch)
    worker.start()
    time.sleep(0.15)  # the prefetched call is in flight
    asked = clients.target.chat(ask())
    worker.join()
    assert answers["prefetched"] == asked.text == "prefetched"
    assert openai_server.calls(CHAT) == 1
    assert [r.cache_hit for r in clients.ledger.records()] == [False]
    assert asked.cost_usd == clients.ledger.records()[0].cost_usd

    # Asked again later: the reply was taken once; from now on it is a cache hit, as any stored reply.
    assert clients.target.chat(ask()).text == "prefetched"
    assert [r.cache_hit for r in clients.ledger.records()] == [False, True]

    # The flow got there first: a prefetch finds the stored reply and records nothing.
    openai_server.plan(CHAT, ok(text="by the task"))
    assert clients.target.chat(ask("another question")).text == "by the task"
    token = PREFETCH.set(True)
    try:
        assert clients.target.chat(ask("another question")).text == "by the task"
    finally:
        PREFETCH.reset(token)
    assert openai_server.calls(CHAT) == 2 and len(clients.ledger.records()) == 3


def test_opening_the_reply_store_removes_temporary_files_of_writers_that_are_gone(tmp_path):
    import os
    import socket
    import subprocess
    import sys
    import time

    from skillopt.llm.reply_store import ReplyStore

    shard = tmp_path / "replies" / "ab"
    shard.mkdir(parents=True)
    host = socket.gethostname().replace(".", "_")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(gone.stdout)
    orphan = shard / f".ab12.json.{host}-{dead_pid}.x1y2.tmp"
    in_flight = shard / f".ab34.json.{host}-{os.getpid()}.x3y4.tmp"  # a live writer's file stays
    stale = shard / ".ab56.json.otherhost-1.x5y6.tmp"
    reply = shard / "ab78.json"
    for path in (orphan, in_flight, stale, reply):
        path.write_text("{}")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))  # another host's, but far older than any write takes
    ReplyStore(tmp_path / "replies")
    assert sorted(p.name for p in shard.iterdir()) == sorted([in_flight.name, reply.name])


# ---- The request path -------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_the_wire_body_is_the_body_the_backend_built_and_no_endpoint_method_walks_it(
        api, openai_server, anthropic_server, monkeypatch):
    """Requests go through the SDK client's own POST (its base URL, key, headers and error classes), not
    through ``chat.completions.create`` and the like, whose walk of every body against the API's typed
    parameters cost more of a core than the rest of a call: the body on the wire is exactly the one the
    backend built, a field no SDK release names (``extra_body``) included, at the top level."""
    import importlib

    def refused(*_args, **_kwargs):
        raise AssertionError("an SDK endpoint method was called")

    for module, name in (("openai.resources.chat.completions", "Completions"),
                         ("openai.resources.responses", "Responses"),  # not in every SDK release
                         ("anthropic.resources.messages", "Messages")):
        try:
            resource = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        monkeypatch.setattr(resource, "create", refused)
    extra = ("model.target.extra_body.vendor_field={\"nested\": [1, 2]}",)
    if api == "anthropic":
        server, path, builder = anthropic_server, "/v1/messages", "body"
        wire_type = anthropic.AnthropicBackend
        bundle = anthropic_clients(server, *extra)
    elif api == "responses":
        server, path, wire_type, builder = openai_server, "/v1/responses", openai.OpenAIWire, "responses_body"
        bundle = clients(f"model.target.base_url={server.openai_base_url}", "model.target.model=gpt-4.1-mini",
                         *extra)
    else:
        server, path, wire_type, builder = openai_server, CHAT, openai.OpenAIWire, "chat_body"
        bundle = openai_chat(server, *extra)
    server.plan(path, ok(text="4"))
    built: list[dict] = []
    build = getattr(wire_type, builder)

    def keep(self, request):
        body = build(self, request)
        built.append(json.loads(json.dumps(body)))
        return body

    monkeypatch.setattr(wire_type, builder, keep)
    assert bundle.target.chat(ask()).text == "4"
    wire = server.last(path)
    assert wire.api_key == KEY
    assert built and wire.body == built[0]
    assert wire.body["vendor_field"] == {"nested": [1, 2]}
