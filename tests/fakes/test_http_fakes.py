"""Self-tests of the loopback fakes, driven by the real ``openai`` and ``anthropic`` SDKs."""

# ruff: noqa: F811 - the imported fixtures are redefined as test parameters on purpose

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from .fixtures import anthropic_server, openai_server, socket_guard  # noqa: F401 - used by name
from .http_fakes import (
    FakeAnthropicServer,
    FakeOpenAIServer,
    drip,
    malformed_body,
    ok,
    reset,
    slow,
    status,
    truncated,
)
from .socket_guard import SocketGuardError, guarded

OPENAI_KEY = "sk-test-SENTINEL-openai"
ANTHROPIC_KEY = "sk-ant-test-SENTINEL"
CLAUDE = "claude-test-model"  # not a real id, so the SDK emits no deprecation warnings
USER = [{"role": "user", "content": "What is 2+2?"}]


def openai_client(server: FakeOpenAIServer, **options: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_base_url, api_key=OPENAI_KEY, max_retries=0, **options)


def anthropic_client(server: FakeAnthropicServer, **options: object) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=ANTHROPIC_KEY, max_retries=0, **options)


def chat_text(client: openai.OpenAI, model: str = "m") -> str | None:
    """One chat completion of ``USER``; its text."""
    return client.chat.completions.create(model=model, messages=USER).choices[0].message.content


def claude_text(client: anthropic.Anthropic) -> str:
    """One Messages call of ``USER``; the text of its first block."""
    return client.messages.create(model=CLAUDE, max_tokens=8, messages=USER).content[0].text


# ---- OpenAI: successes


def test_chat_completion_text_usage_and_recording(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan(
        "/v1/chat/completions",
        ok(
            text="4",
            model="gpt-4.1-mini-2025-04-14",
            usage={"prompt_tokens": 12, "completion_tokens": 3, "reasoning_tokens": 1, "cached_tokens": 8},
        ),
    )
    reply = openai_client(openai_server).chat.completions.create(model="gpt-4.1-mini", messages=USER, seed=7)

    assert reply.choices[0].message.content == "4"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "gpt-4.1-mini-2025-04-14"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (12, 3, 15)
    assert reply.usage.prompt_tokens_details and reply.usage.prompt_tokens_details.cached_tokens == 8
    assert (
        reply.usage.completion_tokens_details and reply.usage.completion_tokens_details.reasoning_tokens == 1
    )

    sent = openai_server.last("/v1/chat/completions")
    assert (sent.method, sent.path, sent.route) == ("POST", "/v1/chat/completions", "/v1/chat/completions")
    assert sent.body == {"model": "gpt-4.1-mini", "messages": USER, "seed": 7}
    assert sent.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert sent.last_user_text == "What is 2+2?"
    assert reply._request_id == sent.request_id  # x-request-id reaches the SDK


def test_chat_usage_keys_left_out_are_absent_on_the_wire(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan(
        "/v1/chat/completions", ok(usage={"prompt_tokens": 5, "completion_tokens": 2}), ok(usage={})
    )
    client = openai_client(openai_server)

    first = client.chat.completions.create(model="m", messages=USER)
    second = client.chat.completions.create(model="m", messages=USER)

    assert first.usage is not None and first.usage.prompt_tokens_details is None
    assert first.usage.completion_tokens_details is None
    assert second.usage is None


def test_streamed_chat_reassembles_text_reasoning_and_usage(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan(
        "/v1/chat/completions",
        ok(
            text="The answer is 4.",
            reasoning="2 plus 2 makes 4",
            usage={"prompt_tokens": 9, "completion_tokens": 6},
        ),
    )
    stream = openai_client(openai_server).chat.completions.create(
        model="qwen3-8b", messages=USER, stream=True, stream_options={"include_usage": True}
    )

    text, reasoning, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            finish = choice.finish_reason or finish

    assert "".join(text) == "The answer is 4."
    assert "".join(reasoning) == "2 plus 2 makes 4"
    assert finish == "stop"
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (9, 6)


def test_stream_without_include_usage_has_no_usage_chunk(openai_server: FakeOpenAIServer) -> None:
    stream = openai_client(openai_server).chat.completions.create(model="m", messages=USER, stream=True)
    chunks = list(stream)
    assert all(chunk.usage is None for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"


def test_responses_api_text_and_token_details(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan(
        "/v1/responses",
        ok(
            text="4",
            reasoning="added",
            usage={"prompt_tokens": 40, "completion_tokens": 30, "reasoning_tokens": 20, "cached_tokens": 32},
        ),
    )
    response = openai_client(openai_server).responses.create(
        model="o4-mini",
        instructions="Answer briefly.",
        input="What is 2+2?",
        max_output_tokens=64,
        reasoning={"effort": "low"},
        store=False,
    )

    assert response.output_text == "4"
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (40, 30)
    assert response.usage.input_tokens_details.cached_tokens == 32
    assert response.usage.output_tokens_details.reasoning_tokens == 20
    sent = openai_server.last("/v1/responses")
    assert sent.body["instructions"] == "Answer briefly." and sent.body["max_output_tokens"] == 64
    assert sent.last_user_text == "What is 2+2?"


def test_truncated_output_on_chat_and_responses(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan("/v1/chat/completions", truncated("The answer i"))
    openai_server.plan("/v1/responses", truncated("The answer i"))
    client = openai_client(openai_server)

    chat = client.chat.completions.create(model="m", messages=USER)
    response = client.responses.create(model="m", input="q")

    assert (chat.choices[0].finish_reason, chat.choices[0].message.content) == ("length", "The answer i")
    assert response.status == "incomplete"
    assert (
        response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    )


def test_json_reply_is_sent_as_text(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan("/v1/chat/completions", ok(json={"verdict": "correct", "reason": "4"}))
    reply = openai_client(openai_server).chat.completions.create(model="m", messages=USER)
    assert json.loads(reply.choices[0].message.content or "") == {"verdict": "correct", "reason": "4"}


def test_azure_deployment_path_query_and_key(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan(
        "/openai/deployments/prod-gpt4o/chat/completions", ok(text="azure says hi", model="gpt-4o")
    )
    client = openai.AzureOpenAI(
        azure_endpoint=openai_server.url, api_version="2024-10-21", api_key="azure-SENTINEL", max_retries=0
    )

    reply = client.chat.completions.create(model="prod-gpt4o", messages=USER)

    assert reply.choices[0].message.content == "azure says hi"
    sent = openai_server.last("/v1/chat/completions")
    assert sent.path == "/openai/deployments/prod-gpt4o/chat/completions"
    assert sent.deployment == "prod-gpt4o"
    assert sent.query == {"api-version": "2024-10-21"}
    assert sent.headers["api-key"] == "azure-SENTINEL"
    # openai releases before 2.34 also send the key as a bearer token (to the same server); later ones do not.
    assert sent.headers.get("authorization") in (None, "Bearer azure-SENTINEL")
    assert openai_server.calls("/openai/deployments/prod-gpt4o/chat/completions") == 1


def test_models_list_and_base_prefix_does_not_matter(openai_server: FakeOpenAIServer) -> None:
    models = openai_client(openai_server).models.list()
    assert [m.id for m in models.data] == list(openai_server.models)

    prefixed = openai.OpenAI(base_url=f"{openai_server.url}/compatible-mode/v1", api_key="x", max_retries=0)
    bare = openai.OpenAI(base_url=openai_server.url, api_key="x", max_retries=0)
    assert chat_text(prefixed) == "ok"
    assert chat_text(bare) == "ok"
    assert [r.path for r in openai_server.requests_for("/v1/chat/completions")] == [
        "/compatible-mode/v1/chat/completions",
        "/chat/completions",
    ]


# ---- OpenAI: faults


def test_429_is_a_rate_limit_error_with_retry_headers_then_the_plan_continues(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.plan(
        "/v1/chat/completions", status(429, retry_after=2, retry_after_ms=1500), ok(text="after wait")
    )
    client = openai_client(openai_server)

    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=USER)
    assert caught.value.response.headers["retry-after"] == "2"
    assert caught.value.response.headers["retry-after-ms"] == "1500"
    assert caught.value.code == "rate_limit_exceeded"

    assert chat_text(client) == "after wait"
    assert openai_server.calls("/v1/chat/completions") == 2  # max_retries=0: no hidden SDK retries
    assert openai_server.pending("/v1/chat/completions") == 0


def test_context_length_error_code(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan("/v1/chat/completions", status(400, code="context_length_exceeded"))
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(openai_server).chat.completions.create(model="m", messages=USER)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.type == "invalid_request_error"
    assert "maximum context length" in caught.value.message


def test_5xx_maps_to_internal_server_error(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan("/v1/chat/completions", status(503, message="try later"))
    with pytest.raises(openai.InternalServerError, match="try later"):
        openai_client(openai_server).chat.completions.create(model="m", messages=USER)


def test_slow_headers_trigger_the_client_timeout(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan("/v1/chat/completions", slow(5))
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        openai_client(openai_server, timeout=0.3).chat.completions.create(model="m", messages=USER)
    assert time.monotonic() - started < 2


def test_drip_sends_headers_first_and_the_body_slowly(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan("/v1/chat/completions", drip(0.6, chunks=3, then=ok(text="eventually")))
    client = openai_client(openai_server)

    started = time.monotonic()
    with client.chat.completions.with_streaming_response.create(model="m", messages=USER) as response:
        headers_after = time.monotonic() - started
        body = response.http_response.read()
    body_after = time.monotonic() - started

    assert headers_after < 0.3
    assert body_after >= 0.5
    assert json.loads(body)["choices"][0]["message"]["content"] == "eventually"


def test_reset_surfaces_as_a_connection_error_and_the_server_keeps_serving(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.plan("/v1/chat/completions", reset())
    client = openai_client(openai_server)

    with pytest.raises(openai.APIConnectionError) as caught:
        client.chat.completions.create(model="m", messages=USER)
    assert not isinstance(caught.value, openai.APITimeoutError)
    assert chat_text(client) == "ok"
    assert openai_server.errors == []


def test_malformed_bodies_are_200s_and_do_not_crash_the_server(openai_server: FakeOpenAIServer) -> None:
    openai_server.plan("/v1/chat/completions", malformed_body("html"), malformed_body("json"))
    raw = openai_client(openai_server).chat.completions.with_raw_response

    html = raw.create(model="m", messages=USER).http_response
    broken = raw.create(model="m", messages=USER).http_response

    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert html.text.startswith("<html>")
    assert broken.status_code == 200 and broken.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken.text)
    assert chat_text(openai_client(openai_server)) == "ok"
    assert openai_server.errors == []


def test_unknown_path_is_a_404_in_the_provider_shape(openai_server: FakeOpenAIServer) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        openai_client(openai_server).embeddings.create(model="m", input="x")
    assert caught.value.body == {
        "message": "Invalid URL (POST /v1/embeddings)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert openai_server.last().route is None


def test_require_key_gives_401_without_consuming_the_plan(openai_server: FakeOpenAIServer) -> None:
    openai_server.require_key = OPENAI_KEY
    openai_server.plan("/v1/chat/completions", ok(text="authorised"))
    wrong = openai.OpenAI(base_url=openai_server.openai_base_url, api_key="sk-wrong", max_retries=0)

    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.chat.completions.create(model="m", messages=USER)
    assert caught.value.code == "invalid_api_key"
    assert "sk-wrong" not in str(caught.value)
    assert chat_text(openai_client(openai_server)) == "authorised"
    assert [r.headers["authorization"] for r in openai_server.requests] == [
        "Bearer sk-wrong",
        f"Bearer {OPENAI_KEY}",
    ]


def test_require_key_on_azure_checks_the_api_key_header(openai_server: FakeOpenAIServer) -> None:
    openai_server.require_key = "azure-right"

    def azure(key: str) -> openai.AzureOpenAI:
        return openai.AzureOpenAI(
            azure_endpoint=openai_server.url, api_version="2024-10-21", api_key=key, max_retries=0
        )

    with pytest.raises(openai.AuthenticationError):
        azure("azure-wrong").chat.completions.create(model="dep", messages=USER)
    assert chat_text(azure("azure-right"), model="dep") == "ok"


# ---- Recording, plans, handler


def test_calls_are_counted_per_path_and_bodies_recorded_even_when_not_json(
    openai_server: FakeOpenAIServer,
) -> None:
    client = openai_client(openai_server)
    threads = [
        threading.Thread(target=lambda: client.chat.completions.create(model="m", messages=USER))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.responses.create(model="m", input="hi")
    httpx.post(f"{openai_server.openai_base_url}/chat/completions?x=1", content=b"not json{", timeout=5)

    assert openai_server.calls("/v1/chat/completions") == 9
    assert openai_server.calls("/v1/responses") == 1
    assert openai_server.calls() == 10
    odd = openai_server.last("/v1/chat/completions")
    assert (odd.body, odd.raw_body, odd.query, odd.query_string) == (None, b"not json{", {"x": "1"}, "x=1")
    assert len({r.request_id for r in openai_server.requests}) == 10
    with pytest.raises(LookupError):
        openai_server.last("/v1/models")


def test_default_entry_handler_and_reset_plans(openai_server: FakeOpenAIServer) -> None:
    client = openai_client(openai_server)
    openai_server.handler = lambda request: ok(text=f"echo: {request.last_user_text}")
    openai_server.plan("/v1/chat/completions", ok(text="planned"), ok(text="dropped"))

    assert chat_text(client) == "planned"
    openai_server.reset_plans()
    assert chat_text(client) == "echo: What is 2+2?"
    openai_server.handler = None
    openai_server.default = ok(text="fallback")
    assert chat_text(client) == "fallback"

    with pytest.raises(ValueError, match="serves no path"):
        openai_server.plan("/v1/chat/complete", ok())


def test_stop_closes_keep_alive_connections_and_joins_threads() -> None:
    server = FakeOpenAIServer().start()
    client = openai_client(server)
    client.chat.completions.create(model="m", messages=USER)  # leaves a pooled connection
    server.plan("/v1/chat/completions", slow(30))
    pending = threading.Thread(
        target=lambda: pytest.raises(
            openai.APIError, client.chat.completions.create, model="m", messages=USER
        )
    )
    pending.start()
    while server.calls() < 2:
        time.sleep(0.01)
    port = server.port

    started = time.monotonic()
    server.stop()
    pending.join(timeout=5)

    assert time.monotonic() - started < 2
    assert not pending.is_alive()
    assert not any(t.name == "fake-openai" for t in threading.enumerate())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


# ---- Anthropic


def test_anthropic_text_reply_and_usage(anthropic_server: FakeAnthropicServer) -> None:
    anthropic_server.plan(
        "/v1/messages",
        ok(
            text="4",
            usage={
                "prompt_tokens": 100,
                "completion_tokens": 7,
                "cached_tokens": 60,
                "cache_write_tokens": 30,
            },
        ),
    )
    message = anthropic_client(anthropic_server).messages.create(
        model=CLAUDE, max_tokens=256, system="Be brief.", messages=USER
    )

    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "4"
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (10, 7)
    assert (message.usage.cache_read_input_tokens, message.usage.cache_creation_input_tokens) == (60, 30)
    sent = anthropic_server.last("/v1/messages")
    assert sent.api_key == ANTHROPIC_KEY
    assert sent.headers["anthropic-version"]
    assert sent.body["system"] == "Be brief." and sent.body["max_tokens"] == 256
    assert message._request_id == sent.request_id


def test_anthropic_forced_tool_gets_a_tool_use_block(anthropic_server: FakeAnthropicServer) -> None:
    anthropic_server.plan("/v1/messages", ok(json={"verdict": "correct", "reason": "2+2=4"}))
    message = anthropic_client(anthropic_server).messages.create(
        model=CLAUDE,
        max_tokens=256,
        messages=USER,
        tools=[{"name": "verdict", "description": "grade", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "verdict"},
    )

    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use"
    assert (block.name, block.input) == ("verdict", {"verdict": "correct", "reason": "2+2=4"})


def test_anthropic_thinking_block_precedes_the_text(anthropic_server: FakeAnthropicServer) -> None:
    anthropic_server.plan("/v1/messages", ok(text="4", reasoning="2 and 2 make 4"))
    message = anthropic_client(anthropic_server).messages.create(
        model=CLAUDE,
        max_tokens=4096,
        messages=USER,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )

    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "2 and 2 make 4"
    assert anthropic_server.last().body["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_anthropic_max_tokens_stop(anthropic_server: FakeAnthropicServer) -> None:
    anthropic_server.plan("/v1/messages", truncated("The ans"))
    message = anthropic_client(anthropic_server).messages.create(model=CLAUDE, max_tokens=3, messages=USER)
    assert message.stop_reason == "max_tokens"
    assert message.content[0].text == "The ans"


def test_anthropic_error_shapes(anthropic_server: FakeAnthropicServer) -> None:
    anthropic_server.plan(
        "/v1/messages",
        status(400, code="context_length_exceeded"),
        status(429, retry_after=3),
        status(529),
    )
    client = anthropic_client(anthropic_server)

    with pytest.raises(anthropic.BadRequestError) as too_long:
        client.messages.create(model=CLAUDE, max_tokens=8, messages=USER)
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(model=CLAUDE, max_tokens=8, messages=USER)
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        client.messages.create(model=CLAUDE, max_tokens=8, messages=USER)

    assert too_long.value.body["error"]["type"] == "invalid_request_error"
    assert too_long.value.body["error"]["message"].startswith("prompt is too long")
    assert limited.value.response.headers["retry-after"] == "3"
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"
    assert anthropic_server.calls("/v1/messages") == 3


def test_anthropic_require_key(anthropic_server: FakeAnthropicServer) -> None:
    anthropic_server.require_key = ANTHROPIC_KEY
    wrong = anthropic.Anthropic(base_url=anthropic_server.url, api_key="sk-ant-wrong", max_retries=0)

    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model=CLAUDE, max_tokens=8, messages=USER)
    assert caught.value.body["error"]["type"] == "authentication_error"
    assert claude_text(anthropic_client(anthropic_server)) == "ok"
    assert [r.api_key for r in anthropic_server.requests] == ["sk-ant-wrong", ANTHROPIC_KEY]
    raw = httpx.post(
        f"{anthropic_server.url}/v1/messages",
        headers={"x-api-key": ANTHROPIC_KEY},
        json={"model": CLAUDE, "max_tokens": 8, "messages": USER},
        timeout=5,
    )
    assert raw.status_code == 200  # the API's own header works too


# ---- Socket guard


@pytest.fixture
def tripwire(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Stand-ins for the real connect calls: if the guard ever let a non-loopback address through, the test
    would fail here instead of sending a packet."""
    leaked: list[object] = []
    real_connect, real_connect_ex, real_create = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.create_connection,
    )

    def is_loopback(address: object) -> bool:
        return not isinstance(address, tuple) or str(address[0]) in ("127.0.0.1", "::1", "localhost")

    def connect(self: socket.socket, address: object) -> None:
        if not is_loopback(address):
            leaked.append(address)
            raise AssertionError(f"guard let {address} through")
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: object) -> int:
        if not is_loopback(address):
            leaked.append(address)
            raise AssertionError(f"guard let {address} through")
        return real_connect_ex(self, address)

    def create_connection(address: tuple[str, int], *args: object, **kwargs: object) -> socket.socket:
        if not is_loopback(address):
            leaked.append(address)
            raise AssertionError(f"guard let {address} through")
        return real_create(address, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    yield leaked


def test_socket_guard_refuses_non_loopback_before_connecting(tripwire: list[object]) -> None:
    with guarded() as guard:
        with pytest.raises(SocketGuardError, match=r"10\.0\.0\.1:80"):
            socket.create_connection(("10.0.0.1", 80), timeout=0.1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            with pytest.raises(SocketGuardError, match=r"10\.0\.0\.1:80"):
                sock.connect(("10.0.0.1", 80))
            with pytest.raises(SocketGuardError, match=r"10\.0\.0\.1:80"):
                sock.connect_ex(("10.0.0.1", 80))
        with pytest.raises(SocketGuardError, match="api.openai.com"):
            socket.getaddrinfo("api.openai.com", 443)

    assert tripwire == []
    assert ("create_connection", "10.0.0.1:80") in guard.refused
    assert [op for op, _ in guard.refused] == ["create_connection", "connect", "connect_ex", "getaddrinfo"]


def test_socket_guard_blocks_sdk_calls_to_real_hosts(tripwire: list[object]) -> None:
    client = openai.OpenAI(base_url="http://10.0.0.1:80/v1", api_key="x", max_retries=0, timeout=1)
    # This SDK lets non-httpx errors through as they are; older ones wrapped them in APIConnectionError.
    with guarded() as guard, pytest.raises((SocketGuardError, openai.APIConnectionError)) as caught:
        client.chat.completions.create(model="m", messages=USER)
    assert isinstance(caught.value, SocketGuardError) or isinstance(caught.value.__cause__, SocketGuardError)
    assert guard.refused == [("create_connection", "10.0.0.1:80")]
    assert tripwire == []


def test_socket_guard_allows_the_fakes_and_unix_sockets(
    socket_guard: object, openai_server: FakeOpenAIServer, anthropic_server: FakeAnthropicServer
) -> None:
    assert chat_text(openai_client(openai_server)) == "ok"
    assert claude_text(anthropic_client(anthropic_server)) == "ok"
    with socket.create_connection(("localhost", openai_server.port), timeout=1):
        pass
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "s.sock")
        with socket.socket(socket.AF_UNIX) as listener, socket.socket(socket.AF_UNIX) as client:
            listener.bind(path)
            listener.listen(1)
            client.connect(path)
    assert socket_guard.refused == []
    assert socket_guard.attempts


def test_socket_guard_restores_the_socket_module() -> None:
    originals = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.create_connection,
        socket.getaddrinfo,
    )
    with guarded():
        with guarded(allowed_ports={1}), pytest.raises(SocketGuardError, match="loopback ports"):
            socket.create_connection(("127.0.0.1", 2), timeout=0.1)
        assert socket.create_connection is not originals[2]
    assert (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.create_connection,
        socket.getaddrinfo,
    ) == originals
