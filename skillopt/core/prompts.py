"""The optimizer's side of a model call: prompt templates in, reply models out.

Templates are markdown files in ``prompts/optimizer/``; each holds one stage's instructions and
its exact JSON output keys and becomes the system message of that stage's call (the evidence
goes in the user message). Benchmarks add their own analyst guidance from
``prompts/benchmarks/<id>/``, appended by ``reflect``. A template reaches cache keys as part of the
rendered request (``ChatRequest.cache_key``). Every stage's reply model derives from ``ReplyModel``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from skillopt.core.resources import load_prompt

#: Every optimizer template, as ``load_prompt`` names it.
OPTIMIZER_PROMPTS: tuple[str, ...] = (
    "optimizer/analyst_failure",
    "optimizer/analyst_success",
    "optimizer/analyst_execution_notes",
    "optimizer/merge",
    "optimizer/merge_final",
    "optimizer/ranking",
    "optimizer/analyst_suggestions",
    "optimizer/analyst_full_rewrite",
    "optimizer/merge_suggestions",
    "optimizer/merge_skills",
    "optimizer/ranking_suggestions",
    "optimizer/rewrite",
    "optimizer/autonomous_budget",
    "optimizer/deep_probe",
    "optimizer/slow_update",
    "optimizer/meta_skill",
)


def optimizer_prompt(name: str) -> str:
    """The text of the optimizer template ``name`` (``"merge"`` reads ``prompts/optimizer/merge.md``)."""
    return load_prompt(f"optimizer/{name}").strip()


class ReplyModel(BaseModel):
    """Base of the optimizer reply models: unknown keys are ignored, and ``null`` for a field that
    has a default means the default (strict structured output makes every optional key nullable,
    see ``json_extract.strict_json_schema``)."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        optional = {name for name, field in cls.model_fields.items() if not field.is_required()}
        return {key: value for key, value in data.items() if value is not None or key not in optional}
