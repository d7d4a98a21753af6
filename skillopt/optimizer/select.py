"""Select ("gradient clipping"): keep at most B edits of the merged pool.

When the pool holds more than B edits (``needs_ranking``), one ranking call returns the indices
of the B most important; ``select_edits`` turns its reply (or its failure, ``None``) into the
selection. ``select_items`` is the same for any pool (the rewrite modes rank revise suggestions,
``rewrite.suggestion_ranking_request``). The user message::

    ## Current skill
    <skill, or "(empty)">

    ## Optimizer memory            (only when there is a meta skill)
    <meta skill>

    ## Candidate edits (budget = B)
    [0] {"op": "append", "target": "", "content": "...", "support_count": 3, "source": "failure"}
    [1] {...}

Each pool line is ``[<i>] `` and the edit's compact one-line JSON (0-based ``i``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence, Sized
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field

from skillopt.core.prompts import ReplyModel, optimizer_prompt
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.optimizer.merge import edit_json, skill_memory_message
from skillopt.skill.document import Edit

ItemT = TypeVar("ItemT")


def format_pool_line(index: int, edit: Edit) -> str:
    """``[<index>] {"op": …, "target": …, "content": …, "support_count": …, "source": …}`` on one line."""
    return f"[{index}] {json.dumps(edit_json(edit), ensure_ascii=False)}"


def format_ranking_message(
    *,
    skill: str,
    pool: Sequence[Any],
    budget: int,
    meta_skill: str = "",
    heading: str = "Candidate edits",
    format_line: Callable[[int, Any], str] = format_pool_line,
) -> str:
    """The ranking user message (format in the module docstring); the rewrite modes rank suggestions
    under their own ``heading`` with their own ``format_line``."""
    lines = [format_line(i, item) for i, item in enumerate(pool)]
    return skill_memory_message(skill, meta_skill, f"## {heading} (budget = {budget})\n" + "\n".join(lines))


def needs_ranking(pool: Sized, budget: int) -> bool:
    """Whether a ranking call is needed: only when the pool holds more than a positive budget."""
    return budget > 0 and len(pool) > budget


def ranking_request(*, skill: str, pool: Sequence[Edit], budget: int, meta_skill: str = "") -> ChatRequest:
    """The ranking call: stage ``ranking``, tags ``{"budget", "n_pool"}``."""
    return ChatRequest(
        messages=[system(optimizer_prompt("ranking") + "\n"),
                  user(format_ranking_message(skill=skill, pool=pool, budget=budget, meta_skill=meta_skill))],
        stage="ranking",
        tags={"budget": budget, "n_pool": len(pool)},
    )


class RankingReply(ReplyModel):
    """``{"reasoning": str, "selected_indices": [int, ...]}`` (§4.11), priority order."""

    reasoning: str = ""
    selected_indices: list[int]


class Selection(BaseModel):
    """The selected edits in priority order, their pool indices, the indices of the reply that were
    ignored (out of range or repeated) and why the selection is a fallback, if it is."""

    edits: list[Edit] = Field(default_factory=list)
    indices: list[int] = Field(default_factory=list)
    ignored_indices: list[int] = Field(default_factory=list)
    fallback: str | None = None


class ItemSelection(BaseModel, Generic[ItemT]):
    """``Selection`` for a pool of any kind (edits or revise suggestions): ``items`` in priority order."""

    items: list[ItemT] = Field(default_factory=list)
    indices: list[int] = Field(default_factory=list)
    ignored_indices: list[int] = Field(default_factory=list)
    fallback: str | None = None


def select_items(pool: Sequence[ItemT], budget: int, reply: RankingReply | None) -> ItemSelection[ItemT]:
    """At most ``budget`` items of ``pool``.

    - ``budget`` 0 selects nothing; a pool no larger than the budget is kept whole (no call needed,
      ``reply`` is not read);
    - otherwise the reply's indices in its order: out-of-range ones (negative included) and repeats
      are ignored, the rest cut to ``budget``; fewer than ``budget`` valid indices select fewer;
    - ``reply`` None (the call failed) or no valid index at all keeps the first ``budget`` items,
      with a ``fallback`` that says so.

    Raises ``ValueError`` for a negative budget.
    """
    if budget < 0:
        raise ValueError(f"edit budget must be >= 0, got {budget}")
    if budget == 0:
        return ItemSelection()
    if not needs_ranking(pool, budget):
        return ItemSelection(items=list(pool), indices=list(range(len(pool))))
    if reply is None:
        return _first(pool, budget, f"ranking failed: kept the first {budget}")
    chosen: list[int] = []
    ignored: list[int] = []
    for index in reply.selected_indices:
        if 0 <= index < len(pool) and index not in chosen:
            chosen.append(index)
        else:
            ignored.append(index)
    if not chosen:
        selection = _first(pool, budget, f"ranking selected no valid index: kept the first {budget}")
        return selection.model_copy(update={"ignored_indices": ignored})
    chosen = chosen[:budget]
    return ItemSelection(items=[pool[i] for i in chosen], indices=chosen, ignored_indices=ignored)


def select_edits(pool: Sequence[Edit], budget: int, reply: RankingReply | None) -> Selection:
    """``select_items`` for a pool of edits, as a ``Selection``."""
    selection = select_items(pool, budget, reply)
    return Selection(edits=selection.items, indices=selection.indices,
                     ignored_indices=selection.ignored_indices, fallback=selection.fallback)


def _first(pool: Sequence[ItemT], budget: int, reason: str) -> ItemSelection[ItemT]:
    return ItemSelection(items=list(pool[:budget]), indices=list(range(min(budget, len(pool)))),
                                fallback=reason)
