"""Clients: one object per role, bundled per run.

A ``RoleClient`` owns the one retry loop, takes the shared rate limiter before every attempt,
accounts every call in the shared ``UsageLedger`` (errors included), and turns replies into
validated objects for structured stages with exactly one re-ask. ``ModelClients`` bundles the
three roles with their limiter and ledger; it is built once per flow run and passed explicitly to
every task. Nothing here is module-level state, and no Prefect import happens in this package.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from skillopt.core.config import LoadedConfig
from skillopt.core.errors import ConfigError
from skillopt.core.redact import Redactor
from skillopt.llm.base import BackendContext, BackendInfo, BackendRegistry, EnvSecrets, SecretSource
from skillopt.llm.chat import ChatRequest, ChatResponse, Message, TextPart, Usage, user
from skillopt.llm.context import (
    CHARS_PER_TOKEN,
    DEFAULT_CONTEXT_TOKENS,
    PromptRoom,
    known_context_tokens,
    window_from_error,
)
from skillopt.llm.context_windows import ContextWindows
from skillopt.llm.errors import (
    BackendError,
    BadRequest,
    CallTimeout,
    ContextLengthExceeded,
    ErrorContext,
    ModelNotFound,
    ParseError,
    RateLimited,
)
from skillopt.llm.json_extract import extract_json, schema_instruction
from skillopt.llm.limiter import LocalRateLimiter, NoLimits, RateLimiter
from skillopt.llm.pricing import PriceTable
from skillopt.llm.reply_store import PREFETCH, ReplyStore
from skillopt.llm.retry import Retrier, RetryNotes
from skillopt.llm.roles import CliRoleOptions, ResolvedRole, ResolvedRoles, is_loopback, resolve_roles
from skillopt.llm.structured_output import StructuredModes
from skillopt.llm.usage import UsageLedger, UsageRecord

log = logging.getLogger("skillopt.llm")

M = TypeVar("M", bound=BaseModel)

#: Replies to a re-ask may need more room than the first try; never more than this.
MAX_REASK_TOKENS = 65536
#: After an overflow the request is rebuilt at most this share of its size (or to the learned window).
SHRINK_AFTER_OVERFLOW = 0.6
#: A reply cut at ``finish_reason: length`` with fewer tokens than this share of its cap was cut by the
#: window.
SHORT_REPLY_SHARE = 0.5
#: Tokens kept free beside a prompt and its reply cap (chat template, estimate error), plus 1 % of the window.
FIT_MARGIN_TOKENS = 16
#: Only prompts of at least this many tokens teach the characters-per-token figure prompts are sized by.
DENSITY_MIN_TOKENS = 256
#: No window smaller than this is learned from a short reply (nor can ``context_tokens`` state one).
MIN_WINDOW_TOKENS = 256
#: A structured call's request, or a function from a prompt size in characters to a request that fits it.
RequestBuilder = Callable[[int], ChatRequest]


def _schema_chars(schema: type[BaseModel]) -> int:
    """What the schema adds to a prompt on servers that take it in the text (its instruction and a blank
    line)."""
    return len(schema_instruction(schema)) + 2


def _schema_chars_of(request: ChatRequest) -> int:
    return _schema_chars(request.response_schema) if request.response_schema is not None else 0


def _fixed(request: ChatRequest) -> RequestBuilder:
    return lambda _limit: request


def with_correction(request: ChatRequest, text: str) -> ChatRequest:
    """``request`` with ``text`` added to its last user message (a new user message if it ends otherwise):
    one user turn, as every chat template accepts."""
    *head, last = request.messages
    if last.role != "user":
        return request.model_copy(update={"messages": [*request.messages, user(text.lstrip())]})
    content = last.content + text if isinstance(last.content, str) else [*last.content, TextPart(text=text)]
    return request.model_copy(update={"messages": [*head, Message(role="user", content=content)]})


#: How a re-ask's correction starts (fakes recognise a re-ask by it).
CORRECTION_LEAD = "Your previous reply could not be used: "


def correction_text(problem: str, schema: type[BaseModel]) -> str:
    """The re-ask's user message: the problem (at most 200 characters) and the keys to reply with."""
    keys = ", ".join(f'"{name}"' for name in schema.model_fields)
    problem = problem if len(problem) <= 200 else problem[:197] + "..."
    return (f"{CORRECTION_LEAD}{problem}. Reply again with one JSON object with the keys "
            f"{keys}, as the instructions describe, and nothing else.")


#: Run just before this context sends a request that no stored or prefetched reply answers: a rollout
#: takes its concurrency slot there (``skillopt.run.rollouts.roll_out``), so a rollout whose replies are all
#: stored (prefetched, or cached by an earlier run) never waits for a slot it would not use.
BEFORE_SEND: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "skillopt_before_send", default=None)


def _before_send() -> None:
    hook = BEFORE_SEND.get()
    if hook is not None:
        hook()


class RoleClient:
    """All calls of one role. Thread-safe; the backend object is built on first use."""

    def __init__(
        self,
        role: ResolvedRole,
        info: BackendInfo,
        *,
        secrets: SecretSource,
        context: BackendContext,
        limiter: RateLimiter,
        ledger: UsageLedger,
        retrier: Retrier,
        redactor: Redactor,
        replies: ReplyStore | None = None,
        modes: StructuredModes | None = None,
        windows: ContextWindows | None = None,
    ) -> None:
        self.role = role
        self.modes = modes or StructuredModes()
        self.windows = windows or ContextWindows()
        # Every backend's replies are stored, the free and deterministic scripted one's too: a resumed run
        # takes the calls it already made from the store, so they count once against budget.max_calls.
        self.replies = replies
        self.info = info
        self.secrets = secrets
        self.context = context
        self.limiter = limiter
        self.ledger = ledger
        self.retrier = retrier
        self.redactor = redactor
        self._backend: Any = None
        self._lock = threading.Lock()
        self._window: int | None = None
        #: Whether the window was stated, reported or learned (not the default guess): then every request's
        #: reply cap is fitted to it.
        self._window_known = False
        #: Set by the user or reported by the server: then a short reply teaches nothing.
        self._window_stated = False
        self._chars_per_token = float(CHARS_PER_TOKEN)
        self._window_lock = threading.Lock()
        self.retry_notes = RetryNotes(role.role)

    @property
    def backend(self) -> Any:
        """The backend object (built once; a missing credential or extra raises ``ConfigError`` here)."""
        with self._lock:
            if self._backend is None:
                self._backend = self.info.factory(self.role, self.secrets, self.context)
            return self._backend

    # -- plain calls ------------------------------------------------------------------------

    def chat(self, request: ChatRequest) -> ChatResponse:
        """One call with retries, rate limits and accounting. Raises ``BackendError`` naming the role.

        Once the role's window is known, the reply cap is lowered to what the window leaves beside the
        prompt; a reply cut short far below its cap teaches the window (``_learn_from_reply``)."""
        request = self._fit_cap(request)
        response = self._chat(request)
        self._learn_from_reply(request, response)
        return response

    def _chat(self, request: ChatRequest) -> ChatResponse:
        backend = self.backend
        timeout_s = request.timeout_s or self.role.timeout_s
        cap = request.max_tokens or self.role.max_tokens or 1024
        estimate = request.prompt_chars() // 4 + cap
        if self.replies is None:
            _before_send()
            return self._call(request, backend, timeout_s, estimate, None)
        store_key = ReplyStore.key(self.role.fingerprint(), request)
        # One call per request at a time in this process: a prefetched call (skillopt.run.prefetch) and the
        # task's
        # own are one call.
        with self.replies.claim(store_key):
            prefetching = PREFETCH.get()
            taken = None if prefetching else self.replies.take_prefetched(store_key)
            if taken is not None:
                return taken
            stored = self.replies.get(store_key)
            if stored is not None:
                if not prefetching:  # a prefetch finding a reply is no call of the run, not even a cached one
                    self._record(request.stage, request.tags, model_served=stored.model, usage=stored.usage,
                                 latency_s=0.0, attempts=0, status="ok", cache_hit=True)
                return stored.model_copy(update={"cost_usd": 0.0, "attempts": 0})
            _before_send()
            response = self._call(request, backend, timeout_s, estimate, store_key)
            if prefetching:
                self.replies.keep_prefetched(store_key, response)
            return response

    def _call(self, request: ChatRequest, backend: Any, timeout_s: float, estimate: int,
              store_key: str | None) -> ChatResponse:
        try:
            self.ledger.before_call()
        except BackendError as error:
            raise self._with_context(error, request) from None

        def once(attempt: int) -> ChatResponse:
            with self.limiter.acquire(self.role.rate_limit_key, tokens=estimate):
                return backend.attempt(request, timeout_s=timeout_s)

        def on_retry(error: BackendError, wait: float) -> None:
            self._with_context(error, request)
            local = self.info.kind == "chat" and is_loopback(self.role.base_url)
            if isinstance(error, CallTimeout) and local:
                self._wait_until_free(backend, timeout_s)
            line = self.retry_notes.line(error, request.stage, wait)
            if line is not None:
                log.warning("%s", line)
            if isinstance(error, RateLimited):
                self.limiter.pause(self.role.rate_limit_key, max(wait, error.retry_after or 0.0))

        try:
            response, attempts = self.retrier.run(once, on_retry=on_retry)
        except BackendError as error:
            self._with_context(error, request)
            self._record(request.stage, request.tags, model_served=None, usage=None, latency_s=0.0,
                         attempts=error.attempts or 1, status="error", error_class=type(error).__name__)
            raise
        response = response.model_copy(update={"attempts": attempts, "backend": self.role.backend})
        if self.replies is not None and store_key is not None:
            # Kept before its usage line is written: a kill between the two must not pay for the call again.
            self.replies.put(store_key, response)
        record = self._record(request.stage, request.tags, model_served=response.model, usage=response.usage,
                              latency_s=response.latency_s, attempts=attempts, status="ok")
        return response.model_copy(update={"cost_usd": record.cost_usd})

    def _record(self, stage: str, tags: Mapping[str, Any], *, model_served: str | None, usage: Usage | None,
                latency_s: float, attempts: int, status: Literal["ok", "error"],
                error_class: str | None = None, cache_hit: bool = False,
                cost_usd: float | None = None) -> UsageRecord:
        """The usage line of one call of this role at ``stage`` (a stored reply, an error, a reply or an exec
        run; ``cost_usd`` is the cost an exec CLI reported itself)."""
        return self.ledger.record(
            role=self.role.role, backend=self.role.backend, model_requested=self.role.model,
            model_served=model_served, stage=stage, usage=usage, latency_s=latency_s,
            attempts=attempts, status=status, error_class=error_class, tags=tags,
            cache_hit=cache_hit, price_model=self.role.price_model, cost_usd=cost_usd,
        )

    def _wait_until_free(self, backend: Any, timeout_s: float) -> None:
        """After a timeout against a server on this machine: it is most likely still computing the abandoned
        request (one slot), so a retry now would only queue behind it and time out in turn. One tiny request,
        given twice the call's timeout, returns when the server is free; then the retry goes."""
        log.warning("[%s] %s: no reply within %g s; the local server is likely still busy with that request: "
                    "waiting for it to be free before retrying (raise model.%s.timeout_s for a slow server)",
                    self.role.role, self.role.short_label(), timeout_s, self.role.role)
        probe = ChatRequest(messages=[user("Reply with OK.")], stage="preflight", max_tokens=1)
        with contextlib.suppress(BackendError):  # still busy or gone: the retry finds out and says so
            backend.attempt(probe, timeout_s=timeout_s * 2)

    def _with_context(self, error: BackendError, request: ChatRequest) -> BackendError:
        error.role = error.role or self.role.role
        error.backend = error.backend or self.role.label().split("/", 1)[0]
        error.model = error.model or self.role.model
        error.stage = error.stage or request.stage
        error.reason = self.redactor(error.reason)
        if isinstance(error, CallTimeout) and not error.hint:
            error.hint = (f"a slow or busy server needs more time: raise model.{self.role.role}.timeout_s "
                          f"(now {request.timeout_s or self.role.timeout_s:g} s)")
        return error

    # -- context window ---------------------------------------------------------------------

    def context_window(self) -> int:
        """This role's context window in tokens (``skillopt.llm.context``: setting, backend, table,
        default), found once; a window learned from an overflow error replaces it."""
        with self._window_lock:
            if self._window is None:
                self._window = self._find_window()
            learned = self.windows.get(self.endpoint())  # another role on this endpoint may have learned it
            if learned and learned < self._window and not self.role.context_tokens:
                self._window, self._window_known = learned, True
            return self._window

    def _find_window(self) -> int:
        self._window_known = True
        if self.role.context_tokens:
            self._window_stated = True
            return self.role.context_tokens
        ask = getattr(self.backend, "context_tokens", None)
        reported = ask() if callable(ask) else None
        learned = self.windows.get(self.endpoint())
        self._window_stated = bool(reported)
        if reported or learned:
            return min(int(w) for w in (reported, learned) if w)
        table = known_context_tokens(self.role.price_model)
        self._window_known = table is not None
        return table or DEFAULT_CONTEXT_TOKENS

    def prompt_room(self) -> PromptRoom:
        """The room a structured call's prompt and reply have in this role's window."""
        return PromptRoom.of(self.context_window(), self.role.max_tokens, self._chars_per_token)

    def _fit_cap(self, request: ChatRequest) -> ChatRequest:
        """``request`` with its reply cap lowered to what a known window leaves beside its prompt."""
        if self.role.backend == "scripted" or self.info.kind != "chat":
            return request
        room = self.prompt_room()
        if not self._window_known:
            return request
        wanted = request.max_tokens or self.role.max_tokens
        prompt = room.prompt_tokens(request.prompt_chars() + _schema_chars_of(request))
        free = room.context_tokens - prompt - FIT_MARGIN_TOKENS - room.context_tokens // 100
        if wanted is not None and wanted <= free:
            return request
        return request.model_copy(update={"max_tokens": max(16, free)})

    def _learn_from_reply(self, request: ChatRequest, response: ChatResponse) -> None:
        """What a reply shows about the window: its prompt's characters per token, and, when it was cut
        short far below its cap, the window itself (prompt plus reply tokens)."""
        prompt_tokens = response.usage.prompt_tokens
        if not prompt_tokens or response.attempts == 0:  # a stored reply says nothing new
            return
        density = (request.prompt_chars() + self._schema_chars_sent(request)) / prompt_tokens
        # a short prompt's tokens are mostly the chat template's: only a long one says how dense text is
        if prompt_tokens >= DENSITY_MIN_TOKENS and density < self._chars_per_token:
            with self._window_lock:
                self._chars_per_token = max(1.0, density)
        cap = request.max_tokens or self.role.max_tokens
        reply_tokens = response.usage.completion_tokens
        implied = prompt_tokens + (reply_tokens or 0)
        self.context_window()
        if self._window_stated or implied < MIN_WINDOW_TOKENS:
            return
        if response.truncated and cap and reply_tokens is not None and reply_tokens < cap * SHORT_REPLY_SHARE:
            self._learn(prompt_tokens + reply_tokens, f"a reply cut short at {reply_tokens} of max_tokens "
                        f"{cap} after a {prompt_tokens}-token prompt")

    def _schema_chars_sent(self, request: ChatRequest) -> int:
        """The characters of schema instruction the backend added to ``request``'s prompt: none when the
        schema went as a constrained-decoding parameter (``json_schema``), else the instruction's length. The
        server counts them in its prompt tokens; leaving them out of the density made every later prompt
        look a quarter longer than it was (a re-ask got a 37-token cap in a 4,096-token window)."""
        if request.response_schema is None:
            return 0
        mode = getattr(self.backend, "structured_mode", None)
        if callable(mode) and mode(request) == "json_schema":
            return 0
        return _schema_chars(request.response_schema)

    def window_cut(self, response: ChatResponse, cap: int | None) -> str | None:
        """Why ``response`` was cut, when the window (not ``max_tokens``) did it."""
        reply_tokens, prompt_tokens = response.usage.completion_tokens, response.usage.prompt_tokens
        if not (response.truncated and cap and reply_tokens is not None and prompt_tokens):
            return None
        if reply_tokens >= cap * SHORT_REPLY_SHARE:
            return None
        return (f"the reply was cut short by the context window ({prompt_tokens} prompt + {reply_tokens} "
                f"reply tokens; max_tokens was {cap}); later prompts are built to fit it")

    def prompt_chars(self, schema: type[BaseModel]) -> int:
        """How long a structured call's prompt for ``schema`` may be: the room the window leaves, less what a
        server that takes the schema in the text adds. Builders are first called with this size."""
        return self.prompt_room().prompt_chars - _schema_chars(schema)

    def _learn_window(self, error: BackendError) -> None:
        window = window_from_error(error.reason)
        if window:
            self._learn(window, "an overflow error")

    def _learn(self, window: int, source: str) -> None:
        """Hold ``window`` for this role and every role on its endpoint, for the run (and its resume)."""
        self.context_window()
        with self._window_lock:
            if self._window_known and self._window is not None and window >= self._window:
                return
            self._window, self._window_known = window, True
        if self.windows.learn(self.endpoint(), window, source):
            log.warning("[%s] %s: the context window is %d tokens (learned from %s); prompts and reply caps "
                        "are built to fit it (set model.%s.context_tokens to state it)", self.role.role,
                        self.role.short_label(), window, source, self.role.role)

    # -- structured calls -------------------------------------------------------------------

    def structured(self, request: ChatRequest | RequestBuilder, schema: type[M], *,
                   repair: bool | None = None) -> tuple[M, ChatResponse]:
        """A validated ``schema`` object from the reply, fitted to the context window, with one
        re-ask on a parse failure.

        ``request`` is a request or a builder: a function from a prompt size in characters to a
        request that fits it (stages with long evidence shorten it to fit). The first request is
        built for the role's ``prompt_room``; its reply cap is lowered if prompt plus cap would pass
        the window. A ``ContextLengthExceeded`` reply (the estimate was off, or the server's window is
        smaller than assumed) is answered once with a request built for a smaller size; a second
        overflow raises. A parse failure gets one re-ask: the request rebuilt a correction's length
        smaller plus a short correction naming the problem and the keys (never the bad reply or the
        schema), so a re-ask is never larger than the first call; a builder that cannot shrink (a
        fixed request) grows by the correction only. ``max_tokens`` doubles if the first reply was
        cut off. A second failure raises ``ParseError``; the caller applies its stage's fallback.
        """
        if repair is None:
            repair = self.role.role == "optimizer"
        build = request if callable(request) else _fixed(request)
        # json_object servers carry the schema in the prompt: leave it room.
        # Where the window is not known (a server that reports none, a model of no table), the endpoint's
        # first structured call goes alone: the overflow or short reply it may meet is learned before any
        # other is sent (on a slow local server, every call sent meanwhile would be built too long).
        self.context_window()
        with self.modes.first_call(self.endpoint(), alone=not self._window_known):
            first_request, first = self._send_fitting(build, schema, self.prompt_chars(schema))
        try:
            return self._parse(first, schema, first_request, repair), first
        except ParseError as error:
            problem = error.reason
        correction = "\n\n" + correction_text(problem, schema)
        # never larger than the first call, and within the window as now known (it may have been learned)
        rebuilt = build(min(first_request.prompt_chars(), self.prompt_chars(schema)) - len(correction))
        cap = first_request.max_tokens or self.role.max_tokens or 1024
        if first.truncated:
            cap = self.prompt_room().answer_cap(rebuilt.prompt_chars(), min(cap * 2, MAX_REASK_TOKENS))
        second_request = with_correction(rebuilt, correction).model_copy(update={
            "max_tokens": cap, "response_schema": schema,
        })
        second = self._chat_structured(second_request)
        return self._parse(second, schema, second_request, repair), second

    def endpoint(self) -> str:
        """``backend|base_url|model``: what the run learns about a server is held under this key."""
        return f"{self.role.backend}|{self.role.base_url or ''}|{self.role.model or ''}"

    def _chat_structured(self, request: ChatRequest) -> ChatResponse:
        """``chat`` for a structured request. An endpoint that refuses how the request asks for its shape
        (a 400/422 that is not an overflow) gets the next way (``structured_output.FALLBACKS``) for this and
        every later call of the run, with one note per step."""
        backend = self.backend
        refuse, use = getattr(backend, "refuse_constrained", None), getattr(backend, "use_mode", None)
        if not callable(refuse) or not callable(use):
            return self.chat(request)
        return self._chat_falling_back(request, refuse, use)

    def _chat_falling_back(self, request: ChatRequest, refuse: Callable[[ChatRequest], str | None],
                           use: Callable[[str], None]) -> ChatResponse:
        while True:
            sent_with = self.modes.fallen_to(self.endpoint())
            if sent_with is not None:
                use(sent_with)
            try:
                return self.chat(request)
            except BadRequest as error:
                if isinstance(error, (ContextLengthExceeded, ModelNotFound)):
                    raise
                chosen = self.role.structured_output
                if chosen != "auto":  # the user's choice is kept: refused, it is an error that names it
                    error.hint = (f"model.{self.role.role}.structured_output is {chosen}, which this server "
                                  "refuses; set it to auto to step down to what the server takes, or choose "
                                  "another")
                    raise
                with self.modes.refusals:
                    if self.modes.fallen_to(self.endpoint()) != sent_with:
                        continue  # a call refused the same way moved the endpoint on meanwhile: go its way
                    fallback = refuse(request)
                    if fallback is None:
                        raise
                    moved = self.modes.fall_to(self.endpoint(), fallback)
                if moved:
                    log.warning("[%s] %s: the server refused this way of asking for structured output (%s); "
                                "structured calls now use %s for the rest of the run (set model.%s."
                                "structured_output to choose)", self.role.role, self.role.short_label(),
                                _clipped(error.reason, 200), fallback, self.role.role)

    def _send_fitting(self, build: RequestBuilder, schema: type[BaseModel], limit: int
                      ) -> tuple[ChatRequest, ChatResponse]:
        request = self._capped(build(limit), schema)
        try:
            return request, self._chat_structured(request)
        except ContextLengthExceeded as error:
            self._learn_window(error)
            smaller_limit = min(
                self.prompt_chars(schema), int(request.prompt_chars() * SHRINK_AFTER_OVERFLOW)
            )
            smaller = self._capped(build(smaller_limit), schema)
            if smaller.prompt_chars() >= request.prompt_chars() and smaller.max_tokens == request.max_tokens:
                error.hint = self._no_fit_hint(request)  # nothing left to shrink: the stage falls back
                raise
            log.warning(
                "[%s] stage %s overflowed the context window (%d prompt characters); sending it once "
                "more at %d",
                self.role.role,
                request.stage,
                request.prompt_chars(),
                smaller.prompt_chars(),
            )
            try:
                return smaller, self._chat_structured(smaller)
            except ContextLengthExceeded as again:
                again.hint = self._no_fit_hint(smaller)
                raise

    def _no_fit_hint(self, request: ChatRequest) -> str:
        return (f"stage {request.stage} does not fit this model's {self.context_window():,}-token context "
                f"window even at {request.prompt_chars():,} prompt characters; serve the model with a larger "
                "window")

    def _capped(self, request: ChatRequest, schema: type[BaseModel]) -> ChatRequest:
        """``request`` with the response schema and a reply cap that fits the window beside its prompt."""
        wanted = request.max_tokens or self.role.max_tokens
        cap = self.prompt_room().answer_cap(request.prompt_chars() + _schema_chars(schema), wanted)
        return request.model_copy(update={"response_schema": schema,
                                          "max_tokens": request.max_tokens if cap == wanted else cap})

    def _parse(self, response: ChatResponse, schema: type[M], request: ChatRequest, repair: bool) -> M:
        context: ErrorContext = {
            "role": self.role.role,
            "backend": self.role.backend,
            "model": self.role.model,
            "stage": request.stage,
        }
        if response.truncated:
            cap = self._fit_cap(request).max_tokens or self.role.max_tokens  # the cap ``chat`` sent
            raise ParseError(self.window_cut(response, cap) or f"the reply was cut off at max_tokens ({cap})",
                             excerpt=response.text[-300:], **context)
        if response.parsed is not None:
            try:
                return schema.model_validate(response.parsed)
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False)
                )
                raise ParseError(f"validation failed: {problems}", excerpt=json.dumps(response.parsed)[:300],
                                 **context) from None
        try:
            result = extract_json(response.text, schema, repair=repair, stage=request.stage)
        except ParseError as error:
            error.role, error.backend, error.model = self.role.role, self.role.backend, self.role.model
            raise
        assert isinstance(result, schema)
        return result

    # -- exec targets -----------------------------------------------------------------------

    def run_exec(self, task: Any) -> Any:
        """Run one item on an agentic CLI (``codex_exec`` / ``claude_code_exec``), accounted like a chat."""
        backend = self.backend
        self.ledger.before_call()
        with self.limiter.acquire(f"exec:{self.role.backend}", tokens=0):
            try:
                result = backend.run(task)
            except BackendError as error:
                error.role, error.backend, error.model = self.role.role, self.role.backend, self.role.model
                error.stage = error.stage or "rollout"
                self._record("rollout", task.tags, model_served=None, usage=None, latency_s=0.0,
                             attempts=error.attempts or 1, status="error", error_class=type(error).__name__)
                raise
        self._record("rollout", task.tags, model_served=result.model, usage=result.usage,
                     latency_s=result.latency_s, attempts=result.attempts, status="ok",
                     cost_usd=result.cost_usd)
        return result


@dataclass
class ModelClients:
    """The three role clients of one run, sharing one limiter and one ledger."""

    roles: ResolvedRoles
    target: RoleClient
    optimizer: RoleClient
    judge: RoleClient | None
    ledger: UsageLedger
    limiter: RateLimiter
    windows: ContextWindows = field(default_factory=ContextWindows)

    def get(self, role: str) -> RoleClient:
        client = getattr(self, role)
        if client is None:
            raise ConfigError(f"the judge role cannot be used: {self.roles.judge_problem}")
        return client

    @classmethod
    def build(
        cls,
        roles: ResolvedRoles,
        *,
        loaded: LoadedConfig,
        registry: BackendRegistry,
        secrets: SecretSource,
        context: BackendContext | None = None,
        ledger: UsageLedger | None = None,
        limiter: RateLimiter | None = None,
        usage_path: Path | None = None,
        replies: ReplyStore | None = None,
        windows: ContextWindows | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> ModelClients:
        model = loaded.config.model
        context = context or BackendContext()
        if ledger is None:
            ledger = UsageLedger(usage_path, PriceTable.load(_path_or_none(model.pricing_file)),
                                 loaded.config.budget)
        if limiter is None:
            if model.rate_limit_mode == "off":
                limiter = NoLimits()
            elif model.rate_limit_mode == "prefect":
                raise ConfigError(
                    "model.rate_limit_mode: prefect needs the Prefect limiter "
                    "(skillopt.tasks.limits.PrefectRateLimiter); pass it as limiter=..."
                )
            else:
                limiter = LocalRateLimiter(model.providers, clock=clock, sleep=sleep,
                                           defaults=_exec_defaults(roles))
        redactor = Redactor.from_environment(secrets.env if isinstance(secrets, EnvSecrets) else None)
        modes = StructuredModes()
        windows = windows or ContextWindows()

        def client(role: ResolvedRole | None) -> RoleClient | None:
            if role is None:
                return None
            return RoleClient(
                role,
                registry.get(role.backend),
                secrets=secrets,
                context=context,
                limiter=limiter,
                ledger=ledger,
                retrier=Retrier(model.retry, sleep=sleep, clock=clock),
                redactor=redactor,
                replies=replies,
                modes=modes,
                windows=windows,
            )

        target, optimizer = client(roles.target), client(roles.optimizer)
        assert target is not None and optimizer is not None
        judge = client(roles.judge) if roles.judge_problem is None else None
        return cls(roles, target, optimizer, judge, ledger, limiter, windows)

    @classmethod
    def from_config(
        cls,
        loaded: LoadedConfig,
        *,
        env: Mapping[str, str],
        cli: CliRoleOptions | None = None,
        registry: BackendRegistry | None = None,
        **kwargs: Any,
    ) -> ModelClients:
        """Resolve the roles of ``loaded`` and build their clients (credentials from ``env``)."""
        registry = registry or BackendRegistry.default()
        roles = resolve_roles(loaded, cli=cli, env=env, registry=registry)
        return cls.build(roles, loaded=loaded, registry=registry, secrets=EnvSecrets(env), **kwargs)


def _path_or_none(value: str | None) -> Path | None:
    return Path(value) if value else None


def _exec_defaults(roles: ResolvedRoles) -> dict[str, Any]:
    from skillopt.core.config import ProviderLimits

    defaults = {}
    for role in (roles.target, roles.optimizer, roles.judge):
        if role is not None and role.options.get("max_parallel"):
            defaults[f"exec:{role.backend}"] = ProviderLimits(
                max_concurrency=int(role.options["max_parallel"])
            )
        if (
            role is not None
            and role.backend == "openai_compatible"
            and role.options.get("preset") == "ollama"
        ):
            defaults.setdefault(role.rate_limit_key, ProviderLimits(max_concurrency=1))
    return defaults


def _clipped(text: str, limit: int) -> str:
    """``text`` cut at a word before ``limit`` characters, marked as cut."""
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"
