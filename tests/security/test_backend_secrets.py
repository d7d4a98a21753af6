"""Sentinel keys reach the fake providers and nothing else: not logs, errors, usage records or dumps."""

from __future__ import annotations

import logging

import pytest

from skillopt.core.config import load_config
from skillopt.llm.base import BackendRegistry
from skillopt.llm.chat import ChatRequest, user
from skillopt.llm.clients import ModelClients
from skillopt.llm.errors import BackendError
from skillopt.llm.roles import provenance_table
from tests.fakes.http_fakes import ok, status

SENTINELS = {
    "OPENAI_API_KEY": "sk-SENTINEL-7f3a-openai-0001",
    "ANTHROPIC_API_KEY": "sk-ant-SENTINEL-7f3a-anthropic-0002",
    "AZURE_OPENAI_API_KEY": "SENTINEL-7f3a-azure-0003",
    "DASHSCOPE_API_KEY": "sk-SENTINEL-7f3a-dashscope-0004",
    "OPENAI_COMPATIBLE_API_KEY": "SENTINEL-7f3a-compat-0005",
}


def test_sentinel_keys_appear_only_in_requests_the_fakes_received(
    tmp_path, openai_server, anthropic_server, caplog
):
    caplog.set_level(logging.DEBUG)
    overrides = [
        "model.target.backend=openai_compatible",
        f"model.target.base_url={openai_server.openai_base_url}",
        "model.target.model=m",
        "model.optimizer.backend=anthropic",
        f"model.optimizer.base_url={anthropic_server.url}",
        "model.judge.backend=azure",
        f"model.judge.base_url={openai_server.url}",
        "model.judge.model=dep",
        "model.retry.max_attempts=2",
    ]
    loaded = load_config("qa", overrides=overrides, env=SENTINELS)
    usage_path = tmp_path / "usage.jsonl"
    bundle = ModelClients.from_config(loaded, env=SENTINELS, registry=BackendRegistry.default(),
                                      usage_path=usage_path, sleep=lambda s: None)
    openai_server.plan("/v1/chat/completions", status(500), ok(text="fine"), status(401))
    openai_server.plan("/openai/deployments/dep/chat/completions", status(403))
    anthropic_server.plan(
        "/v1/messages", status(401, message=f"invalid x-api-key {SENTINELS['ANTHROPIC_API_KEY']}")
    )

    texts: list[str] = []
    texts.append(bundle.target.chat(ChatRequest(messages=[user("hi")], stage="rollout")).text)
    for client, stage in ((bundle.target, "rollout"), (bundle.optimizer, "analyst"), (bundle.judge, "judge")):
        with pytest.raises(BackendError) as info:
            client.chat(ChatRequest(messages=[user("hi")], stage=stage))
        texts.append(str(info.value))
        texts.append(repr(info.value))

    # Where each API takes its key: Authorization (OpenAI-style), api-key (Azure), x-api-key (Anthropic; some
    # SDK releases send Authorization instead).
    key_headers = ("authorization", "api-key", "x-api-key")
    received = " ".join(" ".join(r.headers.get(name, "") for name in key_headers)
                        for server in (openai_server, anthropic_server) for r in server.requests)
    assert SENTINELS["OPENAI_COMPATIBLE_API_KEY"] in received  # the keys did go where they belong
    assert SENTINELS["ANTHROPIC_API_KEY"] in received
    assert SENTINELS["AZURE_OPENAI_API_KEY"] in received

    texts.append(caplog.text)
    texts.append(usage_path.read_text(encoding="utf-8"))
    texts.extend(
        role.model_dump_json() for role in (bundle.roles.target, bundle.roles.optimizer, bundle.roles.judge)
    )
    texts.extend(" ".join(row) for row in provenance_table(bundle.roles, SENTINELS))
    everything = "\n".join(texts)
    assert "invalid x-api-key" in everything  # the provider's message is kept ...
    for name, value in SENTINELS.items():
        assert value not in everything, f"{name} leaked"  # ... but never the key
