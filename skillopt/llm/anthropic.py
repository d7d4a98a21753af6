"""The ``anthropic`` backend: Claude through the Messages API.

Reasoning effort maps to an extended-thinking budget (``none``/null → off, ``minimal`` 1024,
``low`` 2048, ``medium`` 8192, ``high`` 24576, ``max`` 32000, overridable with
``options.thinking_budgets``). The budget must stay below ``max_tokens``; if not, ``max_tokens`` is
raised to budget + ``answer_reserve`` with a one-time warning. Temperature is omitted while thinking.
Structured output uses one forced tool whose input schema is the response schema; with thinking on,
forced tools are not allowed, so the schema goes into the prompt instead.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from skillopt.core.errors import ConfigError
from skillopt.core.redact import Redactor
from skillopt.llm.base import BackendContext, BackendInfo, SecretSource
from skillopt.llm.chat import ChatRequest, ChatResponse, ImagePart, Usage
from skillopt.llm.http_common import (
    WarnOnce,
    parse_body,
    read_with_deadline,
    require_key,
    resolve_key,
    sdk_errors,
    sdk_http_client,
    sdk_post,
)
from skillopt.llm.json_extract import schema_instruction
from skillopt.llm.roles import ResolvedRole
from skillopt.llm.structured_output import wire_schema

DEFAULT_THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 24576, "max": 32000}
_IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}
_TOOL_NAME = "respond"


class AnthropicOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    thinking_budgets: dict[str, int] = Field(default_factory=dict)
    answer_reserve: int = Field(default=4096, ge=1)
    prompt_cache: bool = True


class AnthropicBackend:
    def __init__(
        self, role: ResolvedRole, client: Any, options: AnthropicOptions, redactor: Redactor
    ) -> None:
        import anthropic

        self.anthropic = anthropic
        self.role = role
        self.client = client
        self.options = options
        self.redactor = redactor
        self.warn = WarnOnce()
        self.budgets = {**DEFAULT_THINKING_BUDGETS, **options.thinking_budgets}
        #: Set when the endpoint refused the forced tool: the schema then travels in the prompt.
        self.constrained_refused = False

    def refuse_constrained(self, request: ChatRequest) -> str | None:
        """Send the schema in the prompt from now on; the new mode, or None when it already was."""
        if self.constrained_refused:
            return None
        self.constrained_refused = True
        return "prompt"

    def use_mode(self, mode: str) -> None:
        self.constrained_refused = mode == "prompt"

    def body(self, request: ChatRequest) -> dict[str, Any]:
        max_tokens = request.max_tokens or self.role.max_tokens or 4096
        effort = request.reasoning_effort or self.role.reasoning_effort
        budget = self.budgets.get(effort) if effort and effort != "none" else None
        body: dict[str, Any] = {"model": self.role.model}
        if budget is not None:
            if budget >= max_tokens:
                raised = budget + self.options.answer_reserve
                self.warn(f"[{self.role.role}] {self.role.label()}: max_tokens {max_tokens} is not above the "
                          f"thinking budget {budget}; sending max_tokens {raised}")
                max_tokens = raised
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        body["max_tokens"] = max_tokens

        system_text = request.system_text()
        schema = request.response_schema
        # Forced tools cannot be combined with thinking; a role may also ask for the schema in the prompt.
        in_prompt = budget is not None or self.role.structured_output in ("prompt", "json_object") \
            or self.constrained_refused
        if schema is not None and in_prompt:
            system_text = f"{system_text}\n\n{schema_instruction(schema)}".strip()
        if system_text:
            block: dict[str, Any] = {"type": "text", "text": system_text}
            if self.options.prompt_cache:
                block["cache_control"] = {"type": "ephemeral"}
            body["system"] = [block]
        body["messages"] = [m.chat_dict(self._image) for m in request.messages if m.role != "system"]

        temperature = request.temperature if request.temperature is not None else self.role.temperature
        if temperature is not None and budget is None:
            body["temperature"] = temperature
        if schema is not None and not in_prompt:
            body["tools"] = [{"name": _TOOL_NAME, "description": "Give the answer as structured data.",
                              "input_schema": wire_schema(schema)[0]}]
            body["tool_choice"] = {"type": "tool", "name": _TOOL_NAME}
        body.update(self.role.extra_body)
        return body

    def _image(self, part: ImagePart) -> dict[str, Any]:
        media_type = part.media_type()
        if media_type not in _IMAGE_TYPES:
            raise ConfigError(f"[{self.role.role}] {self.role.label()}: image {part.basename()} is "
                              f"{media_type}; Claude takes png, jpeg, gif or webp")
        data = base64.b64encode(part.data()).decode("ascii")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}

    def attempt(self, request: ChatRequest, *, timeout_s: float) -> ChatResponse:
        anthropic = self.anthropic
        body = self.body(request)
        started = time.monotonic()
        with sdk_errors(anthropic, role=self.role, redactor=self.redactor, timeout_s=timeout_s), \
                sdk_post(anthropic, self.client, "/v1/messages", body, timeout_s=timeout_s) as response:
            raw = read_with_deadline(response.iter_bytes(), deadline=started + timeout_s, timeout_s=timeout_s)
            headers = response.headers
        latency = time.monotonic() - started
        message = parse_body(anthropic.types.Message, raw)
        texts, thoughts, parsed = [], [], None
        for block in message.content:
            kind = getattr(block, "type", None)
            if kind == "text":
                texts.append(block.text)
            elif kind == "thinking":
                thoughts.append(block.thinking)
            elif kind == "tool_use" and block.name == _TOOL_NAME:
                parsed = block.input
        text = json.dumps(parsed, ensure_ascii=False) if parsed is not None else "".join(texts)
        usage = message.usage
        cache_read = getattr(usage, "cache_read_input_tokens", None)
        cache_write = getattr(usage, "cache_creation_input_tokens", None)
        return ChatResponse(
            text=text,
            parsed=parsed,
            reasoning_text="\n".join(thoughts) or None,
            usage=Usage(
                # Anthropic's input_tokens leaves out cache reads and writes; Usage counts the whole prompt.
                prompt_tokens=usage.input_tokens + (cache_read or 0) + (cache_write or 0),
                completion_tokens=usage.output_tokens,
                reasoning_tokens=None,  # thinking is inside output tokens
                cached_prompt_tokens=cache_read,
                cache_write_tokens=cache_write,
            ),
            latency_s=latency,
            model=message.model,
            backend=self.role.backend,
            finish_reason=message.stop_reason,
            truncated=message.stop_reason == "max_tokens",
            request_id=headers.get("request-id"),
        )


def _factory(role: ResolvedRole, secrets: SecretSource, context: BackendContext) -> AnthropicBackend:
    import anthropic

    options = AnthropicOptions.model_validate(role.options)
    key = require_key(role, resolve_key(role, secrets))
    client = anthropic.Anthropic(api_key=key, base_url=role.base_url, max_retries=0,
                                 http_client=sdk_http_client(anthropic))
    return AnthropicBackend(role, client, options, Redactor([key]))


INFO = BackendInfo(
    name="anthropic",
    factory=_factory,
    options_model=AnthropicOptions,
    default_model="claude-sonnet-4-6",
    default_base_url="https://api.anthropic.com",
    key_env="ANTHROPIC_API_KEY",
    env_fields={"base_url": "ANTHROPIC_BASE_URL"},
    summary="Anthropic Messages API (Claude), extended thinking from reasoning effort",
)
