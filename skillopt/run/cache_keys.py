"""The content keys of skillopt's caches, with no Prefect in sight.

``call_key`` names a model call by its request (``ChatRequest.cache_key``: every prompt text, images by
content, the role's identity and sampling parameters, the response schema, the tags); ``content_key``
hashes a pure computation's inputs with the package version; ``digest`` is the short hash both build on.
The task layer (``skillopt.tasks.cache``) uses them as Prefect cache keys, the prefetch layer
(``skillopt.run.prefetch``) to skip the rollouts the task cache already holds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from skillopt import __version__
from skillopt.llm.chat import ChatRequest


def content_key(label: str, /, **parts: Any) -> str:
    """``skillopt-<label>-<sha256 of the parts>``; parts are JSON-serialised with sorted keys."""
    payload = json.dumps({"version": __version__, **parts}, sort_keys=True, default=_default,
                         ensure_ascii=False)
    return f"skillopt-{label}-{hashlib.sha256(payload.encode('utf-8')).hexdigest()[:40]}"


def call_key(role_fingerprint: str, request: ChatRequest, schema: type[BaseModel] | None = None) -> str:
    """``skillopt-<stage>-<request.cache_key(role_fingerprint)>``, with the response schema the call asks for
    (``RoleClient.structured`` sets it), so the key names the reply store file of the task's first call."""
    if schema is not None:
        request = request.model_copy(update={"response_schema": schema})
    return f"skillopt-{request.stage}-{request.cache_key(role_fingerprint)}"


def digest(value: Any) -> str:
    """A short hash of any JSON-able value (pydantic models included)."""
    payload = json.dumps(value, sort_keys=True, default=_default, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:24]


def _default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot hash a {type(value).__name__} into a cache key")
