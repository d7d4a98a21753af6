"""Aggregate: hierarchical merging of patches.

Failure patches and success patches each form a tree: ``merge_groups`` cuts a level into
consecutive groups of ``fan_in``; every group of two or more becomes one ``merge_request``
(a group of one passes through unchanged, without a call), level by level, until one patch is
left. A final merge (``kind="final"``) then combines the two roots, failure-driven edits first.
A merge call that fails after its re-ask becomes ``concat_fallback``.

The user message::

    ## Current skill
    <skill, or "(empty)">

    ## Optimizer memory            (only when there is a meta skill)
    <meta skill>

    ## Patches to merge (level <n>)
    ### Patch 1 (source: failure, support: 8)
    ```json
    {
      "reasoning": "...",
      "edits": [
        {"op": ..., "target": ..., "content": ..., "support_count": ..., "source": ...}
      ]
    }
    ```

The JSON is indented, so no line inside it starts with a backtick and the fence always closes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Literal

from skillopt.core.prompts import ReplyModel, optimizer_prompt
from skillopt.core.records import Patch
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.optimizer.reflect import current_skill_section
from skillopt.skill.document import Edit, OpText
from skillopt.skill.files import SKILL_MD

MergeKind = Literal["failure", "success", "final"]


def merge_groups(patches: Sequence[Patch], fan_in: int) -> list[list[Patch]]:
    """One level of the merge tree: consecutive groups of ``fan_in`` patches (the last may be
    smaller; a group of one passes through without a call). Raises ``ValueError`` for ``fan_in < 2``."""
    if fan_in < 2:
        raise ValueError(f"merge fan-in (gradient.merge_batch_size) must be at least 2, got {fan_in}")
    return [list(patches[start : start + fan_in]) for start in range(0, len(patches), fan_in)]


def plan_merge_levels(n_patches: int, fan_in: int) -> int:
    """How many levels of merge calls reduce ``n_patches`` to one (0 for one patch or none)."""
    if fan_in < 2:
        raise ValueError(f"merge fan-in (gradient.merge_batch_size) must be at least 2, got {fan_in}")
    levels = 0
    while n_patches > 1:
        n_patches = -(-n_patches // fan_in)
        levels += 1
    return levels


def edit_json(edit: Edit) -> dict[str, object]:
    """The keys an optimizer sees of an edit, in contract order: ``file`` first when the edit names a file
    other than ``SKILL.md``, then the five keys every edit has."""
    named = {"file": edit.file} if edit.file != SKILL_MD else {}
    return {**named, "op": edit.op, "target": edit.target, "content": edit.content,
            "support_count": edit.support_count, "source": edit.source}


def patch_heading(patch: Patch, *, index: int) -> str:
    """``### Patch <index> (source: …, support: …)``: the first line of every patch block."""
    return f"### Patch {index} (source: {patch.source}, support: {patch.support})"


def format_patch_block(patch: Patch, *, index: int) -> str:
    """``### Patch <index> (source: …, support: …)`` and a fenced ```json block of the patch."""
    body = json.dumps({"reasoning": patch.reasoning, "edits": [edit_json(e) for e in patch.edits]},
                      ensure_ascii=False, indent=2)
    return f"{patch_heading(patch, index=index)}\n```json\n{body}\n```"


def format_merge_message(
    *,
    skill: str,
    patches: Sequence[Patch],
    level: int,
    meta_skill: str = "",
    format_block: Callable[..., str] = format_patch_block,
) -> str:
    """The merge user message (format in the module docstring); patches numbered from 1, each
    shown by ``format_block(patch, index=i)`` (the rewrite modes show suggestions or whole skills)."""
    blocks = "\n\n".join(format_block(patch, index=i) for i, patch in enumerate(patches, 1))
    return skill_memory_message(skill, meta_skill, f"## Patches to merge (level {level})\n{blocks}")


def skill_memory_message(skill: str, meta_skill: str, last_section: str) -> str:
    """``## Current skill``, ``## Optimizer memory`` (only when there is a meta skill), then
    ``last_section``: the layout the merge and ranking messages share."""
    sections = [current_skill_section(skill)]
    if meta_skill.strip():
        sections.append(f"## Optimizer memory\n{meta_skill.strip()}")
    sections.append(last_section)
    return "\n\n".join(sections) + "\n"


def merge_request(
    *, kind: MergeKind, skill: str, patches: Sequence[Patch], level: int, meta_skill: str = ""
) -> ChatRequest:
    """One merge call: stage ``merge``, tags ``{"kind", "level", "n_patches"}``.

    ``level`` is the merge level of the patch this call produces (1 merges analyst patches).
    ``final`` uses the ``merge_final`` template (failure-driven edits win on overlap); the failure
    and success trees use ``merge``.
    """
    template = optimizer_prompt("merge_final" if kind == "final" else "merge")
    return ChatRequest(
        messages=[
            system(template + "\n"),
            user(format_merge_message(skill=skill, patches=patches, level=level, meta_skill=meta_skill)),
        ],
        stage="merge",
        tags={"kind": kind, "level": level, "n_patches": len(patches)},
    )


class MergeEdit(ReplyModel):
    op: OpText
    target: str = ""
    content: str = ""
    file: str | None = None
    support_count: int = 1
    source: Literal["failure", "success"] = "failure"


class MergeReply(ReplyModel):
    """``{"reasoning": str, "edits": [{"op", "target", "content", "support_count", "source"}]}`` (§4.11)."""

    reasoning: str = ""
    edits: list[MergeEdit]


def inherit_patch(patches: Sequence[Patch], **fields: object) -> Patch:
    """A patch with ``fields`` and what every merge inherits from its inputs: their summed support,
    their diagnoses (the step buffer groups failures by them) and their execution notes."""
    notes = [note for patch in patches for note in patch.execution_notes]
    return Patch.model_validate({
        **fields,
        "support": sum(patch.support for patch in patches),
        "diagnosis": [entry for patch in patches for entry in patch.diagnosis],
        "execution_notes": list(dict.fromkeys(notes)),
    })


def patch_from_merge(reply: MergeReply, *, kind: MergeKind, level: int, patches: Sequence[Patch]) -> Patch:
    """The merged ``Patch``: the reply's edits in its order, ``merge_level=level`` on the patch and
    each edit, ``support`` = the inputs' summed support, their diagnoses and execution notes kept.

    Within a failure or success tree every edit's ``source`` is the tree's kind (a model's label is
    not trusted there); the final merge keeps the model's label and is itself labelled ``failure``.
    ``support_count`` is clamped to ``[1, total support_count of the input edits]``.
    """
    ceiling = max(1, sum(edit.support_count for patch in patches for edit in patch.edits))
    edits = [
        Edit(
            op=edit.op,
            target=edit.target,
            content=edit.content,
            file=edit.file or SKILL_MD,
            support_count=min(max(edit.support_count, 1), ceiling),
            source=edit.source if kind == "final" else kind,
            merge_level=level,
        )
        for edit in reply.edits
    ]
    source = "success" if kind == "success" else "failure"
    return inherit_patch(patches, reasoning=reply.reasoning.strip(), edits=edits, source=source,
                         merge_level=level)


def concat_fallback(patches: Sequence[Patch], *, reason: str) -> Patch:
    """The inputs' edits (and revise suggestions, in ``rewrite_from_suggestions`` mode) concatenated,
    failure-driven ones first (each group in input order), when a merge call failed:
    ``fallback=reason``, ``merge_level`` = the highest input level."""
    edits = [e for p in patches for e in p.edits if e.source == "failure"]
    edits += [e for p in patches for e in p.edits if e.source != "failure"]
    suggestions = [s for p in patches for s in p.suggestions if s.source == "failure"]
    suggestions += [s for p in patches for s in p.suggestions if s.source != "failure"]
    source = "success" if patches and all(p.source == "success" for p in patches) else "failure"
    return inherit_patch(
        patches,
        reasoning="\n\n".join(p.reasoning for p in patches if p.reasoning),
        edits=edits,
        suggestions=suggestions,
        source=source,
        merge_level=max((p.merge_level for p in patches), default=0),
        fallback=reason,
    )
