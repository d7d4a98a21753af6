"""What a model accepts, by ``price_model`` glob.

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
    (
        "deepseek-reasoner*",
        {
            "reasoning": True,
            "temperature": False,
            "vision": False,
            "structured": "json_object",
            "max_tokens_field": "max_tokens",
            "api": "chat",
        },
    ),
    (
        "deepseek-*",
        {"vision": False, "structured": "json_object", "max_tokens_field": "max_tokens", "api": "chat"},
    ),
    (
        "qwen*",
        {"reasoning": True, "structured": "json_object", "max_tokens_field": "max_tokens", "api": "chat"},
    ),
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


def image_support_problem(backend: str, kind: str, price_model: str | None, options: Mapping[str, Any],
                          overrides: Mapping[str, Any] | None = None) -> str | None:
    """Why a role on ``backend`` cannot take image inputs, or None when it can (checked before any rollout).

    Exec targets take images as attachment files and ``scripted`` as ``[image] <name>`` text; the
    local backend needs ``options.clip_model_path``; ``openai_compatible`` takes images unless the
    role's ``capabilities.vision`` says otherwise; every other chat backend follows the capability
    table of its ``price_model`` (``vision``), which a role's ``capabilities`` may override.
    """
    if kind == "exec" or backend == "scripted":
        return None
    if backend == "local":
        if options.get("clip_model_path"):
            return None
        return "the local backend takes images only with options.clip_model_path (the model's mmproj GGUF)"
    if backend == "openai_compatible":
        vision = bool((overrides or {}).get("vision", True))
    else:
        vision = capabilities_for(price_model, overrides).vision
    if vision:
        return None
    return (f"{price_model or 'this model'} takes no images per the capability table; choose a vision model "
            "or, if it does take images, set capabilities.vision: true for the role")
