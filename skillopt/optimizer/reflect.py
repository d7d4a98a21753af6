"""Reflect: the analyst calls of one step (patch mode).

Failures and successes are shuffled and cut into minibatches (``split_and_batch``); each
minibatch becomes one analyst request (``analyst_request``); the flow sends it with
``client.structured(request, AnalystReply)`` and turns the validated reply into a ``Patch``
(``patch_from_reply``), or, when the call failed after its one re-ask, records
``analyst_fallback``. Nothing here calls a model.

The user message, section by section (a section other than the first three appears only when
it has text; ``rewrite`` reuses this message for the rewrite-mode analysts, with ``## Suggestion
budget`` / "at most L suggestions" or no budget section at all, and ``probe`` for the deep probe)::

    ## Current skill
    <skill, or "(empty)">

    ## Edit budget
    You may propose at most L edits.

    ## Step buffer
    <StepBuffer.format()>

    ## Optimizer memory
    <meta skill>

    ## Trajectories
    <format_trajectory block 1>

    <format_trajectory block 2> ...

The trajectories share the room the prompt size leaves (``trajectory.fit_trajectories``): whole
when they fit, else with the middles of their longest fields elided.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from skillopt.core.error_rows import answered_rows
from skillopt.core.errors import SkillFormatError
from skillopt.core.prompts import ReplyModel, optimizer_prompt
from skillopt.core.records import Diagnosis, ItemResult, Patch
from skillopt.llm.chat import ChatRequest, Message, Stage, TextPart, system, user
from skillopt.optimizer.trajectory import fit_trajectories
from skillopt.skill.document import Edit, OpText, SkillDocument
from skillopt.skill.files import SKILL_MD, split_files

Kind = Literal["failure", "success"]
BudgetUnit = Literal["edits", "suggestions"]

#: The heading of the budget section, by what the budget counts.
BUDGET_HEADINGS: dict[str, str] = {"edits": "Edit budget", "suggestions": "Suggestion budget"}


def with_item_images(request: ChatRequest, rows: Sequence[ItemResult], images_of: Mapping[str, Sequence[Any]],
                     *, detail: str | None = None) -> ChatRequest:
    """``request`` with the images of each row's item after its user text (``optimizer.analyst_images``).

    Each item's images follow a line naming its trajectory number and id, so the analyst can tell
    which trajectory a picture belongs to; rows without images add nothing.
    """
    from skillopt.benchmarks.images import image_part

    parts: list[Any] = []
    for index, row in enumerate(rows, start=1):
        paths = list(images_of.get(row.id) or [])
        if paths:
            parts.append(TextPart(text=f"Images of trajectory {index} (item {row.id}):"))
            parts += [image_part(path, detail) for path in paths]
    if not parts:
        return request
    *head, last = request.messages
    body = [TextPart(text=last.content)] if isinstance(last.content, str) else list(last.content)
    return request.model_copy(update={"messages": [*head, Message(role=last.role, content=[*body, *parts])]})


# --------------------------------------------------------------------------------------------------
# Minibatches


def minibatches(rows: Sequence[ItemResult], *, size: int, seed: int) -> list[list[ItemResult]]:
    """A copy of ``rows`` shuffled with ``random.Random(seed)``, cut into chunks of ``size`` (the
    last may be shorter); ``[]`` for no rows. Raises ``ValueError`` for ``size < 1``."""
    if size < 1:
        raise ValueError(f"minibatch size must be at least 1, got {size}")
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    return [shuffled[start : start + size] for start in range(0, len(shuffled), size)]


def split_and_batch(
    rows: Sequence[ItemResult], *, size: int, seed: int, failure_only: bool
) -> tuple[list[list[ItemResult]], list[list[ItemResult]]]:
    """``(failure minibatches, success minibatches)`` of one batch's rows.

    Error rows (a model call that failed after its retries) are neither: they are left out.
    Failures (``hard < 1e-9``) are shuffled with ``seed``, successes with ``seed + 1``; the input
    order is the batch order, so the result depends only on the rows and the seed. With
    ``failure_only`` there are no success minibatches.
    """
    rows = answered_rows(rows)
    failures = [row for row in rows if row.failed]
    successes = [] if failure_only else [row for row in rows if not row.failed]
    return minibatches(failures, size=size, seed=seed), minibatches(successes, size=size, seed=seed + 1)


# --------------------------------------------------------------------------------------------------
# The request


def format_budget(budget: int, unit: BudgetUnit = "edits") -> str:
    """The budget sentence analysts read: ``You may propose at most L edits.`` (or ``suggestions``)."""
    return f"You may propose at most {budget} {unit}."


def current_skill_section(skill: str) -> str:
    """``## Current skill`` and the skill; for a skill of several files, then ``## Skill files``: the file
    tree (each file's size) and how an edit names the file it changes."""
    section = f"## Current skill\n{skill_or_empty(skill)}"
    try:
        files = split_files(SkillDocument.parse(skill).body)
    except SkillFormatError:
        return section
    if len(files) < 2:
        return section
    tree = "\n".join(f"- {path} ({len(text)} characters)" for path, text in files.items())
    return (f"{section}\n\n## Skill files\n{tree}\nEach file after SKILL.md starts at its "
            "`<!-- FILE: <path> -->` line; SKILL.md is the text before the first such line. Every edit works "
            'inside one file: give its path in the edit\'s "file" field (omitted = SKILL.md); its target '
            "must be in that file, and an append goes to that file's end. Keep the marker lines and "
            "SKILL.md's front matter as they are.")


def skill_or_empty(skill: str) -> str:
    """The skill as a prompt section shows it: its text without surrounding blank lines, or ``(empty)``."""
    text = skill.strip("\n")
    return text if text.strip() else "(empty)"


def format_analyst_message(
    *,
    skill: str,
    budget: int | None,
    rows: Sequence[ItemResult],
    step_buffer: str = "",
    meta_skill: str = "",
    message_chars: int | None = None,
    trajectory_chars: int | None = None,
    budget_unit: BudgetUnit = "edits",
) -> str:
    """The analyst's user message (format in the module docstring); trajectories numbered from 1.

    ``budget_unit`` names the budget section (``## Edit budget`` / ``## Suggestion budget``) and its
    sentence; ``budget`` None leaves the section out (full rewrites and the deep probe have none).
    The trajectories share what ``message_chars`` leaves after the other sections (None: no limit),
    each at most ``trajectory_chars`` (``trajectory.fit_trajectories``); the last ones are left out,
    with a line saying so, when even their headers would not fit (a small context window).
    """
    sections = [current_skill_section(skill)]
    if budget is not None:
        sections.append(f"## {BUDGET_HEADINGS[budget_unit]}\n{format_budget(budget, budget_unit)}")
    if step_buffer.strip():
        sections.append(f"## Step buffer\n{step_buffer.strip()}")
    if meta_skill.strip():
        sections.append(f"## Optimizer memory\n{meta_skill.strip()}")
    heading = "## Trajectories\n"
    room = room_left(message_chars, "\n\n".join(sections), "\n\n", heading, "\n")
    blocks = fit_trajectories(rows, budget_chars=room, per_trajectory_chars=trajectory_chars,
                              drop_to_fit=True)
    sections.append(heading + ("\n\n".join(blocks) if blocks else "(none)"))
    return "\n\n".join(sections) + "\n"


def room_left(total_chars: int | None, *taken: str) -> int | None:
    """What ``total_chars`` leaves after the ``taken`` texts (None stays None: no limit)."""
    return None if total_chars is None else max(0, total_chars - sum(len(text) for text in taken))


def analyst_system_prompt(
    *, kind: Kind, benchmark_guidance: str = "", use_appendix: bool = False, template: str | None = None
) -> str:
    """The analyst's instructions and output keys: ``template`` (by default the ``analyst_<kind>``
    template), then (failure analysts with ``use_appendix``) the execution-notes instructions, then
    the benchmark's guidance under ``## Benchmark guidance``."""
    parts = [optimizer_prompt(f"analyst_{kind}") if template is None else template]
    if use_appendix and kind == "failure":
        parts.append(optimizer_prompt("analyst_execution_notes"))
    if benchmark_guidance.strip():
        parts.append(f"## Benchmark guidance\n{benchmark_guidance.strip()}")
    return "\n\n".join(parts) + "\n"


def analyst_request(
    *,
    kind: Kind,
    skill: str,
    budget: int,
    rows: Sequence[ItemResult],
    step_buffer: str = "",
    meta_skill: str = "",
    benchmark_guidance: str = "",
    use_appendix: bool = False,
    prompt_chars: int | None = None,
    trajectory_chars: int | None = None,
) -> ChatRequest:
    """One analyst call on one minibatch: stage ``analyst``, tags ``{"kind", "item_ids"}``.

    ``rows`` must be train rows (the flow guarantees it). Success analysts never get the
    execution-notes instructions. The whole prompt stays within ``prompt_chars`` where shortening
    the trajectories can make it (None: whole trajectories), each trajectory within
    ``trajectory_chars``. Raises ``ValueError`` for a negative budget.
    """
    if budget < 0:
        raise ValueError(f"edit budget must be >= 0, got {budget}")
    instructions = analyst_system_prompt(
        kind=kind, benchmark_guidance=benchmark_guidance, use_appendix=use_appendix
    )
    return analyst_chat_request(
        instructions,
        stage="analyst",
        tags={"kind": kind},
        skill=skill,
        budget=budget,
        rows=rows,
        step_buffer=step_buffer,
        meta_skill=meta_skill,
        prompt_chars=prompt_chars,
        trajectory_chars=trajectory_chars,
    )


def analyst_chat_request(
    instructions: str,
    *,
    stage: Stage,
    tags: Mapping[str, Any],
    skill: str,
    budget: int | None,
    rows: Sequence[ItemResult],
    step_buffer: str,
    meta_skill: str,
    prompt_chars: int | None,
    trajectory_chars: int | None,
    budget_unit: BudgetUnit = "edits",
) -> ChatRequest:
    """``instructions`` as the system message and the analyst's user message
    (``format_analyst_message``) sized to what they leave of ``prompt_chars``; ``tags`` gain the
    rows' ``item_ids``. The patch and rewrite analysts and the deep probe all ask this way."""
    message = format_analyst_message(
        skill=skill,
        budget=budget,
        rows=rows,
        step_buffer=step_buffer,
        meta_skill=meta_skill,
        message_chars=room_left(prompt_chars, instructions),
        trajectory_chars=trajectory_chars,
        budget_unit=budget_unit,
    )
    return ChatRequest(
        messages=[system(instructions), user(message)],
        stage=stage,
        tags={**tags, "item_ids": [row.id for row in rows]},
    )


# --------------------------------------------------------------------------------------------------
# The reply


class EditReply(ReplyModel):
    """One edit as an analyst writes it; ``op`` (and ``file``) are checked when the edit is applied."""

    op: OpText
    target: str = ""
    content: str = ""
    file: str | None = None


class DiagnosisReply(ReplyModel):
    """One failure pattern (or, from success analysts, ``kind: success_pattern``) and its item ids."""

    ids: list[str] = Field(default_factory=list)
    kind: str = "other"
    description: str = ""

    @field_validator("ids", mode="before")
    @classmethod
    def _ids_as_strings(cls, value: Any) -> Any:
        # Models write numeric ids as numbers and a single id as a bare string.
        if isinstance(value, str | int):
            value = [value]
        if isinstance(value, list):
            return [str(item) for item in value if item is not None]
        return value


class PatchReply(ReplyModel):
    reasoning: str = ""
    edits: list[EditReply]


class AnalystReply(ReplyModel):
    """``{"diagnosis": [...], "patch": {"reasoning", "edits"}, "execution_notes": [...]}`` (§4.11)."""

    diagnosis: list[DiagnosisReply]
    patch: PatchReply
    execution_notes: list[str] = Field(default_factory=list)


def normalise_id(text: str) -> str:
    """An item id as a model may quote it (`` `q-1` ``, ``"q-1"``) reduced to the id itself."""
    return text.strip().strip("`'\"").strip()


def patch_from_reply(reply: AnalystReply, *, kind: Kind, rows: Sequence[ItemResult], budget: int) -> Patch:
    """The ``Patch`` one analyst reply proposes.

    - edits: the first ``budget`` edits in the analyst's order (``budget`` 0 keeps none), each
      with ``source=kind``, ``support_count=1`` (one analyst proposed it; merges add up agreement)
      and ``merge_level=0``;
    - ``support``: ``len(rows)``, the trajectories the patch was drawn from;
    - diagnosis: ids not among ``rows`` (or repeated) are dropped, and so is an entry left with none;
    - execution notes: stripped, blank and repeated ones dropped (the flow reads them only with
      ``optimizer.use_appendix``).
    """
    if budget < 0:
        raise ValueError(f"edit budget must be >= 0, got {budget}")
    edits = [
        Edit(op=edit.op, target=edit.target, content=edit.content, file=edit.file or SKILL_MD,
             support_count=1, source=kind)
        for edit in reply.patch.edits[:budget]
    ]
    diagnosis, notes = diagnosis_from_reply(reply.diagnosis, rows), notes_from_reply(reply.execution_notes)
    return Patch(reasoning=reply.patch.reasoning.strip(), edits=edits, diagnosis=diagnosis,
                 execution_notes=notes, source=kind, support=len(rows))


def diagnosis_from_reply(entries: Sequence[DiagnosisReply], rows: Sequence[ItemResult]) -> list[Diagnosis]:
    """The analyst's diagnosis entries with ids not among ``rows`` (or repeated) dropped, and an entry
    left with no id dropped too."""
    known = {row.id for row in rows}
    diagnosis = []
    for entry in entries:
        ids = list(dict.fromkeys(i for i in map(normalise_id, entry.ids) if i in known))
        if ids:
            diagnosis.append(Diagnosis(ids=ids, kind=entry.kind.strip() or "other",
                                       description=entry.description.strip()))
    return diagnosis


def notes_from_reply(notes: Sequence[str]) -> list[str]:
    """Execution notes stripped, with blank and repeated ones dropped."""
    return list(dict.fromkeys(note.strip() for note in notes if note.strip()))


def analyst_fallback(*, kind: Kind, rows: Sequence[ItemResult], reason: str) -> Patch:
    """The recorded outcome of an analyst call that gave no usable reply: no edits, ``fallback=reason``."""
    return Patch(source=kind, support=len(rows), fallback=reason)
