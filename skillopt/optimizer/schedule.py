"""Edit-budget (learning-rate) schedules: how many edits one training step may apply.

The budget plays the part of a learning rate: step ``s`` (1-based, global across epochs) may apply
at most ``budget(s)`` edits to the skill. The formulas, with
``L_max = optimizer.learning_rate``, ``L_min = optimizer.min_learning_rate``, ``T = total_steps``
and ``t = min(s, T) / T``:

- constant: ``L_max``
- linear:   ``T <= 1 -> L_max``, else ``max(L_min, round(L_max + (L_min - L_max) * t))``
- cosine:   ``T <= 1 -> L_max``, else ``max(L_min, round(L_min + (L_max - L_min) * (1 + cos(pi t)) / 2))``

``round`` is Python's round-half-to-even. A schedule is a pure function of its four fields and the
step number, so its saved state (``state_dict``) is exactly those fields: a resumed run rebuilt
with ``from_state`` serves the same budget for every step a fresh run would.

In autonomous mode (``optimizer.lr_control_mode: autonomous``) the optimizer names the budget
itself; ``clamp_autonomous`` turns its answer into a usable count or a recorded fallback of 0.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from skillopt.core.errors import ConfigError

ScheduleKind = Literal["constant", "linear", "cosine"]

# The configuration key behind each field, so errors name what the user actually wrote.
_CONFIG_KEYS = {
    "kind": "optimizer.lr_scheduler",
    "max_budget": "optimizer.learning_rate",
    "min_budget": "optimizer.min_learning_rate",
    "total_steps": "total_steps (train.epochs x steps per epoch)",
}

# An autonomous answer given as text is accepted only when it is a plain decimal integer.
# (At most 18 digits: enough for any budget, and int() refuses very long digit strings.)
_INT_TEXT = re.compile(r"[+-]?\d{1,18}")


class EditBudgetSchedule(BaseModel):
    """The edit budget of every training step.

    Construct it with ``from_config`` (from the config values), ``from_state`` (from a saved
    ``state_dict``) or directly; every route raises ``ConfigError`` naming the configuration key
    when a value is out of range (negative budgets, ``min_budget > max_budget``, ``total_steps < 1``,
    an unknown kind). The model is frozen: a schedule never changes during a run.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ScheduleKind
    max_budget: int = Field(ge=0, strict=True, description="L_max = optimizer.learning_rate")
    min_budget: int = Field(ge=0, strict=True, description="L_min = optimizer.min_learning_rate")
    total_steps: int = Field(ge=1, strict=True, description="T = epochs x steps per epoch")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None

    @model_validator(mode="after")
    def _min_not_above_max(self) -> EditBudgetSchedule:
        if self.min_budget > self.max_budget:
            raise ValueError(
                f"optimizer.min_learning_rate ({self.min_budget}) must be <= "
                f"optimizer.learning_rate ({self.max_budget})"
            )
        return self

    @classmethod
    def from_config(
        cls, lr_scheduler: str, learning_rate: int, min_learning_rate: int, total_steps: int
    ) -> EditBudgetSchedule:
        """Build the schedule from ``optimizer.lr_scheduler``, ``optimizer.learning_rate``,
        ``optimizer.min_learning_rate`` and the run's total number of steps."""
        return cls(
            kind=lr_scheduler,
            max_budget=learning_rate,
            min_budget=min_learning_rate,
            total_steps=total_steps,
        )

    def state_dict(self) -> dict[str, Any]:
        """The JSON-ready state that ``from_state`` restores; it fully determines every budget."""
        return self.model_dump(mode="json")

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> EditBudgetSchedule:
        """Rebuild a schedule saved with ``state_dict``; a missing or unknown key is a ConfigError."""
        if not isinstance(state, dict):
            raise ConfigError(f"schedule state must be a mapping, got {type(state).__name__}")
        return cls(**state)

    def budget(self, step: int) -> int:
        """The edit budget of global step ``step`` (1-based). Steps past ``total_steps`` keep the
        final budget. ``step < 1`` is a ValueError, a non-integer step a TypeError."""
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int, got {type(step).__name__}")
        if step < 1:
            raise ValueError(f"step is 1-based, got {step}")
        if self.kind == "constant" or self.total_steps <= 1:
            return self.max_budget
        t = min(step, self.total_steps) / self.total_steps
        high, low = self.max_budget, self.min_budget
        if self.kind == "linear":
            value = round(high + (low - high) * t)
        else:
            value = round(low + (high - low) * (1 + math.cos(math.pi * t)) / 2)
        return max(low, value)

    def budgets(self) -> list[int]:
        """The budget of every step, ``[budget(1), ..., budget(total_steps)]``."""
        return [self.budget(step) for step in range(1, self.total_steps + 1)]

    def summary(self) -> dict[int, int]:
        """How many steps get each budget value, largest budget first (e.g. ``{4: 13, 3: 13, 2: 14}``)."""
        counts = Counter(self.budgets())
        return {value: counts[value] for value in sorted(counts, reverse=True)}


class AutonomousBudget(BaseModel):
    """The edit budget of one autonomous step, after clamping the optimizer's answer.

    ``fallback`` is None when the answer was usable (even if it had to be clamped) and otherwise
    says why the step falls back to 0 edits. ``requested`` is the integer the optimizer asked for,
    when it gave one.
    """

    model_config = ConfigDict(frozen=True)

    budget: int = Field(ge=0)
    fallback: str | None = None
    requested: int | None = None


def clamp_autonomous(requested: object, available: int) -> AutonomousBudget:
    """Turn the optimizer's ``learning_rate`` answer into a budget in ``[0, available]``.

    Usable answers: an int (not a bool), an integer-valued finite float such as ``3.0``, or a
    string holding a plain decimal integer such as ``"3"`` or ``" 3 "`` (models often quote numbers
    in JSON; there is no ambiguity in what they meant). Anything else — None, a bool, ``3.5``,
    NaN, ``"three"``, ``"3 edits"``, a list — gives budget 0 with the reason in ``fallback``; this
    function never raises for a bad answer. ``available < 0`` is a programming error (ValueError).
    """
    if isinstance(available, bool) or not isinstance(available, int) or available < 0:
        raise ValueError(f"available must be an int >= 0, got {available!r}")
    value = _as_int(requested)
    if value is None:
        return AutonomousBudget(budget=0, fallback=_unusable_reason(requested))
    return AutonomousBudget(budget=min(max(value, 0), available), requested=value)


def _as_int(answer: object) -> int | None:
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return answer
    if isinstance(answer, float):
        return int(answer) if math.isfinite(answer) and answer.is_integer() else None
    if isinstance(answer, str) and _INT_TEXT.fullmatch(answer.strip()):
        return int(answer.strip())
    return None


def _unusable_reason(answer: object) -> str:
    if answer is None:
        return "autonomous budget: no learning_rate in the optimizer's answer; applying 0 edits"
    if isinstance(answer, float | str):
        # Show short answers so the record says what came back; never echo long free text.
        shown = repr(answer)
        if len(shown) > 40:
            shown = f"(a {len(shown)}-character answer)"
        return f"autonomous budget: learning_rate {shown} is not an integer; applying 0 edits"
    return (
        f"autonomous budget: learning_rate of type {type(answer).__name__} is not an integer; "
        "applying 0 edits"
    )


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        field = str(error["loc"][0]) if error["loc"] else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        if field in _CONFIG_KEYS:
            message = f"{_CONFIG_KEYS[field]}: {message}"
        elif error["type"] == "extra_forbidden":
            message = f"unknown schedule key {field!r}"
        problems.append(message)
    return "invalid edit-budget schedule: " + "; ".join(problems)
