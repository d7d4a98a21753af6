"""The records training passes around and writes down.

``ItemResult`` is one rollout's outcome with its trajectory; ``Patch`` is what one optimizer call
proposes; ``StepRecord`` is one line of ``history.jsonl``; ``RunSummary`` is ``summary.json``.
Everything here is a pydantic model, so it serialises to JSON for Prefect's result store and the
run directory alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from skillopt.core.gate import GateResult
from skillopt.skill.document import ApplyReport, Edit

#: A row is a failure when its hard score is below this.
FAILURE_EPSILON = 1e-9

Phase = Literal["done", "timeout", "error"]


class ItemResult(BaseModel):
    """One rollout. ``trajectory`` events are plain dicts (§1.6); the last one
    is always the ``evaluation`` event, the only place gold reaches the optimizer."""

    model_config = ConfigDict(extra="forbid")

    id: str
    task_type: str
    hard: float
    soft: float
    fail_reason: str = ""
    task_description: str = ""
    predicted_answer: str = ""
    trajectory: list[dict[str, Any]] = Field(default_factory=list)
    n_turns: int = 0
    answered: bool = False
    phase: Phase = "done"
    usage: dict[str, Any] = Field(default_factory=dict)
    extras: dict[str, Any] = Field(default_factory=dict)
    #: The target's prompts without the skill, for people reading ``predictions/`` (not for the analyst).
    target_system_prompt: str = ""
    target_user_prompt: str = ""
    #: The process that ran the rollout (the flow's, or a Dask worker's with ``run.task_runner: dask``); a
    #: cached row keeps the pid of the process that first produced it. Never shown to the analyst.
    worker_pid: int | None = None

    @property
    def failed(self) -> bool:
        return self.hard < FAILURE_EPSILON

    @property
    def is_error(self) -> bool:
        """The model call failed after its retries: no evidence about the skill
        (``skillopt.core.error_rows``)."""
        return self.phase == "error"


class Diagnosis(BaseModel):
    """An analyst's explanation of some items: which ids, what kind of problem, in a sentence."""

    ids: list[str] = Field(default_factory=list)
    kind: str = "other"
    description: str = ""


SuggestionType = Literal["add_rule", "remove_rule", "merge_rules", "reorganize", "compress", "clarify"]


class Suggestion(BaseModel):
    """A typed revise suggestion (``rewrite_from_suggestions`` mode), applied later by one rewrite call."""

    type: SuggestionType
    title: str = ""
    motivation: str = ""
    instruction: str = ""
    priority: int = 1
    support_count: int = 1
    source: Literal["failure", "success"] = "failure"


class Patch(BaseModel):
    """What one optimizer call proposes: edits (patch mode), revise suggestions
    (``rewrite_from_suggestions``) or one complete skill (``full_rewrite_minibatch``)."""

    reasoning: str = ""
    edits: list[Edit] = Field(default_factory=list)
    suggestions: list[Suggestion] = Field(default_factory=list)
    skill: str | None = None
    diagnosis: list[Diagnosis] = Field(default_factory=list)
    execution_notes: list[str] = Field(default_factory=list)
    source: Literal["failure", "success"] = "failure"
    #: Number of trajectories this patch was drawn from (the support its edits start with).
    support: int = 0
    merge_level: int = 0
    #: Why this patch is a fallback (a parse failure, a merge that fell back to concatenation), if it is.
    fallback: str | None = None


class StageTiming(BaseModel):
    seconds: float = 0.0
    calls: int = 0


class StepRecord(BaseModel):
    """One line of ``history.jsonl``."""

    step: int
    epoch: int
    step_in_epoch: int
    budget: int
    kind: Literal["step", "slow_update", "final"] = "step"
    decision: str
    batch_ids: list[str] = Field(default_factory=list)
    n_fail: int = 0
    n_total: int = 0
    #: Error rows of the batch (model calls that failed after their retries): neither failures nor
    #: successes, never shown to analysts; ``n_fail`` and the rollout scores leave them out.
    n_error: int = 0
    #: Selection items left out of the gate because they were error rows under either skill.
    gate_error_ids: list[str] = Field(default_factory=list)
    #: Optimizer calls of the step whose reply was used, and those that took their stage's fallback.
    replies_parsed: int = 0
    replies_fallback: int = 0
    rollout_hard: float | None = None
    rollout_soft: float | None = None
    patches_proposed: int = 0
    patches_parsed: int = 0
    edits_proposed: int = 0
    edits_selected: int = 0
    edits_applied: int = 0
    #: The skill files the step's candidate changed (``SKILL.md``, ``references/…``), whatever the gate
    #: decided.
    files_changed: list[str] = Field(default_factory=list)
    #: The edits selected for the update, in the order they were applied.
    edits: list[Edit] = Field(default_factory=list)
    apply_report: ApplyReport | None = None
    #: Rewrite modes: the rewrite call's change summary, and whether protected blocks had to be restored.
    change_summary: list[str] = Field(default_factory=list)
    protected_restored: bool = False
    #: Autonomous budget: the optimizer's decision (learning_rate, reasoning, confidence, risk notes,
    # fallback).
    budget_decision: dict[str, Any] | None = None
    #: Deep probe: the diagnostic instruction and the items it re-ran.
    probe: dict[str, Any] | None = None
    #: Execution notes added to the appendix block after the gate (``optimizer.use_appendix``).
    appendix_notes: list[str] = Field(default_factory=list)
    gate: GateResult | None = None
    current_score: float = 0.0
    best_score: float = 0.0
    skill_sha: str = ""
    skill_chars: int = 0
    warnings: list[str] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)
    wall_s: dict[str, float] = Field(default_factory=dict)


def unusable_streak(history: Sequence[StepRecord]) -> int:
    """How many of the last step records in a row had optimizer replies and not one usable."""
    streak = 0
    for record in reversed([r for r in history if r.kind == "step"]):
        if record.replies_parsed or not record.replies_fallback:
            break
        streak += 1
    return streak


def unusable_replies_warning(parsed: int, fallback: int) -> str | None:
    """A warning when most optimizer replies took their stage's fallback (None otherwise)."""
    total = parsed + fallback
    if not total or fallback * 2 <= total:
        return None
    return (f"most optimizer replies were unusable: {fallback} of {total} took their stage's fallback "
            "(unparseable JSON, or a call that failed for good); the optimizer model may be too small for "
            "the task, its context window too short, or its server misconfigured")


class SplitScores(BaseModel):
    hard: float
    soft: float


class PhaseScores(BaseModel):
    selection: SplitScores | None = None
    test: SplitScores | None = None


class RunSummary(BaseModel):
    """``summary.json``: scores always numeric in this shape."""

    run_name: str
    benchmark: str
    scores: dict[str, PhaseScores]
    counts: dict[str, Any] = Field(default_factory=dict)
    usage: dict[str, Any] = Field(default_factory=dict)
    wall_s: float = 0.0
    stopped_by: str | None = None
    #: Why the run stopped early, e.g. the budget message (None when it ran to the end).
    stopped_message: str | None = None
    best_skill_sha: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    #: What a reader must not miss, e.g. that most optimizer replies were unusable.
    warnings: list[str] = Field(default_factory=list)
    #: Context windows learned during the run, by ``backend|base_url|model``: ``{"tokens", "source"}``.
    context_windows: dict[str, Any] = Field(default_factory=dict)


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` in the right number, for the lines a run prints: "1 step", "2 steps"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
