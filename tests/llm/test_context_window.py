"""Context windows and overflows: where a role's window comes from, how a structured call fits it, what
happens when a server still says the prompt is too long, and that a re-ask is never larger than the first
call.

Everything runs against the loopback OpenAI fake through the real SDK."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from skillopt.core.config import load_config
from skillopt.llm.base import BackendRegistry
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.llm.clients import ModelClients
from skillopt.llm.context import (
    CHARS_PER_TOKEN,
    DEFAULT_CONTEXT_TOKENS,
    PromptRoom,
    known_context_tokens,
    window_from_error,
)
from skillopt.llm.errors import ContextLengthExceeded
from tests.fakes.http_fakes import ok, raw, status

CHAT = "/v1/chat/completions"
MODELS = "/v1/models"


class Verdict(BaseModel):
    verdict: str
    reason: str = ""


def optimizer(server, *overrides: str) -> ModelClients:
    loaded = load_config("demo", overrides=[
        "model.optimizer.backend=openai_compatible", f"model.optimizer.base_url={server.openai_base_url}",
        "model.optimizer.model=small-model", "model.optimizer.options={thinking: server_default}",
        "model.judge=null", "model.retry.base=0.01", *overrides,
    ], env={})
    return ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default())


def builder(calls: list[int]):
    """A request builder whose evidence shrinks to the size asked for (like the optimizer stages)."""
    evidence = "evidence " * 4000

    def build(limit: int) -> ChatRequest:
        calls.append(limit)
        head = "Judge the answer. Reply with JSON."
        room = max(0, limit - len(head))
        return ChatRequest(messages=[system(head), user(evidence[:room])], stage="analyst")

    return build


def test_the_window_comes_from_the_setting_then_the_server_then_the_table(openai_server):
    openai_server.plan(MODELS, raw(200, json.dumps({"object": "list", "data": [
        {"id": "other", "object": "model", "max_model_len": 999},
        {"id": "small-model", "object": "model", "max_model_len": 4096}]})))
    assert optimizer(openai_server).optimizer.context_window() == 4096
    assert optimizer(openai_server, "model.optimizer.context_tokens=2048").optimizer.context_window() == 2048
    # llama.cpp's server names its window under meta.n_ctx
    openai_server.plan(MODELS, raw(200, json.dumps({"data": [{"id": "x", "meta": {"n_ctx": 3072}}]})))
    assert optimizer(openai_server).optimizer.context_window() == 3072
    # a server that says nothing: the known-models table, else the default
    openai_server.plan(MODELS, raw(200, json.dumps({"data": [{"id": "small-model"}]})))
    assert optimizer(openai_server).optimizer.context_window() == DEFAULT_CONTEXT_TOKENS
    openai_server.plan(MODELS, raw(200, json.dumps({"data": []})))
    named = optimizer(openai_server, "model.optimizer.price_model=HuggingFaceTB/SmolLM2-135M-Instruct")
    assert named.optimizer.context_window() == known_context_tokens("smollm2-135m") == 8192


def test_a_prompt_is_built_for_the_room_the_window_leaves_and_the_reply_cap_fits_beside_it(openai_server):
    openai_server.plan(CHAT, ok(json={"verdict": "correct", "reason": "r"}))
    calls: list[int] = []
    clients = optimizer(openai_server, "model.optimizer.context_tokens=4096")
    verdict, _ = clients.optimizer.structured(builder(calls), Verdict)
    assert verdict.verdict == "correct"
    room = PromptRoom.of(4096, 16384)
    assert room.answer_tokens == 1024  # a quarter of the window: max_tokens 16384 cannot fit
    body = openai_server.last(CHAT).body
    sent = sum(len(m["content"]) for m in body["messages"])
    assert sent <= room.prompt_chars
    assert sent // CHARS_PER_TOKEN + body["max_tokens"] <= 4096


def test_an_overflow_is_shrunk_to_the_window_the_server_names_and_sent_once_more(openai_server):
    openai_server.plan(
        CHAT,
        status(400, code="context_length_exceeded",
               message="This model's maximum context length is 2048 tokens. However, you requested 9000 "
                       "tokens"),
        ok(json={"verdict": "correct", "reason": "r"}),
    )
    calls: list[int] = []
    clients = optimizer(openai_server, "model.optimizer.context_tokens=16384")
    verdict, _ = clients.optimizer.structured(builder(calls), Verdict)
    assert verdict.verdict == "correct" and openai_server.calls(CHAT) == 2
    first, second = (
        sum(len(m["content"]) for m in r.body["messages"]) for r in openai_server.requests_for(CHAT)
    )
    assert second < first
    assert second <= PromptRoom.of(2048, 16384).prompt_chars
    assert clients.optimizer.context_window() == 2048  # remembered for the next calls


def test_a_second_overflow_raises_for_the_stage_to_fall_back(openai_server):
    too_long = status(400, code="context_length_exceeded", message="prompt is too long")
    openai_server.plan(CHAT, too_long, too_long)
    with pytest.raises(ContextLengthExceeded):
        optimizer(openai_server, "model.optimizer.context_tokens=8192").optimizer.structured(
            builder([]), Verdict
        )
    assert openai_server.calls(CHAT) == 2


def test_a_stage_that_cannot_fit_the_window_says_so_instead_of_blaming_max_tokens(openai_server):
    too_long = status(400, code="context_length_exceeded",
                      message="This model's maximum context length is 2048 tokens. However, you requested "
                              "2527 tokens (2511 in the messages, 16 in the completion)")
    openai_server.plan(CHAT, too_long, too_long)
    with pytest.raises(ContextLengthExceeded) as raised:
        optimizer(openai_server, "model.optimizer.context_tokens=8192").optimizer.structured(
            builder([]), Verdict
        )
    assert "stage analyst does not fit this model's 2,048-token context window even at" in str(raised.value)
    assert "lower max_tokens" not in str(raised.value)


def test_a_re_ask_is_never_larger_than_the_first_call(openai_server):
    openai_server.plan(
        CHAT, ok(text="I believe the answer is correct. " * 50), ok(json={"verdict": "incorrect"})
    )
    clients = optimizer(openai_server, "model.optimizer.context_tokens=4096")
    verdict, _ = clients.optimizer.structured(builder([]), Verdict)
    assert verdict.verdict == "incorrect"
    first, second = (r.body["messages"] for r in openai_server.requests_for(CHAT))
    assert sum(len(m["content"]) for m in second) <= sum(len(m["content"]) for m in first)
    assert "I believe" not in json.dumps(second)
    assert "Your previous reply could not be used" in second[-1]["content"]


@pytest.mark.parametrize(("message", "window"), [
    ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens", 4096),
    ("Requested tokens (5000) exceed context window of 4096", 4096),
    ('{"type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}', 4096),
    ("prompt is too long", None),
])
def test_the_window_is_read_from_overflow_messages(message, window):
    assert window_from_error(message) == window


def test_prompt_density_comes_from_long_prompts_not_the_chat_template_of_short_ones(openai_server):
    clients = optimizer(openai_server, "model.optimizer.context_tokens=4096")
    short = ChatRequest(messages=[user("hi")], stage="analyst")
    openai_server.plan(CHAT, ok(text="a", usage={"prompt_tokens": 40, "completion_tokens": 1}))
    clients.optimizer.chat(short)  # 2 characters in 40 tokens: the template, not the text
    assert clients.optimizer.prompt_room().chars_per_token == CHARS_PER_TOKEN
    long = ChatRequest(messages=[user("x" * 2500)], stage="analyst")
    openai_server.plan(CHAT, ok(text="a", usage={"prompt_tokens": 1000, "completion_tokens": 1}))
    clients.optimizer.chat(long)
    assert clients.optimizer.prompt_room().chars_per_token == 2.5


def test_prompt_density_counts_the_schema_instruction_a_json_object_server_reads(openai_server):
    """On a server that takes the schema in the prompt (``json_object``), its prompt tokens include the
    schema instruction: the density is the characters sent per token, schema included."""
    from skillopt.llm.clients import _schema_chars

    clients = optimizer(openai_server, "model.optimizer.context_tokens=4096",
                        "model.optimizer.structured_output=json_object")
    request = ChatRequest(messages=[user("x" * 2500)], stage="analyst", response_schema=Verdict)
    sent = 2500 + _schema_chars(Verdict)
    openai_server.plan(CHAT, ok(text='{"verdict": "yes"}', usage={"prompt_tokens": sent // 2,
                                                                   "completion_tokens": 5}))
    clients.optimizer.structured(request, Verdict)
    body = openai_server.last(CHAT).body
    assert schema_text_in(body), "json_object carries the schema in the prompt"
    assert clients.optimizer.prompt_room().chars_per_token == pytest.approx(sent / (sent // 2))


def test_prompt_density_leaves_out_a_schema_sent_for_constrained_decoding(openai_server):
    clients = optimizer(openai_server, "model.optimizer.context_tokens=4096",
                        "model.optimizer.structured_output=json_schema")
    request = ChatRequest(messages=[user("x" * 2500)], stage="analyst", response_schema=Verdict)
    openai_server.plan(CHAT, ok(text='{"verdict": "yes"}', usage={"prompt_tokens": 1000,
                                                                   "completion_tokens": 5}))
    clients.optimizer.structured(request, Verdict)
    assert not schema_text_in(openai_server.last(CHAT).body)
    assert clients.optimizer.prompt_room().chars_per_token == 2.5


def schema_text_in(body: dict) -> bool:
    return any('"verdict"' in str(message.get("content")) for message in body["messages"])


def test_a_reply_cut_at_the_cap_the_window_left_is_reported_against_that_cap(openai_server):
    """With the window known, ``chat`` lowers the reply cap to what the window leaves beside the prompt; a
    reply that stops there was cut by that cap, and the reason names the cap that was sent."""
    from skillopt.llm.errors import ParseError

    clients = optimizer(openai_server, "model.optimizer.context_tokens=4096",
                        "model.optimizer.max_tokens=1024", "model.optimizer.structured_output=json_schema")
    request = ChatRequest(messages=[user("x" * 3 * 3500)], stage="analyst", response_schema=Verdict)
    for _ in range(2):  # the call and its re-ask
        openai_server.plan(CHAT, ok(text='{"verdict": "ye', finish_reason="length",
                                    usage={"prompt_tokens": 3500, "completion_tokens": 200}))
    with pytest.raises(ParseError) as raised:
        clients.optimizer.structured(lambda _limit: request, Verdict)
    sent = openai_server.last(CHAT).body["max_tokens"]
    assert sent < 1024
    assert f"cut off at max_tokens ({sent})" in str(raised.value), str(raised.value)
