"""Errors of model calls.

Every ``BackendError`` carries the role, backend, model and stage of the call, and its
message starts with ``[<role>] <backend>/<model> (stage <stage>)`` when those are known,
followed by the cause and a hint. ``retryable`` marks the errors the retry loop may repeat.
"""

from __future__ import annotations

from typing import TypedDict, Unpack

from skillopt.core.errors import SkillOptError


class ErrorContext(TypedDict, total=False):
    """Where a failed call went: the keywords of ``BackendError`` that code collects once and passes to
    each error it may raise (the hint, the retry delay and the attempt count are given per error)."""

    role: str | None
    backend: str | None
    model: str | None
    stage: str | None
    status: int | None
    request_id: str | None


class BackendError(SkillOptError):
    """A model call failed. Subclasses name the cause; ``retryable`` says whether to try again.

    The context fields may be filled in after the error is raised (the client knows the role
    and the attempt count, the backend knows the HTTP status); ``str(error)`` always renders the
    current state: ``[<role>] <backend>/<model> (stage <stage>): <reason> after N attempts - <hint>``.
    """

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        role: str | None = None,
        backend: str | None = None,
        model: str | None = None,
        stage: str | None = None,
        status: int | None = None,
        request_id: str | None = None,
        attempts: int | None = None,
        hint: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = message
        self.role = role
        self.backend = backend
        self.model = model
        self.stage = stage
        self.status = status
        self.request_id = request_id
        self.attempts = attempts
        self.hint = hint
        self.retry_after = retry_after

    def __str__(self) -> str:
        prefix = ""
        if self.role or self.backend or self.model:
            prefix = f"[{self.role or '?'}] {self.backend or '?'}/{self.model or '?'}"
            if self.stage:
                prefix += f" (stage {self.stage})"
            prefix += ": "
        text = prefix + self.reason
        if self.attempts:
            text += f" after {self.attempts} attempt{'s' if self.attempts != 1 else ''}"
        if self.hint:
            text += f" - {self.hint}"
        return text


class AuthError(BackendError):
    """The provider rejected the credential (HTTP 401)."""


class PermissionDenied(BackendError):
    """The credential lacks access to this model or endpoint (HTTP 403)."""


class BadRequest(BackendError):
    """The provider rejected the request as malformed (HTTP 400/404/413/422)."""


class ContextLengthExceeded(BadRequest):
    """The prompt plus the output cap exceed the model's context window."""


class ModelNotFound(BadRequest):
    """The model id is unknown to the provider."""


class RateLimited(BackendError):
    """HTTP 429: the provider asks us to slow down."""

    retryable = True


class ServerError(BackendError):
    """HTTP 5xx or 529 from the provider."""

    retryable = True


class CallTimeout(BackendError):
    """One attempt exceeded its deadline."""

    retryable = True


class ConnectionFailed(BackendError):
    """The endpoint could not be reached, or the connection broke mid-response."""

    retryable = True


class ParseError(BackendError):
    """A model reply did not contain one valid object of the expected shape.

    ``excerpt`` holds at most 300 characters of the reply for diagnosis.
    """

    def __init__(self, message: str, *, excerpt: str = "", **context: Unpack[ErrorContext]) -> None:
        self.excerpt = excerpt[:300]
        super().__init__(message, **context)


class EmptyAnswer(BackendError):
    """The model (or agentic CLI) returned no answer at all."""

    retryable = True


class ExecError(BackendError):
    """An agentic CLI exited non-zero or reported an error."""


class ExecTimeout(BackendError):
    """An agentic CLI exceeded its wall-clock limit and was killed."""

    retryable = True


class BudgetExceeded(BackendError):
    """Spend passed the hard budget cap; no further calls are made."""
