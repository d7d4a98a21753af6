"""Pieces the HTTP backends share: error classification, deadline-bound reads, warn-once, one TLS context.

Provider bodies appear in errors only redacted and cut to 500 characters.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

from skillopt.core.errors import ConfigError
from skillopt.core.redact import Redactor
from skillopt.llm.errors import (
    AuthError,
    BackendError,
    BadRequest,
    CallTimeout,
    ConnectionFailed,
    ContextLengthExceeded,
    ErrorContext,
    ModelNotFound,
    PermissionDenied,
    RateLimited,
    ServerError,
)
from skillopt.llm.retry import parse_retry_after
from skillopt.llm.roles import ResolvedRole

log = logging.getLogger("skillopt.llm")

_CONTEXT_WORDS = (
    "context_length",
    "context length",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "context window",
    "context size",
    "exceed_context_size",
)


def host_of(url: str | None) -> str:
    return urlparse(url).netloc if url else "the default endpoint"


def classify_status(
    status: int,
    *,
    headers: Mapping[str, str],
    body: str,
    role: ResolvedRole,
    redactor: Redactor,
) -> BackendError:
    """The ``BackendError`` for an HTTP error status, with the provider's message and a hint."""
    message, code = _provider_message(body)
    excerpt = redactor(message or body)[:500]
    where = f"HTTP {status} from {host_of(role.base_url)}"
    reason = f"{where}: {excerpt}" if excerpt else where
    context: ErrorContext = {"status": status,
                             "request_id": headers.get("x-request-id") or headers.get("request-id")}
    lowered = f"{code or ''} {message or ''}".lower()
    if status == 401:
        return AuthError(reason, hint=_key_hint(role), **context)
    if status == 403:
        return PermissionDenied(
            reason, hint="the credential has no access to this model or endpoint", **context
        )
    if status == 429:
        return RateLimited(reason, retry_after=parse_retry_after(headers), **context)
    if status in (408,):
        return CallTimeout(reason, **context)
    if status in (409, 500, 502, 503, 504, 529) or status >= 500:
        return ServerError(reason, **context)
    if any(word in lowered for word in _CONTEXT_WORDS):
        return ContextLengthExceeded(reason, hint="shorten the prompt or lower max_tokens", **context)
    if status == 404:
        if "model" in lowered or "deployment" in lowered:
            return ModelNotFound(reason, hint=f"check model.{role.role}.model", **context)
        return BadRequest(reason, hint=f"check model.{role.role}.base_url", **context)
    return BadRequest(reason, **context)


def _provider_message(body: str) -> tuple[str | None, str | None]:
    try:
        data = json.loads(body)
    except (ValueError, TypeError):
        return None, None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            message = error.get("message")
            code = error.get("code") or error.get("type")
            return (str(message) if message else None), (str(code) if code else None)
        if isinstance(error, str):
            return error, None
    return None, None


def _key_hint(role: ResolvedRole) -> str:
    variable = role.api_key_env or "the key variable"
    if role.api_key_secret:
        return f"check the Prefect Secret block {role.api_key_secret!r} or model.{role.role}.api_key_secret"
    return f"the server rejected the key; set {variable} or model.{role.role}.api_key_env"


@contextmanager
def sdk_post(sdk: ModuleType, client: Any, path: str, body: dict[str, Any], *,
             timeout_s: float) -> Iterator[Any]:
    """POST ``body`` to ``path`` through an SDK client; yields the HTTP response, its body not yet read.

    The client's own request path: its base URL, key and default headers, Azure's deployment URLs, its error
    classes for a refused request, no SDK retries. Not the endpoint methods' (``chat.completions.create`` and
    the like): each walks the body against the API's typed parameters before it sends it, 1.8 ms of a core per
    call measured with the OpenAI SDK, more than the rest of skillopt's own work for the call, and every
    call of a wave waited for the others' walks behind the interpreter lock. skillopt's bodies are JSON
    already: the wire body is exactly the one the backend built, whatever the installed SDK release names.
    """
    library = http_library(sdk)
    if library is None:
        raise ConfigError(f"{sdk.__name__} {getattr(sdk, '__version__', '')}: its HTTP library is not one "
                          "skillopt knows (httpx or httpx2)")
    response = client.post(path, cast_to=library.Response, body=body, options={"timeout": timeout_s},
                           stream=True)
    try:
        yield response
    finally:
        response.close()


def transport_error(exc: BaseException, *, timeout_s: float) -> BackendError | None:
    """The ``BackendError`` for an HTTP-client error raised while the body streams, else None.

    The SDKs sit on ``httpx`` or its fork ``httpx2``; both name their classes the same, so the
    class names along the MRO decide (a timeout of any kind, else any transport failure).
    """
    names = {cls.__name__ for cls in type(exc).__mro__
             if str(getattr(cls, "__module__", "")).partition(".")[0] in ("httpx", "httpx2")}
    if "TimeoutException" in names:
        return CallTimeout(f"no complete response within {timeout_s:g} s")
    if "TransportError" in names:
        return ConnectionFailed(f"the connection broke while reading the response ({type(exc).__name__})")
    return None


@contextmanager
def sdk_errors(sdk: Any, *, role: ResolvedRole, redactor: Redactor, timeout_s: float) -> Iterator[None]:
    """Translate an SDK's (``openai`` or ``anthropic``) exceptions into classified ``BackendError``s."""
    try:
        yield
    except sdk.APIStatusError as exc:
        raise classify_status(
            exc.status_code,
            headers=exc.response.headers,
            body=exc.response.text,
            role=role,
            redactor=redactor,
        ) from None
    except sdk.APITimeoutError:
        raise CallTimeout(f"no response within {timeout_s:g} s") from None
    except sdk.APIConnectionError as exc:
        cause = exc.__cause__ or exc.__context__
        reason = type(cause).__name__ if cause else type(exc).__name__
        raise ConnectionFailed(f"cannot reach {role.base_url or 'the API'}: {reason}") from None
    except BackendError:
        raise
    except Exception as exc:  # HTTP-client errors raised while the body streams
        error = transport_error(exc, timeout_s=timeout_s)
        if error is None:
            raise
        raise error from None


def parse_body(model: Any, raw: bytes) -> Any:
    """Validate a provider's JSON body with the SDK's model; a body that does not fit is a server error."""
    from pydantic import ValidationError

    try:
        return model.model_validate_json(raw)
    except ValidationError:
        snippet = raw[:80].decode("utf-8", "replace").replace("\n", " ")
        raise ServerError(f"malformed response body (starts with {json.dumps(snippet)})") from None


def read_with_deadline(
    chunks: Iterable[bytes], *, deadline: float, clock: Callable[[], float] = time.monotonic, timeout_s: float
) -> bytes:
    """Join a response body, raising ``CallTimeout`` once ``deadline`` passes between chunks."""
    parts = []
    for chunk in chunks:
        parts.append(chunk)
        if clock() > deadline:
            raise CallTimeout(f"no complete response within {timeout_s:g} s (the body was still arriving)")
    return b"".join(parts)


class WarnOnce:
    """Logs each distinct message once per owner (a backend object serving one role)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self.notes: list[str] = []

    def __call__(self, message: str) -> None:
        with self._lock:
            if message in self._seen:
                return
            self._seen.add(message)
            self.notes.append(message)
        log.warning(message)


#: Notes about a server rather than a role (its thinking default, for one): said once per process, whichever
#: role and however many clients the run builds meet it first.
SERVER_NOTES = WarnOnce()


def drop_unsupported(role: ResolvedRole, param: str, why: str, warn: WarnOnce) -> None:
    """Leave out a parameter the model cannot take: a warning, or a ConfigError with strict_params."""
    message = f"[{role.role}] {role.label()}: {param} is not sent ({why})"
    if role.strict_params:
        raise ConfigError(f"{message}; model.{role.role}.strict_params is on")
    warn(message)


def require_key(role: ResolvedRole, key: str | None) -> str:
    """The credential, or a ConfigError naming where to put it."""
    if key:
        return key
    if role.api_key_secret:
        raise ConfigError(
            f"[{role.role}] {role.label()}: the Prefect Secret block {role.api_key_secret!r} could not be "
            "read"
        )
    raise ConfigError(
        f"[{role.role}] {role.label()}: no credential; export {role.api_key_env} or set "
        f"model.{role.role}.api_key_env"
    )


def resolve_key(role: ResolvedRole, secrets) -> str | None:  # noqa: ANN001 - SecretSource protocol
    """The key from a Secret block (wins) or the named environment variable."""
    if role.api_key_secret:
        return secrets.get_block(role.api_key_secret)
    if role.api_key_env:
        return secrets.get(role.api_key_env)
    return None


# --------------------------------------------------------------------------------------------
# One TLS context per process


@functools.cache
def http_library(sdk: ModuleType) -> ModuleType | None:
    """The HTTP library an SDK's client is built on (``httpx``, or ``httpx2`` in later releases): the package
    of the first class in ``sdk.DefaultHttpxClient``'s ancestry that builds TLS contexts; None if none
    does. Found once per SDK (every request asks, through ``sdk_post``)."""
    for cls in getattr(sdk, "DefaultHttpxClient", type(None)).__mro__:
        package = sys.modules.get(cls.__module__.partition(".")[0])
        if package is None or package is sdk:
            continue
        if callable(getattr(package, "create_ssl_context", None)):
            return package
    return None


def shared_tls_context(library: ModuleType) -> ssl.SSLContext:
    """The verified TLS context ``library`` gives every client by default, built once per process (and per
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, which that default reads).

    Building one loads the whole certificate store: 50-150 ms of a core on a two-core machine, and each SDK
    client, each context-window probe and the credential check built their own, six times in a run. A
    context is safe to share between clients and threads, and the one built here is exactly the default
    each would have built."""
    return _tls_context(library, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_context(library: ModuleType, cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    """``library``'s default context while ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` hold these values."""
    return library.create_ssl_context()


def sdk_http_client(sdk: ModuleType, **options: Any) -> Any:
    """``sdk.DefaultHttpxClient`` (the SDK's own timeouts, limits and redirects) on the process's shared TLS
    context; None where the SDK's HTTP library is not recognised (the SDK then builds its own)."""
    library = http_library(sdk)
    if library is None:
        return None
    return sdk.DefaultHttpxClient(verify=shared_tls_context(library), **options)
