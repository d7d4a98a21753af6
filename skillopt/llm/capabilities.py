"""What a model accepts, by ``price_model`` glob (BACKENDS.md §2.3).

A parameter the model cannot take is left out and warned about once per role; with
``strict_params: true`` it is a ``ConfigError`` instead. A role's ``capabilities`` mapping extends or
overrides the shipped table for that role.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class Capabilities(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reasoning: bool = False
    temperature: bool = True
    vision: bool = True
    structured: Literal["json_schema", "json_object", "none"] = "json_schema"
    max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = "max_completion_tokens"
    api: Literal["responses", "chat"] = "responses"


_REASONING = {"reasoning": True, "temperature": False}

#: First match wins; the last entry catches everything.
SHIPPED_TABLE: tuple[tuple[str, Mapping[str, Any]], ...] = (
    ("o1*", _REASONING),
    ("o3*", _REASONING),
    ("o4*", _REASONING),
    ("gpt-5*", _REASONING),
    ("gpt-4.1*", {}),
    ("gpt-4o*", {}),
    ("gpt-3.5*", {"vision": False, "api": "chat"}),
    ("claude-*", {"reasoning": True}),
    ("deepseek-reasoner*", {"reasoning": True, "temperature": False, "vision": False, "structured": "json_object",
                            "max_tokens_field": "max_tokens", "api": "chat"}),
    ("deepseek-*", {"vision": False, "structured": "json_object", "max_tokens_field": "max_tokens", "api": "chat"}),
    ("qwen*", {"reasoning": True, "structured": "json_object", "max_tokens_field": "max_tokens", "api": "chat"}),
    ("*", {}),
)


def capabilities_for(price_model: str | None, overrides: Mapping[str, Any] | None = None) -> Capabilities:
    """The shipped capabilities of ``price_model``, with the role's ``capabilities`` applied on top."""
    name = (price_model or "").lower()
    base: Mapping[str, Any] = {}
    for pattern, values in SHIPPED_TABLE:
        if fnmatch.fnmatchcase(name, pattern):
            base = values
            break
    return Capabilities.model_validate({**base, **(overrides or {})})
