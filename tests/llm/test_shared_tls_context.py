"""Every HTTP client skillopt builds shares one TLS context per process: building one loads the whole
certificate store (50-150 ms of a core on a two-core machine), and each SDK client, each context-window probe
and the credential check built their own.

Against the loopback OpenAI fake through the real SDK; the certificate store loads are counted, not
replaced."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator

import certifi
import openai
import pytest

from skillopt.core.config import load_config
from skillopt.llm import http_common
from skillopt.llm.base import BackendRegistry
from skillopt.llm.chat import ChatRequest, user
from skillopt.llm.clients import ModelClients
from tests.fakes.http_fakes import ok, raw

CHAT = "/v1/chat/completions"
MODELS = "/v1/models"


@pytest.fixture
def loads(monkeypatch) -> Iterator[list[object]]:
    """Each certificate store load from here on (``SSLContext.load_verify_locations``, which every verified
    context's build makes), in a fresh process's state: no context shared yet."""
    made: list[object] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        made.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    http_common._tls_context.cache_clear()
    yield made
    http_common._tls_context.cache_clear()  # none of these contexts outlives the test


def clients(server) -> ModelClients:
    loaded = load_config("demo", overrides=[
        *(f"model.{role}.{key}={value}" for role in ("target", "optimizer") for key, value in (
            ("backend", "openai_compatible"), ("base_url", server.openai_base_url), ("model", "small-model"),
            ("options", "{thinking: server_default}"))),
        "model.judge=null", "model.retry.base=0.01",
    ], env={})
    return ModelClients.from_config(loaded, env={}, registry=BackendRegistry.default())


def test_two_roles_and_the_window_probe_load_the_certificates_once(openai_server, loads):
    listing = raw(200, json.dumps({"object": "list", "data": [
        {"id": "small-model", "object": "model", "max_model_len": 4096}]}))
    openai_server.plan(MODELS, listing, listing)  # each role asks once: its reply caps are fitted to it
    openai_server.plan(CHAT, ok("hello"), ok("again"))
    models = clients(openai_server)
    assert models.target.chat(ChatRequest(messages=[user("hi")], stage="rollout")).text == "hello"
    assert models.optimizer.context_window() == 4096  # the probe's GET /models, on the shared context
    assert models.optimizer.chat(ChatRequest(messages=[user("hi")], stage="analyst")).text == "again"
    assert len(loads) == 1, "one verified context for both SDK clients and the probe"
    (context,) = loads
    assert context is http_common.shared_tls_context(http_common.http_library(openai))
    # the library's own default: verified, host names checked
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_a_changed_certificate_file_gets_its_own_context(loads, monkeypatch):
    library = http_common.http_library(openai)
    first = http_common.shared_tls_context(library)
    assert http_common.shared_tls_context(library) is first
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())  # a bundle every installation has
    other = http_common.shared_tls_context(library)
    assert other is not first, "a context is kept per SSL_CERT_FILE, which the library's default reads"
    assert len(loads) == 2
