"""The ``openai`` backend: the OpenAI API through the official SDK.

Responses API by default (``options.api: auto``), Chat Completions on request. This module also
holds the Chat Completions wire mapping that ``openai_compatible`` and ``azure_openai`` reuse.

Every attempt streams the raw HTTP body and checks the call's deadline between chunks, so a server
that trickles its answer cannot hold a call past ``timeout_s``; SDK retries are off (the client's
retry loop is the only one).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from skillopt.core.redact import Redactor
from skillopt.llm.base import BackendContext, BackendInfo, SecretSource
from skillopt.llm.capabilities import Capabilities, capabilities_for
from skillopt.llm.chat import ChatRequest, ChatResponse, ImagePart, Message, TextPart, Usage
from skillopt.llm.errors import ServerError
from skillopt.llm.http_common import (
    WarnOnce,
    drop_unsupported,
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

#: Reasoning effort as the OpenAI API names it (Codex takes the same names, plus ``xhigh``).
OPENAI_EFFORT = {
    "none": "minimal",
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "max": "high",
}
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)


class OpenAIOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api: Literal["auto", "responses", "chat_completions"] = "auto"
    organization: str | None = None
    project: str | None = None
    store: bool = False


def import_openai() -> Any:
    import openai  # the SDK is a core dependency; imported lazily to keep start-up fast

    return openai


def sdk_timeout(timeout_s: float) -> float:
    """The SDK's per-request timeout (a float: SDK releases differ in which HTTP client they wrap)."""
    return timeout_s


class OpenAIWire:
    """One attempt over an ``openai.OpenAI``-like client, Chat Completions or Responses.

    Subclasses (compatible servers) adjust the request body and the reply through the hooks
    ``chat_body_extras`` and ``chat_reply_hook``.
    """

    def __init__(self, role: ResolvedRole, client: Any, *, api: Literal["responses", "chat"],
                 redactor: Redactor, store: bool = False) -> None:
        self.role = role
        self.client = client
        self.api = api
        self.redactor = redactor
        self.store = store
        self.capabilities: Capabilities = capabilities_for(role.price_model, role.capabilities)
        self.warn = WarnOnce()
        self.openai = import_openai()
        #: The mode used since the endpoint refused the configured one (None: as configured).
        self.fallen_to: str | None = None

    # -- request building -------------------------------------------------------------------

    def max_tokens(self, request: ChatRequest) -> int | None:
        return request.max_tokens or self.role.max_tokens

    def temperature(self, request: ChatRequest) -> float | None:
        value = request.temperature if request.temperature is not None else self.role.temperature
        if value is not None and not self.capabilities.temperature:
            drop_unsupported(
                self.role, "temperature", f"{self.role.price_model} does not accept it", self.warn
            )
            return None
        return value

    def effort(self, request: ChatRequest) -> str | None:
        value = request.reasoning_effort or self.role.reasoning_effort
        if value is not None and not self.capabilities.reasoning:
            drop_unsupported(
                self.role, "reasoning_effort", f"{self.role.price_model} is not a reasoning model", self.warn
            )
            return None
        return OPENAI_EFFORT.get(value) if value else None

    def seed(self, request: ChatRequest) -> int | None:
        return request.seed if request.seed is not None else self.role.seed

    def structured_mode(self, request: ChatRequest) -> str:
        """How the response schema travels: ``json_schema`` (constrained decoding), ``json_object`` (any
        JSON object, schema in the prompt), ``prompt`` (schema in the prompt only) or ``none``.

        ``model.<role>.structured_output`` decides; ``auto`` follows the capability table (or preset)."""
        if request.response_schema is None:
            return "none"
        if self.fallen_to is not None:
            return self.fallen_to
        chosen = self.role.structured_output
        return self.capabilities.structured if chosen == "auto" else chosen

    #: What a refused mode falls back to.
    FALLBACK = {"json_schema": "prompt", "json_object": "prompt"}

    def refuse_constrained(self, request: ChatRequest) -> str | None:
        """The endpoint refused how ``request`` asked for its shape: the mode to use from now on, or None
        when there is nothing left to drop."""
        fallback = self.FALLBACK.get(self.structured_mode(request))
        if fallback is not None:
            self.fallen_to = fallback
        return fallback

    def use_mode(self, mode: str) -> None:
        """Start at ``mode``: what another role learned this endpoint takes."""
        self.fallen_to = mode

    def chat_messages(self, request: ChatRequest, *, schema_in_prompt: bool) -> list[dict[str, Any]]:
        messages = [_chat_message(m, self) for m in request.messages]
        if schema_in_prompt and request.response_schema is not None:
            messages = _with_schema_instruction(messages, schema_instruction(request.response_schema))
        return messages

    def chat_body(self, request: ChatRequest) -> dict[str, Any]:
        mode = self.structured_mode(request)
        body: dict[str, Any] = {
            "model": self.role.model,
            "messages": self.chat_messages(request, schema_in_prompt=mode in ("json_object", "prompt")),
        }
        body.update(self.cap_and_temperature(request, cap_field=self.capabilities.max_tokens_field))
        effort = self.effort(request)
        if effort is not None:
            body["reasoning_effort"] = effort
        seed = self.seed(request)
        if seed is not None:
            body["seed"] = seed
        if mode == "json_schema":
            assert request.response_schema is not None
            schema, strict = wire_schema(request.response_schema)
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": request.response_schema.__name__, "strict": strict, "schema": schema},
            }
        elif mode == "json_object":
            body["response_format"] = {"type": "json_object"}
        body.update(self.chat_body_extras(request))
        return body

    def cap_and_temperature(self, request: ChatRequest, *, cap_field: str) -> dict[str, Any]:
        """The output cap (under ``cap_field``, the API's name for it) and the temperature, each
        only when set: both APIs take them alike."""
        fields = {cap_field: self.max_tokens(request), "temperature": self.temperature(request)}
        return {name: value for name, value in fields.items() if value is not None}

    def chat_body_extras(self, request: ChatRequest) -> dict[str, Any]:
        """Extra top-level fields (compatible presets, ``extra_body``)."""
        return dict(self.role.extra_body)

    def responses_body(self, request: ChatRequest) -> dict[str, Any]:
        instructions = "\n\n".join(m.text() for m in request.messages if m.role == "system")
        body: dict[str, Any] = {"model": self.role.model, "input": [
            _responses_item(m, self) for m in request.messages if m.role != "system"
        ], "store": self.store}
        if instructions:
            body["instructions"] = instructions
        body.update(self.cap_and_temperature(request, cap_field="max_output_tokens"))
        effort = self.effort(request)
        if effort is not None:
            body["reasoning"] = {"effort": effort}
        if self.seed(request) is not None:
            drop_unsupported(self.role, "seed", "the Responses API has no seed", self.warn)
        mode = self.structured_mode(request)
        if request.response_schema is not None and mode == "json_schema":
            schema, strict = wire_schema(request.response_schema)
            body["text"] = {"format": {"type": "json_schema", "name": request.response_schema.__name__,
                                       "strict": strict, "schema": schema}}
        elif request.response_schema is not None and mode in ("json_object", "prompt"):
            body["instructions"] = f"{instructions}\n\n{schema_instruction(request.response_schema)}".strip()
            if mode == "json_object":
                body["text"] = {"format": {"type": "json_object"}}
        body.update(self.role.extra_body)
        return body

    # -- one attempt ------------------------------------------------------------------------

    def attempt(self, request: ChatRequest, *, timeout_s: float) -> ChatResponse:
        if self.api == "responses":
            body, path = self.responses_body(request), "/responses"
        else:
            body, path = self.chat_body(request), "/chat/completions"
        started = time.monotonic()
        raw, headers = self.post(path, body, timeout_s=timeout_s, started=started)
        latency = time.monotonic() - started
        response = self.parse_responses(raw) if self.api == "responses" else self.parse_chat(raw)
        response.latency_s = latency
        response.request_id = headers.get("x-request-id")
        return response

    def post(
        self, path: str, body: dict[str, Any], *, timeout_s: float, started: float
    ) -> tuple[bytes, Mapping]:
        """Send ``body`` to ``path`` and read the whole reply within the deadline; errors are classified."""
        with sdk_errors(self.openai, role=self.role, redactor=self.redactor, timeout_s=timeout_s), \
                sdk_post(self.openai, self.client, path, body, timeout_s=sdk_timeout(timeout_s)) as response:
            raw = read_with_deadline(response.iter_bytes(), deadline=started + timeout_s, timeout_s=timeout_s)
            return raw, response.headers

    # -- parsing ----------------------------------------------------------------------------

    def parse_chat(self, raw: bytes) -> ChatResponse:
        completion = parse_body(self.openai.types.chat.ChatCompletion, raw)
        if not completion.choices:
            raise ServerError("the response has no choices")
        choice = completion.choices[0]
        message = choice.message
        text = message.content or ""
        reasoning = getattr(message, "reasoning_content", None) or (message.model_extra or {}).get(
            "reasoning_content"
        )
        usage = completion.usage
        details = getattr(usage, "completion_tokens_details", None) if usage else None
        prompt_details = getattr(usage, "prompt_tokens_details", None) if usage else None
        response = ChatResponse(
            text=text,
            reasoning_text=reasoning,
            usage=Usage(
                prompt_tokens=usage.prompt_tokens if usage else None,
                completion_tokens=usage.completion_tokens if usage else None,
                reasoning_tokens=getattr(details, "reasoning_tokens", None),
                cached_prompt_tokens=getattr(prompt_details, "cached_tokens", None),
            ),
            model=completion.model,
            backend=self.role.backend,
            finish_reason=choice.finish_reason,
            truncated=choice.finish_reason == "length",
        )
        return self.chat_reply_hook(response)

    def chat_reply_hook(self, response: ChatResponse) -> ChatResponse:
        return response

    def parse_responses(self, raw: bytes) -> ChatResponse:
        result = parse_body(self.openai.types.responses.Response, raw)
        usage = result.usage
        reasoning_parts: list[str] = []
        for item in result.output or []:
            if getattr(item, "type", None) == "reasoning":
                reasoning_parts.extend(getattr(s, "text", "") for s in (getattr(item, "summary", None) or []))
        incomplete = getattr(result, "incomplete_details", None)
        truncated = (
            result.status == "incomplete" and getattr(incomplete, "reason", None) == "max_output_tokens"
        )
        return ChatResponse(
            text=result.output_text or "",
            reasoning_text="\n".join(reasoning_parts) or None,
            usage=Usage(
                prompt_tokens=usage.input_tokens if usage else None,
                completion_tokens=usage.output_tokens if usage else None,
                reasoning_tokens=getattr(
                    getattr(usage, "output_tokens_details", None), "reasoning_tokens", None
                ),
                cached_prompt_tokens=getattr(
                    getattr(usage, "input_tokens_details", None), "cached_tokens", None
                ),
            ),
            model=result.model,
            backend=self.role.backend,
            finish_reason=result.status,
            truncated=truncated,
        )


def split_think_tags(text: str) -> tuple[str, str | None]:
    """Move ``<think>…</think>`` blocks out of the answer; returns (answer, reasoning)."""
    thoughts = _THINK.findall(text)
    if not thoughts:
        return text, None
    return _THINK.sub("", text).strip(), "\n".join(t.strip() for t in thoughts)


def _chat_message(message: Message, wire: OpenAIWire) -> dict[str, Any]:
    def image_block(part: ImagePart) -> dict[str, Any]:
        _check_vision(part, wire)
        image: dict[str, Any] = {"url": part.data_uri()}
        if part.detail:
            image["detail"] = part.detail
        return {"type": "image_url", "image_url": image}

    return message.chat_dict(image_block)


def _responses_item(message: Message, wire: OpenAIWire) -> dict[str, Any]:
    text_type = "output_text" if message.role == "assistant" else "input_text"
    if isinstance(message.content, str):
        return {"role": message.role, "content": [{"type": text_type, "text": message.content}]}
    content: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextPart):
            content.append({"type": text_type, "text": part.text})
        else:
            _check_vision(part, wire)
            content.append(
                {"type": "input_image", "image_url": part.data_uri(), "detail": part.detail or "auto"}
            )
    return {"role": message.role, "content": content}


def _check_vision(part: ImagePart, wire: OpenAIWire) -> None:
    if not wire.capabilities.vision:
        from skillopt.core.errors import ConfigError

        raise ConfigError(
            f"[{wire.role.role}] {wire.role.label()} cannot take images ({part.basename()}); choose a vision "
            f"model or set model.{wire.role.role}.capabilities.vision: true"
        )


def _with_schema_instruction(messages: list[dict[str, Any]], instruction: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system" and isinstance(messages[0]["content"], str):
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{instruction}"}, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


def _factory(role: ResolvedRole, secrets: SecretSource, context: BackendContext) -> OpenAIWire:
    openai = import_openai()
    options = OpenAIOptions.model_validate(role.options)
    key = require_key(role, resolve_key(role, secrets))
    client = openai.OpenAI(api_key=key, base_url=role.base_url, organization=options.organization,
                           project=options.project, max_retries=0, http_client=sdk_http_client(openai))
    api = options.api
    if api == "auto":
        responses = capabilities_for(role.price_model, role.capabilities).api == "responses"
        api = "responses" if responses else "chat_completions"
    return OpenAIWire(role, client, api="responses" if api == "responses" else "chat",
                      redactor=Redactor([key]), store=options.store)


INFO = BackendInfo(
    name="openai",
    factory=_factory,
    options_model=OpenAIOptions,
    default_model="gpt-4.1-mini",
    default_base_url="https://api.openai.com/v1",
    key_env="OPENAI_API_KEY",
    env_fields={"base_url": "OPENAI_BASE_URL", "options.organization": "OPENAI_ORG_ID",
                "options.project": "OPENAI_PROJECT_ID"},
    summary="OpenAI API (Responses, or Chat Completions)",
)
