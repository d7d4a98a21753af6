"""The ``openai_compatible`` backend: any Chat Completions server.

Presets carry what differs between servers: the default endpoint, the key variable, how thinking
is switched on or off on the wire, whether a JSON schema can be sent, and quirks (``<think>``
blocks, ``reasoning_content``, streamed thinking calls). Thinking has three states:
``server_default`` sends nothing (warned once: results then depend on how the server was launched),
``on`` and ``off`` send the preset's wire form. Unset, it follows the reasoning effort: ``none`` →
off, any other level → on, null → server default.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from skillopt.core.errors import ConfigError
from skillopt.core.redact import Redactor
from skillopt.llm.base import BackendContext, BackendInfo, SecretSource
from skillopt.llm.capabilities import Capabilities
from skillopt.llm.chat import ChatRequest, ChatResponse, Usage
from skillopt.llm.errors import BadRequest, CallTimeout, ServerError
from skillopt.llm.http_common import SERVER_NOTES, http_library, sdk_http_client, shared_tls_context
from skillopt.llm.openai import OpenAIWire, import_openai, sdk_timeout, split_think_tags
from skillopt.llm.roles import ResolvedRole
from skillopt.llm.structured_output import wire_schema

#: Sent when a server needs no key: the SDK insists on one.
PLACEHOLDER_KEY = "no-key-needed"

ThinkingWire = Literal["none", "chat_template_kwargs", "enable_thinking", "model_id"]


@dataclass(frozen=True)
class Preset:
    base_url: str | None
    key_env: str | None
    key_required: bool
    thinking_wire: ThinkingWire
    structured: Literal["json_schema", "json_object"]
    strip_think_tags: bool = False
    stream_thinking: bool = False
    max_concurrency: int | None = None


PRESETS: dict[str, Preset] = {
    "generic": Preset(None, "OPENAI_COMPATIBLE_API_KEY", False, "none", "json_schema"),
    "vllm": Preset("http://127.0.0.1:8000/v1", "VLLM_API_KEY", False, "chat_template_kwargs", "json_schema",
                   strip_think_tags=True),
    "ollama": Preset("http://127.0.0.1:11434/v1", None, False, "none", "json_schema", max_concurrency=1),
    "llamacpp": Preset("http://127.0.0.1:8080/v1", None, False, "none", "json_schema"),
    "qwen": Preset("https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "DASHSCOPE_API_KEY", True,
                   "enable_thinking", "json_object", stream_thinking=True),
    "deepseek": Preset("https://api.deepseek.com", "DEEPSEEK_API_KEY", True, "model_id", "json_object"),
}
PRESETS["dashscope"] = PRESETS["qwen"]
_DASHSCOPE_CN = "https://dashscope.aliyuncs.com/compatible-mode/v1"


class CompatibleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: Literal["generic", "vllm", "ollama", "llamacpp", "qwen", "dashscope", "deepseek"] = "generic"
    thinking: Literal["server_default", "on", "off"] | None = None
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    structured: Literal["json_schema", "json_object", "none"] | None = None
    strip_think_tags: bool | None = None
    region: Literal["intl", "cn"] = "intl"
    thinking_budget: int | None = None


def resolve_thinking(options: CompatibleOptions, effort: str | None) -> str:
    if options.thinking is not None:
        return options.thinking
    if effort is None:
        return "server_default"
    return "off" if effort == "none" else "on"


class CompatibleWire(OpenAIWire):
    def __init__(
        self, role: ResolvedRole, client: Any, options: CompatibleOptions, redactor: Redactor
    ) -> None:
        super().__init__(role, client, api="chat", redactor=redactor)
        self.options = options
        self.preset = PRESETS[options.preset]
        overrides = {"structured": options.structured or self.preset.structured,
                     "max_tokens_field": options.max_tokens_field, "api": "chat", "temperature": True,
                     "reasoning": True, "vision": True}
        self.capabilities = Capabilities.model_validate({**overrides, **role.capabilities})
        self.thinking = resolve_thinking(options, role.reasoning_effort)
        if self.thinking != "server_default" and self.preset.thinking_wire == "none":
            raise ConfigError(
                f"model.{role.role}.options.thinking: the {options.preset} preset has no on/off switch; "
                f"send the server's own field with model.{role.role}.extra_body"
            )
        if self.thinking == "server_default":
            # Worded for any role, so that roles sharing a model get one note, not one each.
            if self.preset.thinking_wire == "none":
                pin = (f"the {options.preset} preset has no on/off switch: pin it where the server is "
                       "launched or with its own field in model.<role>.extra_body")
            else:
                pin = "set model.<role>.options.thinking: on|off to pin it"
            SERVER_NOTES(f"{role.short_label()}: thinking is the server's default; results depend on how the "
                         f"server was launched ({pin})")

    def effort(self, request: ChatRequest) -> str | None:
        # Compatible servers take thinking through the preset's switch, not reasoning_effort.
        if self.options.preset == "deepseek" and (request.reasoning_effort or self.role.reasoning_effort):
            self.warn(f"[{self.role.role}] {self.role.label()}: DeepSeek picks reasoning by model id; "
                      "reasoning_effort is ignored")
        return None

    def chat_body_extras(self, request: ChatRequest) -> dict[str, Any]:
        extras: dict[str, Any] = {}
        if self.thinking in ("on", "off"):
            enabled = self.thinking == "on"
            if self.preset.thinking_wire == "chat_template_kwargs":
                extras["chat_template_kwargs"] = {"enable_thinking": enabled}
            elif self.preset.thinking_wire == "enable_thinking":
                extras["enable_thinking"] = enabled
                if enabled and self.options.thinking_budget:
                    extras["thinking_budget"] = self.options.thinking_budget
        extras.update(self.role.extra_body)
        return extras

    #: A compatible server that refuses ``json_schema`` may still take ``json_object`` with a schema.
    FALLBACK = {"json_schema": "json_object", "json_object": "prompt"}

    def chat_body(self, request: ChatRequest) -> dict[str, Any]:
        body = super().chat_body(request)
        if request.response_schema is not None and body.get("response_format") == {"type": "json_object"}:
            # llama.cpp's servers constrain a json_object reply to a schema given beside it; others ignore it
            schema = wire_schema(request.response_schema)[0]
            body["response_format"] = {"type": "json_object", "schema": schema}
        return body

    def chat_reply_hook(self, response: ChatResponse) -> ChatResponse:
        strip = self.options.strip_think_tags
        if strip is None:
            strip = self.preset.strip_think_tags
        if strip:
            text, thoughts = split_think_tags(response.text)
            if thoughts:
                joined = "\n".join(t for t in (response.reasoning_text, thoughts) if t)
                response = response.model_copy(update={"text": text, "reasoning_text": joined})
        return response

    def context_tokens(self) -> int | None:
        """The context window the server reports for this model, or None when it reports none.

        ``GET /models`` first (vLLM ``max_model_len``, llama.cpp ``meta.n_ctx``, gateways'
        ``context_length``), then llama.cpp's ``GET /props`` (``default_generation_settings.n_ctx``).
        A server that answers neither is not an error: the caller falls back to the table. Asked with the
        SDK's HTTP library, on the process's shared TLS context.
        """
        import httpx

        library = http_library(import_openai()) or httpx
        base = str(self.client.base_url).rstrip("/")
        headers = {"Authorization": f"Bearer {self.client.api_key}"}
        with library.Client(verify=shared_tls_context(library), timeout=5.0) as http:
            for url, read in ((f"{base}/models", self._window_in_models),
                              (f"{base.removesuffix('/v1')}/props", _window_in_props)):
                try:
                    reply = http.get(url, headers=headers)
                    window = read(reply.json()) if reply.status_code == 200 else None
                except (library.HTTPError, ValueError):
                    window = None
                if window:
                    return window
        return None

    def served_models(self) -> list[str] | None:
        """The model ids ``GET /models`` lists, or None when the server lists none."""
        import httpx

        library = http_library(import_openai()) or httpx
        base = str(self.client.base_url).rstrip("/")
        headers = {"Authorization": f"Bearer {self.client.api_key}"}
        try:
            with library.Client(verify=shared_tls_context(library), timeout=5.0) as http:
                reply = http.get(f"{base}/models", headers=headers)
                listing = reply.json() if reply.status_code == 200 else None
        except (library.HTTPError, ValueError):
            return None
        entries = listing.get("data") if isinstance(listing, dict) else None
        ids = [str(e["id"]) for e in entries or [] if isinstance(e, dict) and e.get("id")]
        return ids or None

    def _window_in_models(self, listing: Any) -> int | None:
        entries = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(entries, list):
            return None
        ours = [e for e in entries if isinstance(e, dict) and e.get("id") == self.role.model]
        for entry in ours or (entries if len(entries) == 1 else []):
            meta = raw if isinstance(raw := entry.get("meta"), dict) else {}
            for value in (
                entry.get("max_model_len"),
                entry.get("context_length"),
                entry.get("context_window"),
                meta.get("n_ctx"),
            ):
                if isinstance(value, int) and value > 0:
                    return value
        return None

    def attempt(self, request: ChatRequest, *, timeout_s: float) -> ChatResponse:
        if self.preset.stream_thinking and self.thinking == "on":
            return self._streamed(request, timeout_s=timeout_s)
        try:
            return super().attempt(request, timeout_s=timeout_s)
        except ServerError as error:
            # llama-cpp-python answers a response_format it does not know with HTTP 500 and the validation
            # message: a refusal of the request, not a server fault worth retrying.
            if request.response_schema is not None and "response_format" in error.reason:
                raise BadRequest(error.reason, status=error.status) from None
            raise

    def _streamed(self, request: ChatRequest, *, timeout_s: float) -> ChatResponse:
        """Thinking calls on DashScope must stream; reassemble text, reasoning and usage."""
        body = self.chat_body(request)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        started = time.monotonic()
        raw, headers = self.post("/chat/completions", body,
                                 timeout_s=timeout_s, started=started)
        texts, thoughts, usage, model, finish = [], [], None, None, None
        for line in raw.decode("utf-8", "replace").splitlines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                raise ServerError("malformed stream chunk") from None
            model = chunk.get("model", model)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                texts.append(delta.get("content") or "")
                thoughts.append(delta.get("reasoning_content") or "")
                finish = choice.get("finish_reason") or finish
        if time.monotonic() - started > timeout_s:
            raise CallTimeout(f"no complete response within {timeout_s:g} s")
        usage = usage or {}
        return ChatResponse(
            text="".join(texts),
            reasoning_text="".join(thoughts) or None,
            usage=Usage(
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
                reasoning_tokens=(usage.get("completion_tokens_details") or {}).get("reasoning_tokens"),
                cached_prompt_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            ),
            latency_s=time.monotonic() - started,
            model=model,
            backend=self.role.backend,
            finish_reason=finish,
            truncated=finish == "length",
            request_id=headers.get("x-request-id"),
        )


def _window_in_props(props: Any) -> int | None:
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    value = settings.get("n_ctx") if isinstance(settings, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def _adjust(values: dict[str, Any], options: BaseModel, env: Mapping[str, str]) -> dict[str, Any]:
    """Preset defaults: endpoint, key variable, whether a key is required."""
    assert isinstance(options, CompatibleOptions)
    preset = PRESETS[options.preset]
    base_url = preset.base_url
    if options.preset in ("qwen", "dashscope") and options.region == "cn":
        base_url = _DASHSCOPE_CN
    # A key the user names (api_key_env, api_key_secret) is required even where the preset needs none: a
    # misspelt variable would otherwise send no key and fail every call with HTTP 401.
    named = values.get("api_key_env") is not None or values.get("api_key_secret") is not None
    updates: dict[str, Any] = {"key_required": preset.key_required or named}
    if values.get("base_url") is None and base_url is not None:
        updates["base_url"] = base_url
    if values.get("api_key_env") is None:
        updates["api_key_env"] = preset.key_env
    return updates


def _factory(role: ResolvedRole, secrets: SecretSource, context: BackendContext) -> CompatibleWire:
    openai = import_openai()
    options = CompatibleOptions.model_validate(role.options)
    if not role.base_url:
        raise ConfigError(
            f"[{role.role}] openai_compatible/{role.model or '?'}: no endpoint; set "
            f"model.{role.role}.base_url or OPENAI_COMPATIBLE_BASE_URL, or choose a preset (vllm, ollama, "
            "llamacpp, qwen, deepseek)"
        )
    key = None
    if role.api_key_secret:
        key = secrets.get_block(role.api_key_secret)
    elif role.api_key_env:
        key = secrets.get(role.api_key_env)
    if not key and role.key_required:
        raise ConfigError(f"[{role.role}] {role.label()}: no credential; export {role.api_key_env} or set "
                          f"model.{role.role}.api_key_env")
    client = openai.OpenAI(api_key=key or PLACEHOLDER_KEY, base_url=role.base_url, max_retries=0,
                           timeout=sdk_timeout(role.timeout_s), http_client=sdk_http_client(openai))
    return CompatibleWire(role, client, options, Redactor([key] if key else []))


INFO = BackendInfo(
    name="openai_compatible",
    factory=_factory,
    options_model=CompatibleOptions,
    default_model=None,
    key_env="OPENAI_COMPATIBLE_API_KEY",
    key_required=False,
    env_fields={"base_url": "OPENAI_COMPATIBLE_BASE_URL"},
    adjust=_adjust,
    summary="any Chat Completions server: vLLM, Ollama, llama.cpp server, Qwen/DashScope, DeepSeek, gateways",
)
