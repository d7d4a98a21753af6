"""The ``target`` role as the shared runner uses it, served by the real ``scripted`` backend with a
plug-in's own ``scripted_rules`` (or rules a test gives), recording every request."""

from __future__ import annotations

from typing import Any

from skillopt.llm.base import BackendContext
from skillopt.llm.chat import ChatRequest, ChatResponse
from skillopt.llm.scripted import ScriptedBackend, resolve_rule_set


class PluginScriptedTarget:
    def __init__(self, benchmark: Any, rules: Any = None) -> None:
        context = BackendContext(scripted_target_rules=tuple(benchmark.scripted_rules))
        self.backend = ScriptedBackend(resolve_rule_set(rules, context, where="test"), role="target")
        self.requests: list[ChatRequest] = []

    def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        return self.backend.attempt(request, timeout_s=30)
