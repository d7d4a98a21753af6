"""One structured optimizer call for a training stage, with the stage's recorded fallback.

Every optimizer stage (analyst, merge, ranking, autonomous budget, rewrite, deep probe, slow update, meta
skill) asks for one JSON object and has a fallback for when no usable object comes back. The client
already re-asks once on a bad reply (``RoleClient.structured``); what still fails lands here:

- a reply that stays unparseable, and any other failure of *this* call that trying again would not fix
  (a request the provider refuses, a context overflow that the client could not shrink away), become the
  stage's fallback with the reason recorded — one bad call never stops the run;
- failures of the whole run raise: retryable errors that outlasted the retries (an outage), missing or
  refused credentials, an unknown model, an exhausted budget. Falling back on those would turn an outage
  into a run of silent fallbacks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from skillopt.llm.chat import ChatRequest
from skillopt.llm.clients import RequestBuilder
from skillopt.llm.errors import (
    AuthError,
    BackendError,
    BudgetExceeded,
    ModelNotFound,
    ParseError,
    PermissionDenied,
)

M = TypeVar("M")
F = TypeVar("F")

#: Non-retryable errors that every later call would hit too: they stop the run instead of falling back.
RUN_LEVEL_ERRORS: tuple[type[BackendError], ...] = (AuthError, PermissionDenied, ModelNotFound,
                                                    BudgetExceeded)


def structured_or_fallback(client: Any, request: ChatRequest | RequestBuilder, schema: type[M], *,
                           fallback: Callable[[str], F]) -> M | F:
    """``client.structured(request, schema)``'s validated reply (``request`` may be a builder that sizes the
    request to the optimizer's context window, see ``RoleClient.structured``), or ``fallback(reason)`` when
    this call failed in a way only this call is affected by (see the module docstring); other failures
    raise."""
    try:
        reply, _ = client.structured(request, schema)
    except ParseError as error:
        return fallback(error.reason)
    except BackendError as error:
        if error.retryable or isinstance(error, RUN_LEVEL_ERRORS):
            raise
        return fallback(str(error))
    return reply
