"""``model.<role>.structured_output``: what goes on the wire for each mode, against the loopback
OpenAI-compatible and Anthropic fakes through the real SDKs, and what a refusal teaches the run."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from skillopt.core.config import load_config
from skillopt.llm.base import BackendRegistry
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.llm.clients import ModelClients
from tests.fakes.http_fakes import ok, status

CHAT = "/v1/chat/completions"


class Verdict(BaseModel):
    verdict: str
    reason: str = ""


class Notes(BaseModel):
    scores: dict[str, float]  # a free-form map: no strict schema exists for it


def clients_for(server, *overrides: str, judge_too: bool = False) -> ModelClients:
    roles = ["optimizer", "judge"] if judge_too else ["optimizer"]
    settings = ["model.judge=null"] if not judge_too else []
    for role in roles:
        settings += [f"model.{role}.backend=openai_compatible",
                     f"model.{role}.base_url={server.openai_base_url}",
                     f"model.{role}.model=small-model", f"model.{role}.options={{thinking: server_default}}",
                     f"model.{role}.context_tokens=8192"]
    loaded = load_config("demo", overrides=[*settings, "model.retry.base=0.01", *overrides], env={})
    return ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default())


def request() -> ChatRequest:
    return ChatRequest(messages=[system("Judge the answer."), user("The answer is 4.")], stage="analyst")


def test_auto_asks_a_compatible_server_for_a_strict_json_schema(openai_server):
    openai_server.plan(CHAT, ok(json={"verdict": "correct", "reason": "r"}))
    verdict, _ = clients_for(openai_server).optimizer.structured(request(), Verdict)
    assert verdict.verdict == "correct"
    body = openai_server.last(CHAT).body
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["strict"] is True
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["verdict", "reason"]
    assert "JSON schema" not in body["messages"][0]["content"]


def test_a_schema_that_cannot_be_strict_is_still_sent_as_a_constraint(openai_server):
    openai_server.plan(CHAT, ok(json={"scores": {"a": 1.0}}))
    notes, _ = clients_for(openai_server).optimizer.structured(request(), Notes)
    assert notes.scores == {"a": 1.0}
    json_schema = openai_server.last(CHAT).body["response_format"]["json_schema"]
    assert json_schema["strict"] is False and "scores" in json_schema["schema"]["properties"]


@pytest.mark.parametrize(("mode", "response_format"), [("json_object", "json_object"), ("prompt", None)])
def test_json_object_and_prompt_carry_the_schema_in_the_prompt(openai_server, mode, response_format):
    openai_server.plan(CHAT, ok(json={"verdict": "correct"}))
    clients = clients_for(openai_server, f"model.optimizer.structured_output={mode}")
    clients.optimizer.structured(request(), Verdict)
    body = openai_server.last(CHAT).body
    assert body.get("response_format", {}).get("type") == response_format
    assert "must match this JSON schema" in body["messages"][0]["content"]


def test_a_refusal_is_learned_once_per_endpoint_for_every_role_on_it(openai_server, caplog):
    refusal = status(400, message="response_format json_schema is not supported")
    openai_server.plan(CHAT, refusal, refusal, ok(json={"verdict": "correct"}),
                       ok(json={"verdict": "incorrect"}))
    clients = clients_for(openai_server, judge_too=True)
    first, _ = clients.optimizer.structured(request(), Verdict)
    second, _ = clients.get("judge").structured(request().model_copy(update={"stage": "judge"}), Verdict)
    assert (first.verdict, second.verdict) == ("correct", "incorrect")
    sent = [r.body.get("response_format", {}).get("type") for r in openai_server.requests_for(CHAT)]
    assert sent == ["json_schema", "json_object", None, None]
    notes = [r.getMessage() for r in caplog.records if "the server refused" in r.getMessage()]
    assert len(notes) == 2 and "model.optimizer.structured_output" in notes[0]
    assert "now use json_object" in notes[0] and "now use prompt" in notes[1]


def test_llama_cpp_python_takes_json_object_with_the_schema_beside_it(openai_server):
    # llama-cpp-python's server: HTTP 500 and a validation message for json_schema; json_object + schema works
    rejected = status(500, message="1 validation error: ('body', 'response_format', 'type') Input should be "
                                   "'text' or 'json_object'")
    openai_server.plan(CHAT, rejected, ok(json={"verdict": "correct"}))
    verdict, _ = clients_for(openai_server).optimizer.structured(request(), Verdict)
    assert verdict.verdict == "correct" and openai_server.calls(CHAT) == 2  # no retry of the 500
    response_format = openai_server.last(CHAT).body["response_format"]
    assert response_format["type"] == "json_object"
    assert response_format["schema"]["required"] == ["verdict", "reason"]


def test_an_unrelated_bad_request_is_not_taken_for_a_refusal_twice(openai_server):
    bad = status(400, message="bad")
    openai_server.plan(CHAT, bad, bad, bad, bad)
    from skillopt.llm.errors import BadRequest

    with pytest.raises(BadRequest):
        clients_for(openai_server).optimizer.structured(request(), Verdict)
    assert openai_server.calls(CHAT) == 3  # json_schema, json_object, the prompt: no more


def test_anthropic_takes_a_forced_tool_unless_the_role_asks_for_the_prompt(anthropic_server):
    def anthropic(*overrides: str) -> ModelClients:
        loaded = load_config("demo", overrides=[
            "model.optimizer.backend=anthropic", f"model.optimizer.base_url={anthropic_server.url}",
            "model.optimizer.model=claude-sonnet-4-5", "model.judge=null", *overrides], env={})
        return ModelClients.from_config(loaded, env={"ANTHROPIC_API_KEY": "sk-test"},
                                        registry=BackendRegistry.default())

    anthropic_server.plan("/v1/messages", ok(json={"verdict": "correct"}), ok(text='{"verdict": "correct"}'))
    anthropic().optimizer.structured(request(), Verdict)
    assert anthropic_server.last("/v1/messages").body["tool_choice"]["name"] == "respond"
    anthropic("model.optimizer.structured_output=prompt").optimizer.structured(request(), Verdict)
    body = anthropic_server.last("/v1/messages").body
    assert "tools" not in body and "must match this JSON schema" in body["system"][0]["text"]
