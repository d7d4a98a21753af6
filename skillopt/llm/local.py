"""The ``local`` backend: a GGUF model run in-process by llama.cpp.

Needs the ``skillopt[local]`` extra (``llama-cpp-python``), imported only when a backend is built.
Each backend object owns one ``Llama`` (loaded on the first call) behind a lock, so calls are
serialised; the deadline of an attempt starts once the call holds the model, so waiting for the
lock and the one-time load do not count against it, and it is checked on every generated token.

A response schema constrains decoding with a JSON grammar built from the strict schema; the text
is then validated locally, and ``parsed`` is set when it validates (otherwise the client's parser
reports and re-asks, as for any backend). ``reasoning_effort`` is ignored (warned once). Cost is
always 0; tokens come from llama.cpp's own counters.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from skillopt.core.errors import ConfigError
from skillopt.llm.base import BackendContext, BackendInfo, SecretSource
from skillopt.llm.chat import ChatRequest, ChatResponse, ImagePart, Message, Usage
from skillopt.llm.errors import (
    BackendError,
    BadRequest,
    CallTimeout,
    ContextLengthExceeded,
    EmptyAnswer,
    ParseError,
    ServerError,
)
from skillopt.llm.json_extract import extract_json, strict_json_schema
from skillopt.llm.roles import ResolvedRole

log = logging.getLogger("skillopt.llm")

INSTALL_HINT = "the local backend needs `pip install 'skillopt[local]'` (llama-cpp-python)"

#: ``chat_format`` values that pick a vision handler when ``clip_model_path`` is set (the names the
#: llama-cpp-python server uses); with no ``chat_format`` the GGUF's own template is used (MTMD).
VISION_HANDLERS = MappingProxyType({
    "mtmd": "MTMDChatHandler",
    "gemma4": "Gemma4ChatHandler",
    "llava-1-5": "Llava15ChatHandler",
    "llava-1-6": "Llava16ChatHandler",
    "obsidian": "ObsidianChatHandler",
    "moondream": "MoondreamChatHandler",
    "nanollava": "NanoLlavaChatHandler",
    "llama-3-vision-alpha": "Llama3VisionAlphaChatHandler",
    "minicpm-v-2.6": "MiniCPMv26ChatHandler",
    "qwen2.5-vl": "Qwen25VLChatHandler",
})


class LocalOptions(BaseModel):
    """``model.<role>.options`` of the local backend."""

    model_config = ConfigDict(extra="forbid")

    #: The GGUF file (env ``SKILLOPT_<ROLE>_MODEL_PATH``).
    model_path: str
    #: A llama-cpp-python chat format name; None uses the template embedded in the GGUF.
    chat_format: str | None = None
    #: Context window in tokens; llama.cpp pads smaller windows to 256 and then fails on long prompts.
    n_ctx: int = Field(default=8192, ge=256)
    #: Layers offloaded to a GPU; -1 offloads all.
    n_gpu_layers: int = Field(default=0, ge=-1)
    #: CPU threads; None lets llama.cpp choose.
    n_threads: int | None = Field(default=None, ge=1)
    #: The multimodal projector (mmproj) GGUF; required for image inputs.
    clip_model_path: str | None = None
    #: Sampling seed used when neither the request nor the role gives one.
    seed: int | None = None


def import_llama_cpp() -> ModuleType:
    """The ``llama_cpp`` module, or a ``ConfigError`` saying which extra to install."""
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return llama_cpp


#: Loading the model and generating one token in a child process first: a native crash of llama.cpp (an
#: instruction this CPU lacks, a broken build) kills the child, not the run, and becomes a clear error.
_PROBE = """
import json, sys
import llama_cpp
model = llama_cpp.Llama(**json.loads(sys.argv[1]))
model.create_completion("ok", max_tokens=1)
"""
#: How long the probe may take: a model load from a slow disk plus one token.
PROBE_TIMEOUT_S = 600.0
REINSTALL_HINT = ('reinstall llama-cpp-python built for this machine (CMAKE_ARGS="-DGGML_NATIVE=OFF" '
                  "pip install --force-reinstall --no-cache-dir llama-cpp-python), or serve the model "
                  "with a llama.cpp server and use the openai_compatible backend")


def probe_in_child(load_kwargs: Mapping[str, Any], where: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Load the model and generate one token in a child process; raise a ``ConfigError`` if that fails.

    ``where`` names the setting (``model.target.options.model_path``). A child killed by a signal (exit
    139 for SIGSEGV, 132 for SIGILL) would have ended this process without a word.
    """
    try:
        result = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(dict(load_kwargs))],
                                capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy(),
                                check=False)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{where}: llama.cpp did not load {load_kwargs['model_path']} and generate one "
                          f"token within {timeout_s:g} s (local backend)") from None
    if result.returncode < 0:
        name = signal.Signals(-result.returncode).name
        raise ConfigError(
            f"{where}: llama.cpp crashed with {name} (exit {128 - result.returncode}) loading "
            f"{load_kwargs['model_path']} (local backend): this CPU or build is not supported; "
            f"{REINSTALL_HINT}")
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise ConfigError(f"{where}: llama.cpp cannot load {load_kwargs['model_path']} (local backend): "
                          f"{last}")


def _existing_file(path: str, key: str) -> Path:
    found = Path(path).expanduser()
    if not found.is_file():
        raise ConfigError(f"{key}: no model file at {found}")
    return found


def _deadline_llama_class(llama_cpp: ModuleType) -> type[Any]:
    """A ``Llama`` whose completions also stop when ``self.deadline`` passes (checked per token).

    Every chat handler ends in ``create_completion``, so adding the criterion there covers them
    all. The criterion only stops generation and sets ``timed_out``; the caller raises.
    """

    class DeadlineLlama(llama_cpp.Llama):  # type: ignore[name-defined]
        deadline: float | None = None
        timed_out: bool = False

        def create_completion(self, *args: Any, **kwargs: Any) -> Any:
            given = kwargs.get("stopping_criteria") or []
            kwargs["stopping_criteria"] = llama_cpp.StoppingCriteriaList([*given, self._past_deadline])
            return super().create_completion(*args, **kwargs)

        def _past_deadline(self, input_ids: Any, logits: Any) -> bool:
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.timed_out = True
            return self.timed_out

    return DeadlineLlama


class LocalBackend:
    """One GGUF model for one role; thread-safe, one generation at a time."""

    def __init__(self, role: ResolvedRole) -> None:
        self.role = role
        self.options = LocalOptions.model_validate(role.options)
        where = f"model.{role.role}.options"
        self.model_path = _existing_file(self.options.model_path, f"{where}.model_path")
        self.clip_path = (
            _existing_file(self.options.clip_model_path, f"{where}.clip_model_path")
            if self.options.clip_model_path else None
        )
        if self.clip_path is not None and (self.options.chat_format or "mtmd") not in VISION_HANDLERS:
            raise ConfigError(
                f"{where}.chat_format: {self.options.chat_format!r} has no vision handler; with "
                f"clip_model_path use null (the GGUF's template) or one of {', '.join(VISION_HANDLERS)}"
            )
        self._llama_cpp = import_llama_cpp()
        self._lock = threading.Lock()
        self._llama: Any = None
        self._warned_effort = False

    @property
    def model_name(self) -> str:
        return self.model_path.name

    def context_tokens(self) -> int:
        """The window the model is loaded with (``options.n_ctx``)."""
        return self.options.n_ctx

    def structured_mode(self, request: ChatRequest) -> str:
        """A response schema goes as a grammar (``json_schema``), never into the prompt."""
        return "json_schema" if request.response_schema is not None else "none"

    def attempt(self, request: ChatRequest, *, timeout_s: float) -> ChatResponse:
        """Generate one reply; ``CallTimeout`` when generation passes ``timeout_s``."""
        messages = [self._message(m) for m in request.messages]
        settings = self._settings(request)
        with self._lock:
            llama = self._load()
            started = time.monotonic()
            llama.deadline, llama.timed_out = started + timeout_s, False
            try:
                completion = llama.create_chat_completion(messages=messages, **settings)
            except ValueError as exc:
                raise self._classify(exc, request) from exc
            except RuntimeError as exc:
                raise self._error(ServerError, f"llama.cpp failed: {exc}", request) from exc
            finally:
                llama.deadline = None
            timed_out = llama.timed_out or time.monotonic() > started + timeout_s
        latency = time.monotonic() - started
        if timed_out:
            raise self._error(CallTimeout, f"no complete reply within {timeout_s:g} s", request)
        return self._response(completion, request, latency)

    # --- pieces of one call ---

    def _load(self) -> Any:
        """The model, loaded on first use (the caller holds the lock)."""
        if self._llama is None:
            kwargs: dict[str, Any] = {
                "model_path": str(self.model_path),
                "n_ctx": self.options.n_ctx,
                "n_gpu_layers": self.options.n_gpu_layers,
                "verbose": False,
            }
            if self.options.n_threads is not None:
                kwargs["n_threads"] = self.options.n_threads
            probe_in_child(kwargs, f"model.{self.role.role}.options.model_path")
            if self.clip_path is not None:
                kwargs["chat_handler"] = self._vision_handler()
            elif self.options.chat_format is not None:
                kwargs["chat_format"] = self.options.chat_format
            try:
                self._llama = _deadline_llama_class(self._llama_cpp)(**kwargs)
            except ValueError as exc:
                raise ConfigError(
                    f"model.{self.role.role}.options.model_path: llama.cpp cannot load {self.model_path}: "
                    f"{exc}"
                ) from None
        return self._llama

    def _vision_handler(self) -> Any:
        name = VISION_HANDLERS[self.options.chat_format or "mtmd"]
        handler_class = getattr(self._llama_cpp.llama_chat_format, name, None)
        if handler_class is None:
            raise ConfigError(
                f"model.{self.role.role}.options.chat_format: the installed llama-cpp-python has no {name}"
            )
        return handler_class(clip_model_path=str(self.clip_path), verbose=False)

    def _message(self, message: Message) -> dict[str, Any]:
        images = message.images()
        if not images:
            return {"role": message.role, "content": message.text()}
        if self.clip_path is None:
            raise ConfigError(
                f"model.{self.role.role}.options.clip_model_path is not set: the local backend takes images "
                "only with a multimodal projector (mmproj GGUF)"
            )
        assert not isinstance(message.content, str)
        parts: list[dict[str, Any]] = [
            {"type": "image_url", "image_url": {"url": part.data_uri()}} if isinstance(part, ImagePart)
            else {"type": "text", "text": part.text}
            for part in message.content
        ]
        return {"role": message.role, "content": parts}

    def _settings(self, request: ChatRequest) -> dict[str, Any]:
        role = self.role
        effort = request.reasoning_effort or role.reasoning_effort
        if effort is not None and not self._warned_effort:
            self._warned_effort = True  # a race here costs at most one duplicate warning
            log.warning("[%s] local/%s: reasoning_effort=%s is ignored by the local backend",
                        role.role, self.model_name, effort)
        settings: dict[str, Any] = {}
        max_tokens = request.max_tokens if request.max_tokens is not None else role.max_tokens
        if max_tokens is not None:
            settings["max_tokens"] = max_tokens
        temperature = request.temperature if request.temperature is not None else role.temperature
        if temperature is not None:
            settings["temperature"] = temperature
        seed = next((s for s in (request.seed, self.options.seed, role.seed) if s is not None), None)
        if seed is not None:
            settings["seed"] = seed
        if request.response_schema is not None:
            settings["grammar"] = self._grammar(request.response_schema)
        return settings

    def _grammar(self, schema: type[BaseModel]) -> Any:
        """A JSON grammar for ``schema``: strict when it can be, else the plain schema, else any JSON."""
        grammar_class = self._llama_cpp.LlamaGrammar
        try:
            json_schema = strict_json_schema(schema)
        except ValueError:
            json_schema = schema.model_json_schema()  # free-form maps cannot be strict
        try:
            return grammar_class.from_json_schema(json.dumps(json_schema), verbose=False)
        except Exception as exc:  # the converter raises assorted errors for schema features it lacks
            log.warning("[%s] local/%s: no grammar for %s (%s); constraining to any JSON value",
                        self.role.role, self.model_name, schema.__name__, exc)
            return grammar_class.from_string(self._llama_cpp.llama_grammar.JSON_GBNF, verbose=False)

    def _response(self, completion: dict[str, Any], request: ChatRequest, latency: float) -> ChatResponse:
        choice = completion["choices"][0]
        text = choice["message"].get("content") or ""
        finish = choice.get("finish_reason")
        if not text.strip():
            raise self._error(EmptyAnswer, f"the model produced no text (finish reason {finish})", request)
        counts = completion.get("usage") or {}
        parsed = None
        if request.response_schema is not None:
            try:
                parsed = extract_json(text, request.response_schema, stage=request.stage)
            except ParseError:
                parsed = None  # the client's parser reports it and re-asks
        return ChatResponse(
            text=text,
            parsed=parsed,
            usage=Usage(
                prompt_tokens=counts.get("prompt_tokens"), completion_tokens=counts.get("completion_tokens")
            ),
            latency_s=latency,
            model=self.model_name,
            backend="local",
            finish_reason=finish,
            request_id=completion.get("id"),
            truncated=finish == "length",
        )

    def _classify(self, exc: ValueError, request: ChatRequest) -> BackendError:
        message = str(exc)
        if "context window" in message:
            return self._error(
                ContextLengthExceeded, message, request,
                hint=f"shorten the prompt or raise model.{self.role.role}.options.n_ctx (now "
                     f"{self.options.n_ctx})",
            )
        return self._error(BadRequest, f"llama.cpp rejected the request: {message}", request)

    def _error(self, kind: type[BackendError], message: str, request: ChatRequest,
               hint: str | None = None) -> BackendError:
        return kind(message, role=self.role.role, backend="local", model=self.model_name, stage=request.stage,
                    hint=hint)


def _build(role: ResolvedRole, secrets: SecretSource, context: BackendContext) -> LocalBackend:
    return LocalBackend(role)


def _model_from_path(values: dict[str, Any], options: BaseModel, env: Mapping[str, str]) -> dict[str, Any]:
    """The role's ``model`` defaults to the GGUF file name, so labels and fingerprints name it."""
    assert isinstance(options, LocalOptions)
    return {"model": Path(options.model_path).name}


INFO = BackendInfo(
    name="local",
    factory=_build,
    options_model=LocalOptions,
    default_model=None,
    key_env=None,
    key_required=False,
    default_timeout_s=120.0,
    adjust=_model_from_path,
    requires=(("llama_cpp", "local"),),
    summary="a GGUF model run in-process by llama.cpp (needs skillopt[local])",
)
