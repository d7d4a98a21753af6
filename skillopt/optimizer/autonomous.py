"""The autonomous edit budget: the optimizer decides how many edits to apply.

With ``optimizer.lr_control_mode: autonomous`` the scheduler's budget is replaced, step by step,
by one ``lr`` call: ``budget_request`` shows the optimizer the step's evidence (scores, the
proposed edits or revise suggestions, the step buffer, the meta skill) and asks for
``{learning_rate, reasoning, confidence, risk_notes}``; ``decide_budget`` clamps the answer to
``[0, available]`` (``schedule.clamp_autonomous``) and returns the ``StepRecord.budget_decision``
record. A failed call (None) means 0 edits with a recorded fallback. The user message::

    ## Current skill
    <skill, or "(empty)">

    ## Step scores
    Selection score: current 0.500, best 0.583
    This step's rollout: hard 0.250, soft 0.610; 6 of 8 items failed

    ## Step buffer                 (only when not empty)
    <StepBuffer.format()>

    ## Optimizer memory            (only when there is a meta skill)
    <meta skill>

    ## Proposed edits (available = N)          (or "Proposed suggestions" in rewrite mode)
    [0] {"op": ..., "target": ..., "content": ..., "support_count": ..., "source": ...}
    [1] {...}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skillopt.core.prompts import ReplyModel, optimizer_prompt
from skillopt.core.records import Suggestion
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.optimizer.reflect import current_skill_section
from skillopt.optimizer.rewrite import format_suggestion_line
from skillopt.optimizer.schedule import clamp_autonomous
from skillopt.optimizer.select import format_pool_line
from skillopt.skill.document import Edit

Confidence = Literal["low", "medium", "high"]


class StepScores(BaseModel):
    """The scores the budget call reads; the names are ``StepRecord``'s."""

    model_config = ConfigDict(extra="forbid")

    #: The current and the best skill's gate score on the selection split.
    current_score: float
    best_score: float
    #: This step's training rollout (None when unknown).
    rollout_hard: float | None = None
    rollout_soft: float | None = None
    n_fail: int = Field(default=0, ge=0)
    n_total: int = Field(default=0, ge=0)


def format_step_scores(scores: StepScores) -> str:
    """Two lines: the selection scores, and this step's rollout with its failure count."""

    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    return (f"Selection score: current {shown(scores.current_score)}, best {shown(scores.best_score)}\n"
            f"This step's rollout: hard {shown(scores.rollout_hard)}, soft {shown(scores.rollout_soft)}; "
            f"{scores.n_fail} of {scores.n_total} items failed")


def format_budget_message(
    *,
    skill: str,
    step_scores: StepScores,
    pool: Sequence[Edit | Suggestion],
    available: int,
    step_buffer: str = "",
    meta_skill: str = "",
) -> str:
    """The budget user message (format in the module docstring); pool lines numbered from 0."""
    sections = [current_skill_section(skill),
                f"## Step scores\n{format_step_scores(step_scores)}"]
    if step_buffer.strip():
        sections.append(f"## Step buffer\n{step_buffer.strip()}")
    if meta_skill.strip():
        sections.append(f"## Optimizer memory\n{meta_skill.strip()}")
    lines = [format_suggestion_line(i, item) if isinstance(item, Suggestion) else format_pool_line(i, item)
             for i, item in enumerate(pool)]
    what = "suggestions" if any(isinstance(item, Suggestion) for item in pool) else "edits"
    listing = "\n".join(lines) if lines else "(none)"
    sections.append(f"## Proposed {what} (available = {available})\n{listing}")
    return "\n\n".join(sections) + "\n"


def budget_request(
    *,
    skill: str,
    step_scores: Mapping[str, Any] | StepScores,
    pool: Sequence[Edit | Suggestion],
    available: int,
    step_buffer: str = "",
    meta_skill: str = "",
) -> ChatRequest:
    """The autonomous budget call: stage ``lr``, tags ``{"available", "n_pool"}``.

    ``step_scores`` holds ``current_score``, ``best_score`` and optionally ``rollout_hard``,
    ``rollout_soft``, ``n_fail``, ``n_total`` (an unknown key is a ``ValidationError``).
    ``available`` is the most the optimizer may choose (usually ``len(pool)``). Raises
    ``ValueError`` for a negative ``available``.
    """
    if available < 0:
        raise ValueError(f"available must be >= 0, got {available}")
    scores = StepScores.model_validate(
        step_scores if isinstance(step_scores, StepScores) else dict(step_scores)
    )
    message = format_budget_message(skill=skill, step_scores=scores, pool=pool, available=available,
                                    step_buffer=step_buffer, meta_skill=meta_skill)
    return ChatRequest(
        messages=[system(optimizer_prompt("autonomous_budget") + "\n"), user(message)],
        stage="lr",
        tags={"available": available, "n_pool": len(pool)},
    )


class BudgetReply(ReplyModel):
    """``{"learning_rate": int, "reasoning": str, "confidence": "low"|"medium"|"high", "risk_notes": [str]}``
    (§4.11).

    A bool is not a number of edits; ``"3"`` and ``3.0`` read as 3; confidence is read
    case-insensitively; a single string ``risk_notes`` is one note.
    """

    learning_rate: int
    reasoning: str = ""
    confidence: Confidence = "low"
    risk_notes: list[str] = Field(default_factory=list)

    @field_validator("learning_rate", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("learning_rate must be an integer number of edits, not a boolean")
        return value

    @field_validator("confidence", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("risk_notes", mode="before")
    @classmethod
    def _one_note_is_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


def decide_budget(reply: BudgetReply | None, available: int) -> dict[str, Any]:
    """The step's edit budget and the record ``StepRecord.budget_decision`` keeps.

    Keys: ``learning_rate`` (the budget to apply, in ``[0, available]``), ``requested`` (what the
    optimizer asked for, None without an answer), ``available``, ``reasoning``, ``confidence``
    (None without an answer), ``risk_notes`` and ``fallback`` (None for a usable answer, even a
    clamped one; otherwise why the step applies 0 edits). Raises ``ValueError`` for a negative
    ``available``.
    """
    if available < 0:
        raise ValueError(f"available must be >= 0, got {available}")
    if reply is None:
        return {"learning_rate": 0, "requested": None, "available": available, "reasoning": "",
                "confidence": None, "risk_notes": [],
                "fallback": "autonomous budget: the optimizer gave no usable answer; applying 0 edits"}
    budget = clamp_autonomous(reply.learning_rate, available)
    return {
        "learning_rate": budget.budget,
        "requested": budget.requested,
        "available": available,
        "reasoning": reply.reasoning.strip(),
        "confidence": reply.confidence,
        "risk_notes": [note.strip() for note in reply.risk_notes if note.strip()],
        "fallback": budget.fallback,
    }
