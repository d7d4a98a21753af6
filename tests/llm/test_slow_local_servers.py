"""Slow servers on this machine: a timeout names the setting to raise, a retry after a timeout against a
loopback server waits (one tiny request) for it to be free instead of queueing behind the abandoned request,
loopback ``openai_compatible`` and ``local`` roles default to a 600 s timeout, and notes name the model
briefly."""

from __future__ import annotations

import pytest

from skillopt.core.config import load_config
from skillopt.llm.base import BackendRegistry
from skillopt.llm.chat import ChatRequest, user
from skillopt.llm.clients import ModelClients
from skillopt.llm.errors import CallTimeout
from skillopt.llm.roles import resolve_roles, short_model_name
from tests.fakes.http_fakes import ok, slow

CHAT = "/v1/chat/completions"


def target(server, *overrides: str) -> ModelClients:
    loaded = load_config("demo", overrides=[
        "model.target.backend=openai_compatible", f"model.target.base_url={server.openai_base_url}",
        "model.target.model=small-model", "model.target.options={thinking: server_default}",
        "model.judge=null", "model.retry.base=0.01", "model.target.context_tokens=8192", *overrides], env={})
    return ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default())


def test_a_retry_after_a_timeout_waits_for_the_local_server_to_be_free(openai_server):
    openai_server.plan(CHAT, slow(1.5, ok(text="late")), ok(text="OK"), ok(text="the answer"))
    clients = target(openai_server, "model.target.timeout_s=0.5")
    reply = clients.target.chat(ChatRequest(messages=[user("question")], stage="rollout"))
    assert reply.text == "the answer"
    sent = [r.body for r in openai_server.requests_for(CHAT)]
    assert len(sent) == 3 and sent[1]["max_tokens"] == 1  # the probe, then the retry: never two at once
    assert sent[2]["messages"] == sent[0]["messages"]


def test_a_timeout_names_the_setting_to_raise(openai_server):
    openai_server.plan(CHAT, slow(1.5, ok(text="late")))
    clients = target(openai_server, "model.target.timeout_s=0.5", "model.retry.max_attempts=1")
    with pytest.raises(CallTimeout) as raised:
        clients.target.chat(ChatRequest(messages=[user("question")], stage="rollout"))
    assert "model.target.timeout_s (now 0.5 s)" in str(raised.value)


@pytest.mark.parametrize(("base_url", "timeout"), [("http://127.0.0.1:8080/v1", 600.0),
                                                   ("http://localhost:11434/v1", 600.0),
                                                   ("https://api.example.com/v1", 120.0)])
def test_loopback_compatible_servers_default_to_600_s(base_url, timeout):
    loaded = load_config("demo", overrides=["model.target.backend=openai_compatible",
                                            f"model.target.base_url={base_url}", "model.judge=null"], env={})
    roles = resolve_roles(loaded, env={}, registry=BackendRegistry.default())
    assert roles.target.timeout_s == timeout


def test_a_model_file_is_named_by_its_name():
    assert short_model_name("/models/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    assert short_model_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
