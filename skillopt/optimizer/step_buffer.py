"""The step buffer: what earlier steps of this epoch found and tried.

After every gated step the flow adds one ``StepBufferEntry``: the decision, the failure counts,
the failure patterns (failed rows grouped by the analysts' diagnoses, by item id) and, when the
step was rejected, the rejected edits with the scores before and after. ``StepBuffer.format()``
is the text analysts (and the autonomous-budget and rewrite calls) read under ``## Step buffer``.
The flow starts a new buffer at each epoch and rebuilds it by adding the same entries on resume.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, Field

from skillopt.core.records import Diagnosis, ItemResult
from skillopt.optimizer.trajectory import one_line
from skillopt.skill.document import Edit
from skillopt.skill.files import SKILL_MD

#: Kind of the pattern that collects failed rows no analyst diagnosis named.
UNDIAGNOSED = "undiagnosed"

# Keep the buffer readable as an epoch grows: it is context for analysts, not a log.
_PATTERNS_PER_STEP = 6
_TEXT_CHARS = 240


class FailurePattern(BaseModel):
    """Failed items that the analysts explained the same way."""

    kind: str
    description: str = ""
    ids: list[str] = Field(default_factory=list)


class StepBufferEntry(BaseModel):
    step: int
    decision: str
    n_fail: int
    n_total: int
    failure_patterns: list[FailurePattern] = Field(default_factory=list)
    rejected_edits: list[Edit] = Field(default_factory=list)
    score_before: float | None = None
    score_after: float | None = None


def failure_patterns(rows: Sequence[ItemResult], diagnoses: Iterable[Diagnosis]) -> list[FailurePattern]:
    """The failed ``rows`` grouped by the analysts' diagnoses, matched by item id (not position).

    Diagnoses with the same kind and description (whitespace-stripped) form one pattern whose ids
    are the failed rows they name, sorted; ids of solved or unknown rows are ignored, and a pattern
    left with no id is dropped. Failed rows no diagnosis names form a last ``undiagnosed`` pattern.
    Error rows are not failures and appear in no pattern.
    Patterns are ordered by how many items they explain, then kind and description.
    """
    failed = {row.id for row in rows if row.failed and not row.is_error}
    grouped: dict[tuple[str, str], set[str]] = {}
    for diagnosis in diagnoses:
        ids = failed.intersection(diagnosis.ids)
        if ids:
            key = (diagnosis.kind.strip() or "other", diagnosis.description.strip())
            grouped.setdefault(key, set()).update(ids)
    patterns = [
        FailurePattern(kind=kind, description=description, ids=sorted(ids))
        for (kind, description), ids in sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]
    explained = set().union(*grouped.values()) if grouped else set()
    if failed - explained:
        patterns.append(
            FailurePattern(
                kind=UNDIAGNOSED,
                description="no analyst diagnosis names these failures",
                ids=sorted(failed - explained),
            )
        )
    return patterns


def _short(text: str) -> str:
    text = one_line(text)
    return text if len(text) <= _TEXT_CHARS else text[: _TEXT_CHARS - 1] + "…"


def _score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def format_edit(edit: Edit) -> str:
    """One edit on one line for the buffer: op, then the quoted target (if any) and content, shortened."""
    parts = [edit.op] + ([f'file "{edit.file}"'] if edit.file != SKILL_MD else [])
    if edit.target:
        parts.append(f'target "{_short(edit.target)}"')
    if edit.content:
        parts.append(f'content "{_short(edit.content)}"')
    return " ".join(parts)


class StepBuffer(BaseModel):
    """The entries of this epoch's gated steps, oldest first."""

    entries: list[StepBufferEntry] = Field(default_factory=list)

    def add(self, entry: StepBufferEntry) -> None:
        """Append ``entry`` (one per gated step, in step order)."""
        self.entries.append(entry)

    def format(self) -> str:
        """The buffer as analysts read it; ``""`` when empty.

        An instruction line (do not repeat rejected ideas, prioritise unsolved patterns), one
        paragraph per step (decision, failures, patterns with their ids, rejected edits with the
        scores before and after), and the failure kinds seen in more than one step.
        """
        if not self.entries:
            return ""
        lines = [
            "Earlier steps of this epoch, oldest first. Do not re-propose a rejected edit, in any "
            "wording, unless you change what made it fail. Prioritise failure patterns that are still "
            "unsolved: a kind that recurs across steps has not been fixed by the edits so far."
        ]
        for entry in self.entries:
            lines.append("")
            lines.append(f"Step {entry.step}: {entry.decision} ({entry.n_fail}/{entry.n_total} failed)")
            for pattern in entry.failure_patterns[:_PATTERNS_PER_STEP]:
                ids = ", ".join(pattern.ids)
                description = f" {_short(pattern.description)}" if pattern.description else ""
                lines.append(f"- pattern [{pattern.kind}]{description} (ids: {ids})")
            hidden = len(entry.failure_patterns) - _PATTERNS_PER_STEP
            if hidden > 0:
                lines.append(f"- … {hidden} smaller patterns")
            if entry.rejected_edits:
                scores = f"score {_score(entry.score_before)} -> {_score(entry.score_after)}"
                lines.append(f"- rejected edits ({scores}):")
                lines.extend(f"  - {format_edit(edit)}" for edit in entry.rejected_edits)
        steps_of_kind = Counter(
            kind
            for entry in self.entries
            for kind in {p.kind for p in entry.failure_patterns}
            if kind != UNDIAGNOSED
        )
        recurring = [
            f"{kind} ({n} steps)"
            for kind, n in sorted(steps_of_kind.items(), key=lambda kv: (-kv[1], kv[0]))
            if n > 1
        ]
        if recurring:
            lines.append("")
            lines.append("Recurring failure kinds: " + ", ".join(recurring))
        return "\n".join(lines)
