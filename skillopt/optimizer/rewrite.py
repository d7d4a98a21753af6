"""The rewrite modes: revise suggestions and whole-skill candidates.

``optimizer.skill_update_mode`` replaces patch mode's edits with one of:

- ``rewrite_from_suggestions``: analysts return typed revise suggestions
  (``rewrite_analyst_request`` → ``SuggestionAnalystReply`` → ``patch_from_suggestion_reply``); the
  failure and success trees and the final merge combine them (``merge_suggestions_request`` →
  ``patch_from_suggestion_merge``, or ``concat_suggestions``); one ranking call keeps the B most
  important (``suggestion_ranking_request`` → ``select.select_items``); one rewrite call writes the
  whole new skill (``rewrite_request`` → ``RewriteReply``).
- ``full_rewrite_minibatch``: each analyst writes one complete replacement skill
  (``FullRewriteAnalystReply`` → ``patch_from_full_rewrite_reply``); merges combine documents
  (``merge_skills_request`` → ``patch_from_skill_merge``, or ``keep_first_skill``). No budget, no
  ranking.

In both, ``finish_rewrite`` turns the model's document into the candidate: protected blocks
verified and restored. ``rewrite_as_edits`` describes a candidate as edits, for the step buffer.
Nothing here calls a model.

The analyst's user message is ``reflect``'s (``## Current skill``, budget, ``## Step buffer``,
``## Optimizer memory``, ``## Trajectories``), with ``## Suggestion budget`` / "You may propose at
most L suggestions." for suggestions and no budget section for full rewrites. Merges use
``merge``'s message, ``## Patches to merge (level n)``, with these blocks::

    ### Patch 1 (source: failure, support: 8)
    ```json
    {
      "reasoning": "...",
      "suggestions": [
        {"type": ..., "title": ..., "motivation": ..., "instruction": ..., "priority": ...,
         "support_count": ..., "source": ...}
      ]
    }
    ```

    ### Patch 2 (source: success, support: 3)
    Reasoning: <the analyst's reasoning on one line, when it has any>
    ```markdown
    <the whole skill>
    ```

(a skill's fence is longer than any run of backticks inside it). Ranking uses ``select``'s
message with ``## Candidate suggestions (budget = B)`` and one ``[i] <JSON suggestion>`` line
each. The rewrite call's user message::

    ## Current skill
    <skill, or "(empty)">

    ## Selected suggestions
    {"type": "add_rule", "title": ..., "motivation": ..., "instruction": ..., "priority": 1, ...}
    {...}

    ## Step buffer                 (only when not empty)
    <StepBuffer.format()>

    ## Optimizer memory            (only when there is a meta skill)
    <meta skill>
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from typing import Any, Literal, TypeGuard, get_args

from pydantic import Field, field_validator

from skillopt.core.prompts import ReplyModel, optimizer_prompt
from skillopt.core.records import ItemResult, Patch, Suggestion, SuggestionType
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.optimizer.merge import (
    MergeKind,
    concat_fallback,
    format_merge_message,
    inherit_patch,
    patch_heading,
)
from skillopt.optimizer.reflect import (
    DiagnosisReply,
    Kind,
    analyst_chat_request,
    analyst_system_prompt,
    current_skill_section,
    diagnosis_from_reply,
    notes_from_reply,
)
from skillopt.optimizer.select import format_ranking_message
from skillopt.optimizer.trajectory import one_line
from skillopt.skill.document import Edit, SkillDocument, restore_protected

RewriteMode = Literal["rewrite_from_suggestions", "full_rewrite_minibatch"]
#: The six revise-suggestion types (``records.Suggestion.type``).
SUGGESTION_TYPES: tuple[SuggestionType, ...] = get_args(SuggestionType)

#: Priority words some models write instead of the integer rank (1 = most important).
_PRIORITY_WORDS = {"critical": 1, "high": 1, "medium": 2, "normal": 2, "low": 3}
_FENCED = re.compile(r"\A(`{3,})[ \t]*(?:markdown|md)?[ \t]*\n(.*)\n\1[ \t]*\Z", re.DOTALL | re.IGNORECASE)
_BACKTICKS = re.compile(r"`+")


# --------------------------------------------------------------------------------------------------
# Shared helpers


def suggestion_json(suggestion: Suggestion) -> dict[str, object]:
    """The seven keys an optimizer sees of a suggestion, in contract order."""
    return {"type": suggestion.type, "title": suggestion.title, "motivation": suggestion.motivation,
            "instruction": suggestion.instruction, "priority": suggestion.priority,
            "support_count": suggestion.support_count, "source": suggestion.source}


def format_suggestion_line(index: int, suggestion: Suggestion) -> str:
    """``[<index>] {"type": …, "title": …, …}`` on one line (ranking and the autonomous budget)."""
    return f"[{index}] {json.dumps(suggestion_json(suggestion), ensure_ascii=False)}"


def skill_text(text: str) -> str:
    """A skill as a model wrote it, without surrounding blank lines and without one fence wrapping
    the whole document (```` ```markdown … ``` ````, which models add by habit)."""
    text = text.strip()
    fenced = _FENCED.match(text)
    if fenced and not re.search(rf"^{fenced.group(1)}[ \t]*$", fenced.group(2), re.MULTILINE):
        text = fenced.group(2).strip()
    return text + "\n" if text else ""


def skill_body(text: str) -> str:
    """The body of ``text`` without its protected blocks (tolerates malformed markers)."""
    return SkillDocument.parse(restore_protected("", text)[0]).body


def markdown_fence(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text`` (at least three)."""
    return "`" * max(3, 1 + max((len(run) for run in _BACKTICKS.findall(text)), default=0))


# --------------------------------------------------------------------------------------------------
# Analysts


def rewrite_analyst_request(
    *,
    mode: RewriteMode,
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
    """One rewrite-mode analyst call on one minibatch: stage ``analyst``, tags ``{"kind", "mode",
    "item_ids"}``.

    ``rewrite_from_suggestions`` states ``budget`` as "at most L suggestions" and uses the
    ``analyst_suggestions`` template; ``full_rewrite_minibatch`` has no budget section (``budget``
    is not shown) and uses ``analyst_full_rewrite``. Execution-notes instructions and benchmark
    guidance are added as in patch mode. Raises ``ValueError`` for a negative budget.
    """
    if budget < 0:
        raise ValueError(f"suggestion budget must be >= 0, got {budget}")
    suggestions = mode == "rewrite_from_suggestions"
    template = optimizer_prompt("analyst_suggestions" if suggestions else "analyst_full_rewrite")
    instructions = analyst_system_prompt(kind=kind, benchmark_guidance=benchmark_guidance,
                                         use_appendix=use_appendix, template=template)
    return analyst_chat_request(instructions, stage="analyst", tags={"kind": kind, "mode": mode},
                                skill=skill, budget=budget if suggestions else None, rows=rows,
                                step_buffer=step_buffer, meta_skill=meta_skill, prompt_chars=prompt_chars,
                                trajectory_chars=trajectory_chars, budget_unit="suggestions")


class SuggestionItemReply(ReplyModel):
    """One revise suggestion as an optimizer writes it; ``type`` is checked on conversion (an
    unknown type drops that suggestion, not the whole reply)."""

    type: str
    title: str = ""
    motivation: str = ""
    instruction: str = ""
    priority: int = 1

    @field_validator("type", mode="before")
    @classmethod
    def _normalise_type(cls, value: Any) -> Any:
        # "Add rule", "add-rule" and "ADD_RULE" all mean add_rule.
        return re.sub(r"[\s-]+", "_", value.strip().lower()) if isinstance(value, str) else value

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_words(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in _PRIORITY_WORDS:
            return _PRIORITY_WORDS[value.strip().lower()]
        return value


class SuggestionReply(ReplyModel):
    """``{"reasoning": str, "suggestions": [{"type", "title", "motivation", "instruction", "priority"}]}``."""

    reasoning: str = ""
    suggestions: list[SuggestionItemReply]


class SuggestionAnalystReply(ReplyModel):
    """``{"diagnosis": [...], "patch": {"reasoning", "suggestions"}, "execution_notes": [...]}`` (§4.11)."""

    diagnosis: list[DiagnosisReply]
    patch: SuggestionReply
    execution_notes: list[str] = Field(default_factory=list)


class SkillPatchReply(ReplyModel):
    """``{"reasoning": str, "skill": str}``: one complete replacement skill."""

    reasoning: str = ""
    skill: str


class FullRewriteAnalystReply(ReplyModel):
    """``{"diagnosis": [...], "patch": {"reasoning", "skill"}, "execution_notes": [...]}`` (§4.11)."""

    diagnosis: list[DiagnosisReply]
    patch: SkillPatchReply
    execution_notes: list[str] = Field(default_factory=list)


def _is_suggestion_type(value: str) -> TypeGuard[SuggestionType]:
    return value in SUGGESTION_TYPES


def to_suggestion(item: SuggestionItemReply, *, source: Kind, support_count: int = 1) -> Suggestion | None:
    """The ``Suggestion`` record of a reply's suggestion; None for a type outside the six."""
    if not _is_suggestion_type(item.type):
        return None
    return Suggestion(type=item.type, title=item.title.strip(), motivation=item.motivation.strip(),
                      instruction=item.instruction.strip(), priority=max(1, item.priority),
                      support_count=max(1, support_count), source=source)


def patch_from_suggestion_reply(
    reply: SuggestionAnalystReply, *, kind: Kind, rows: Sequence[ItemResult], budget: int
) -> Patch:
    """The ``Patch`` of one suggestions-mode analyst reply: its first ``budget`` suggestions of a
    known type (in the analyst's order), each ``source=kind``, ``support_count=1``; diagnosis,
    execution notes and ``support`` as in ``reflect.patch_from_reply``."""
    if budget < 0:
        raise ValueError(f"suggestion budget must be >= 0, got {budget}")
    converted = (to_suggestion(item, source=kind) for item in reply.patch.suggestions)
    known = [suggestion for suggestion in converted if suggestion is not None]
    return Patch(reasoning=reply.patch.reasoning.strip(), suggestions=known[:budget],
                 diagnosis=diagnosis_from_reply(reply.diagnosis, rows),
                 execution_notes=notes_from_reply(reply.execution_notes), source=kind, support=len(rows))


def patch_from_full_rewrite_reply(
    reply: FullRewriteAnalystReply, *, kind: Kind, rows: Sequence[ItemResult]
) -> Patch:
    """The ``Patch`` of one full-rewrite analyst reply: ``skill`` = the reply's document (one
    wrapping fence removed). A document whose body is blank is a fallback patch (``skill`` None,
    ``fallback`` says why) that still carries the diagnosis and notes."""
    skill = skill_text(reply.patch.skill)
    diagnosis, notes = diagnosis_from_reply(reply.diagnosis, rows), notes_from_reply(reply.execution_notes)
    if not skill_body(skill).strip():
        return Patch(source=kind, support=len(rows), diagnosis=diagnosis, execution_notes=notes,
                     reasoning=reply.patch.reasoning.strip(), fallback="analyst returned an empty skill")
    return Patch(reasoning=reply.patch.reasoning.strip(), skill=skill, diagnosis=diagnosis,
                 execution_notes=notes, source=kind, support=len(rows))


# --------------------------------------------------------------------------------------------------
# Merges


def format_suggestion_block(patch: Patch, *, index: int) -> str:
    """The patch heading and a fenced ```json block of the patch's reasoning and suggestions."""
    suggestions = [suggestion_json(suggestion) for suggestion in patch.suggestions]
    body = json.dumps(
        {"reasoning": patch.reasoning, "suggestions": suggestions}, ensure_ascii=False, indent=2
    )
    return f"{patch_heading(patch, index=index)}\n```json\n{body}\n```"


def format_skill_block(patch: Patch, *, index: int) -> str:
    """The patch heading, ``Reasoning: …`` (when there is any) and the whole skill in a markdown fence."""
    skill = (patch.skill or "").strip("\n") or "(empty)"
    fence = markdown_fence(skill)
    lines = [patch_heading(patch, index=index)]
    if patch.reasoning.strip():
        lines.append(f"Reasoning: {one_line(patch.reasoning)}")
    lines.append(f"{fence}markdown\n{skill}\n{fence}")
    return "\n".join(lines)


def merge_suggestions_request(
    *, kind: MergeKind, skill: str, patches: Sequence[Patch], level: int, meta_skill: str = ""
) -> ChatRequest:
    """One suggestion-merge call: stage ``merge``, tags ``{"kind", "mode", "level", "n_patches"}``;
    the ``merge_suggestions`` template covers the trees and the final merge."""
    return _merge_request("rewrite_from_suggestions", kind=kind, skill=skill, patches=patches, level=level,
                          meta_skill=meta_skill)


def merge_skills_request(
    *, kind: MergeKind, skill: str, patches: Sequence[Patch], level: int, meta_skill: str = ""
) -> ChatRequest:
    """One skill-merge call ("merges combine documents"): stage ``merge``, tags ``{"kind", "mode",
    "level", "n_patches"}``; the ``merge_skills`` template covers the trees and the final merge."""
    return _merge_request("full_rewrite_minibatch", kind=kind, skill=skill, patches=patches, level=level,
                          meta_skill=meta_skill)


def _merge_request(
    mode: RewriteMode, *, kind: MergeKind, skill: str, patches: Sequence[Patch], level: int, meta_skill: str
) -> ChatRequest:
    suggestions = mode == "rewrite_from_suggestions"
    message = format_merge_message(
        skill=skill,
        patches=patches,
        level=level,
        meta_skill=meta_skill,
        format_block=format_suggestion_block if suggestions else format_skill_block,
    )
    template = optimizer_prompt("merge_suggestions" if suggestions else "merge_skills")
    return ChatRequest(
        messages=[system(template + "\n"), user(message)],
        stage="merge",
        tags={"kind": kind, "mode": mode, "level": level, "n_patches": len(patches)},
    )


class MergeSuggestion(SuggestionItemReply):
    support_count: int = 1
    source: Literal["failure", "success"] = "failure"


class SuggestionMergeReply(ReplyModel):
    """``{"reasoning": str, "suggestions": [{..., "support_count", "source"}]}`` (§4.11)."""

    reasoning: str = ""
    suggestions: list[MergeSuggestion]


class SkillMergeReply(ReplyModel):
    """``{"reasoning": str, "skill": str}`` (§4.11): the combined document."""

    reasoning: str = ""
    skill: str


def patch_from_suggestion_merge(
    reply: SuggestionMergeReply, *, kind: MergeKind, level: int, patches: Sequence[Patch]
) -> Patch:
    """The merged ``Patch``, as ``merge.patch_from_merge`` does for edits: the reply's suggestions
    of a known type in its order, ``source`` = the tree's kind (the final merge keeps the model's
    label), ``support_count`` clamped to ``[1, total support_count of the input suggestions]``."""
    ceiling = max(1, sum(s.support_count for patch in patches for s in patch.suggestions))
    suggestions = [
        suggestion
        for item in reply.suggestions
        if (suggestion := to_suggestion(item, source=item.source if kind == "final" else kind,
                                        support_count=min(item.support_count, ceiling))) is not None
    ]
    source = "success" if kind == "success" else "failure"
    return inherit_patch(patches, reasoning=reply.reasoning.strip(), suggestions=suggestions, source=source,
                         merge_level=level)


def patch_from_skill_merge(
    reply: SkillMergeReply, *, kind: MergeKind, level: int, patches: Sequence[Patch]
) -> Patch:
    """The merged ``Patch`` holding the reply's document (one wrapping fence removed), with the
    inputs' support, diagnoses and notes. A blank document falls back to ``keep_first_skill``."""
    skill = skill_text(reply.skill)
    if not skill_body(skill).strip():
        return keep_first_skill(patches, reason="skill merge returned an empty skill")
    source = "success" if kind == "success" else "failure"
    return inherit_patch(patches, reasoning=reply.reasoning.strip(), skill=skill, source=source,
                         merge_level=level)


def concat_suggestions(patches: Sequence[Patch], *, reason: str) -> Patch:
    """The fallback of a failed suggestion merge: the inputs' suggestions concatenated, failure-driven
    first (``merge.concat_fallback``), ``fallback=reason``."""
    return concat_fallback(patches, reason=reason)


def keep_first_skill(patches: Sequence[Patch], *, reason: str) -> Patch:
    """The fallback of a failed skill merge: the first input that holds a failure-driven skill, else
    the first that holds any skill (``skill`` None when none does), ``fallback=reason``."""
    holding = [patch for patch in patches if patch.skill is not None]
    chosen = next((patch for patch in holding if patch.source == "failure"), holding[0] if holding else None)
    return inherit_patch(
        patches,
        reasoning=chosen.reasoning if chosen else "",
        skill=chosen.skill if chosen else None,
        source=chosen.source if chosen else "failure",
        merge_level=max((p.merge_level for p in patches), default=0),
        fallback=reason,
    )


# --------------------------------------------------------------------------------------------------
# Ranking and the rewrite


def suggestion_ranking_request(
    *, skill: str, pool: Sequence[Suggestion], budget: int, meta_skill: str = ""
) -> ChatRequest:
    """The ranking call over revise suggestions: stage ``ranking``, tags ``{"budget", "n_pool",
    "mode"}``; the reply is a ``select.RankingReply`` and ``select.select_items`` applies it."""
    message = format_ranking_message(skill=skill, pool=pool, budget=budget, meta_skill=meta_skill,
                                     heading="Candidate suggestions", format_line=format_suggestion_line)
    return ChatRequest(
        messages=[system(optimizer_prompt("ranking_suggestions") + "\n"), user(message)],
        stage="ranking",
        tags={"budget": budget, "n_pool": len(pool), "mode": "rewrite_from_suggestions"},
    )


def format_rewrite_message(
    *, skill: str, suggestions: Sequence[Suggestion], step_buffer: str = "", meta_skill: str = ""
) -> str:
    """The rewrite user message (format in the module docstring)."""
    lines = [json.dumps(suggestion_json(s), ensure_ascii=False) for s in suggestions]
    sections = [current_skill_section(skill),
                "## Selected suggestions\n" + ("\n".join(lines) if lines else "(none)")]
    if step_buffer.strip():
        sections.append(f"## Step buffer\n{step_buffer.strip()}")
    if meta_skill.strip():
        sections.append(f"## Optimizer memory\n{meta_skill.strip()}")
    return "\n\n".join(sections) + "\n"


def rewrite_request(
    *, skill: str, suggestions: Sequence[Suggestion], step_buffer: str = "", meta_skill: str = ""
) -> ChatRequest:
    """The rewrite call (``rewrite_from_suggestions``): stage ``rewrite``, tags ``{"n_suggestions"}``."""
    message = format_rewrite_message(skill=skill, suggestions=suggestions, step_buffer=step_buffer,
                                     meta_skill=meta_skill)
    return ChatRequest(
        messages=[system(optimizer_prompt("rewrite") + "\n"), user(message)],
        stage="rewrite",
        tags={"n_suggestions": len(suggestions)},
    )


class RewriteReply(ReplyModel):
    """``{"reasoning": str, "change_summary": [str], "new_skill": str}`` (§4.11).

    ``new_skill`` loses one wrapping fence; a document with a blank body is a parse failure (the
    flow's one re-ask, then ``skip_no_rewrite``). A single string ``change_summary`` is one entry.
    """

    reasoning: str = ""
    change_summary: list[str]
    new_skill: str

    @field_validator("change_summary", mode="before")
    @classmethod
    def _one_change_is_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("new_skill")
    @classmethod
    def _a_whole_skill(cls, value: str) -> str:
        text = skill_text(value)
        if not skill_body(text).strip():
            raise ValueError("new_skill is empty: expected the whole rewritten skill")
        return text


def finish_rewrite(current_skill: str, new_skill: str) -> tuple[str, bool]:
    """The candidate skill of a rewrite: ``new_skill``'s body (one wrapping fence removed) with the
    protected blocks of ``current_skill`` exactly (``skill.restore_protected``), and whether they
    had to be restored (lost, altered, added or moved by the model).

    Raises ``ValueError`` when ``new_skill``'s body is blank (no rewrite to finish).
    """
    text = skill_text(new_skill)
    if not skill_body(text).strip():
        raise ValueError("the rewritten skill is empty; record the step as skip_no_rewrite")
    return restore_protected(current_skill, text)


def rewrite_as_edits(current_skill: str, candidate: str, *, source: Kind = "failure") -> list[Edit]:
    """The line changes from ``current_skill``'s body to ``candidate``'s, as edits (``insert_after``
    the nearest non-blank line above, ``replace``, ``delete``, or ``append`` to an empty body;
    changes of blank lines only are left out), so a rejected rewrite can go into the step buffer
    like rejected edits."""
    old = SkillDocument.parse(current_skill).body.splitlines()
    new = SkillDocument.parse(candidate).body.splitlines()
    edits: list[Edit] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        removed, added = "\n".join(old[i1:i2]).strip("\n"), "\n".join(new[j1:j2]).strip("\n")
        if op == "equal" or not (removed.strip() or added.strip()):
            continue
        if op == "delete":
            edits.append(Edit(op="delete", target=removed, source=source))
        elif op == "replace":
            edits.append(Edit(op="replace", target=removed, content=added, source=source))
        elif anchor := next((old[k] for k in range(i1 - 1, -1, -1) if old[k].strip()), None):
            edits.append(Edit(op="insert_after", target=anchor, content=added, source=source))
        elif following := next((line for line in old[i1:] if line.strip()), None):
            edits.append(Edit(op="replace", target=following, content=f"{added}\n{following}", source=source))
        else:
            edits.append(Edit(op="append", content=added, source=source))
    return edits
