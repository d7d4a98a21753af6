"""The skill update modes (``optimizer.skill_update_mode``) as strategies.

Every mode answers the same few questions, so the training step never asks which mode it runs:

- what analysts are asked (``analyst_request``, ``analyst_reply``) and how a reply becomes a ``Patch``;
- how patches aggregate (``merge_request``, ``merge_reply``, ``patch_from_merge`` and the merge fallback);
- whether and how the edit budget applies (``budgeted``; ``pool``, ``ranking_request``, ``pick``);
- how the candidate skill is built (``candidate``) and what the step buffer shows as the step's idea
  (``proposed_edits``).

``patch`` applies bounded edits; ``rewrite_from_suggestions`` clips typed revise suggestions to the budget and
has one rewrite call write the new skill; ``full_rewrite_minibatch`` has each analyst write a whole skill,
merges combine documents, and no budget or ranking applies. ``update_mode_for`` picks one, once per run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from skillopt.core.config import OptimizerSection
from skillopt.core.prompts import ReplyModel
from skillopt.core.records import ItemResult, Patch, Suggestion
from skillopt.llm.chat import ChatRequest
from skillopt.optimizer.merge import MergeReply, concat_fallback, merge_request, patch_from_merge
from skillopt.optimizer.reflect import AnalystReply, analyst_request, patch_from_reply
from skillopt.optimizer.rewrite import (
    FullRewriteAnalystReply,
    RewriteReply,
    SkillMergeReply,
    SuggestionAnalystReply,
    SuggestionMergeReply,
    concat_suggestions,
    finish_rewrite,
    keep_first_skill,
    merge_skills_request,
    merge_suggestions_request,
    patch_from_full_rewrite_reply,
    patch_from_skill_merge,
    patch_from_suggestion_merge,
    patch_from_suggestion_reply,
    rewrite_analyst_request,
    rewrite_as_edits,
    suggestion_ranking_request,
)
from skillopt.optimizer.select import RankingReply, ranking_request, select_edits, select_items
from skillopt.skill.document import ApplyReport, Edit, apply_edits

#: The rewrite call of ``rewrite_from_suggestions``: the selected suggestions in, the reply (or None) out.
Rewrite = Callable[[list[Suggestion]], RewriteReply | None]


class Picked(BaseModel):
    """The selected edits or suggestions (whichever the mode uses), in priority order."""

    edits: list[Edit] = Field(default_factory=list)
    suggestions: list[Suggestion] = Field(default_factory=list)
    fallback: str | None = None

    @property
    def count(self) -> int:
        return len(self.edits) + len(self.suggestions)


class Update(BaseModel):
    """The candidate skill of a step and how it was made."""

    candidate: str
    report: ApplyReport | None = None
    change_summary: list[str] = Field(default_factory=list)
    protected_restored: bool = False


def rewritten(skill: str, new_skill: str, change_summary: list[str]) -> Update:
    """A whole new skill from a rewrite or a merged full rewrite, with its protected blocks verified."""
    candidate, restored = finish_rewrite(skill, new_skill)
    return Update(candidate=candidate, change_summary=change_summary, protected_restored=restored)


class UpdateMode(ABC):
    """One ``optimizer.skill_update_mode``: the step's questions answered for that mode."""

    name: ClassVar[str]
    #: Whether the merged proposals form a pool that the edit budget clips (ranking, autonomous budget).
    budgeted: ClassVar[bool] = True
    #: Whether building the candidate takes one more optimizer call (the rewrite).
    rewrites: ClassVar[bool] = False
    analyst_reply: ClassVar[type[ReplyModel]]
    merge_reply: ClassVar[type[ReplyModel]]

    @abstractmethod
    def analyst_request(self, **evidence: Any) -> ChatRequest:
        """The analyst call on one minibatch (``reflect.analyst_request``'s keyword arguments)."""

    @abstractmethod
    def patch_from_analyst(self, reply: Any, *, kind: str, rows: Sequence[ItemResult], budget: int) -> Patch:
        """The ``Patch`` of one analyst reply."""

    @abstractmethod
    def merge_request(self, *, kind: str, skill: str, patches: Sequence[Patch], level: int,
                      meta_skill: str) -> ChatRequest:
        """The merge call on one group of patches."""

    @abstractmethod
    def patch_from_merge(self, reply: Any, *, kind: str, level: int, patches: Sequence[Patch]) -> Patch:
        """The merged ``Patch`` of one merge reply."""

    @abstractmethod
    def merge_fallback(self, patches: Sequence[Patch], *, reason: str) -> Patch:
        """The merged ``Patch`` when the merge call gave nothing usable."""

    @abstractmethod
    def nothing_to_apply(self, merged: Patch) -> str | None:
        """The step's skip decision when ``merged`` holds nothing this mode applies, else None."""

    def pool(self, merged: Patch) -> list[Edit] | list[Suggestion]:
        """The proposals the budget clips (empty for an unbudgeted mode)."""
        return []

    def ranking_request(self, *, skill: str, pool: Any, budget: int, meta_skill: str) -> ChatRequest:
        raise NotImplementedError(f"{self.name} has no ranking")

    def pick(self, pool: Any, budget: int, reply: RankingReply | None) -> Picked:
        """At most ``budget`` of ``pool``: the ranked indices, or the first ones without a reply."""
        raise NotImplementedError(f"{self.name} has no ranking")

    @abstractmethod
    def candidate(self, skill: str, merged: Patch, picked: Picked, *, rewrite: Rewrite) -> Update | None:
        """The candidate skill, or None when the mode's rewrite gave no skill (``skip_no_rewrite``)."""

    def proposed_edits(self, skill: str, picked: Picked, update: Update) -> list[Edit]:
        """The step's idea as edits, for the step buffer when the candidate is rejected."""
        return rewrite_as_edits(skill, update.candidate)


class PatchMode(UpdateMode):
    """Analysts propose edits; merged, ranked to the budget and applied in order (the default)."""

    name = "patch"
    analyst_reply = AnalystReply
    merge_reply = MergeReply

    def analyst_request(self, **evidence: Any) -> ChatRequest:
        return analyst_request(**evidence)

    def patch_from_analyst(self, reply: Any, *, kind: str, rows: Sequence[ItemResult], budget: int) -> Patch:
        return patch_from_reply(reply, kind=kind, rows=rows, budget=budget)  # type: ignore[arg-type]

    def merge_request(self, *, kind: str, skill: str, patches: Sequence[Patch], level: int,
                      meta_skill: str) -> ChatRequest:
        return merge_request(kind=kind, skill=skill, patches=patches, level=level,  # type: ignore[arg-type]
                             meta_skill=meta_skill)

    def patch_from_merge(self, reply: Any, *, kind: str, level: int, patches: Sequence[Patch]) -> Patch:
        return patch_from_merge(reply, kind=kind, level=level, patches=patches)  # type: ignore[arg-type]

    def merge_fallback(self, patches: Sequence[Patch], *, reason: str) -> Patch:
        return concat_fallback(patches, reason=reason)

    def nothing_to_apply(self, merged: Patch) -> str | None:
        return None if merged.edits else "skip_no_patches"

    def pool(self, merged: Patch) -> list[Edit]:
        return list(merged.edits)

    def ranking_request(self, *, skill: str, pool: Any, budget: int, meta_skill: str) -> ChatRequest:
        return ranking_request(skill=skill, pool=pool, budget=budget, meta_skill=meta_skill)

    def pick(self, pool: Any, budget: int, reply: RankingReply | None) -> Picked:
        selection = select_edits(pool, budget, reply)
        return Picked(edits=selection.edits, fallback=selection.fallback)

    def candidate(self, skill: str, merged: Patch, picked: Picked, *, rewrite: Rewrite) -> Update:
        candidate, report = apply_edits(skill, picked.edits)
        return Update(candidate=candidate, report=report)

    def proposed_edits(self, skill: str, picked: Picked, update: Update) -> list[Edit]:
        return list(picked.edits)


class SuggestionsMode(UpdateMode):
    """Analysts propose typed revise suggestions; ranked to the budget, then one call rewrites the skill."""

    name = "rewrite_from_suggestions"
    rewrites = True
    analyst_reply = SuggestionAnalystReply
    merge_reply = SuggestionMergeReply

    def analyst_request(self, **evidence: Any) -> ChatRequest:
        return rewrite_analyst_request(mode="rewrite_from_suggestions", **evidence)

    def patch_from_analyst(self, reply: Any, *, kind: str, rows: Sequence[ItemResult], budget: int) -> Patch:
        return patch_from_suggestion_reply(reply, kind=kind, rows=rows,  # type: ignore[arg-type]
                                           budget=budget)

    def merge_request(self, *, kind: str, skill: str, patches: Sequence[Patch], level: int,
                      meta_skill: str) -> ChatRequest:
        return merge_suggestions_request(kind=kind, skill=skill, patches=patches,  # type: ignore[arg-type]
                                         level=level, meta_skill=meta_skill)

    def patch_from_merge(self, reply: Any, *, kind: str, level: int, patches: Sequence[Patch]) -> Patch:
        return patch_from_suggestion_merge(reply, kind=kind, level=level,  # type: ignore[arg-type]
                                           patches=patches)

    def merge_fallback(self, patches: Sequence[Patch], *, reason: str) -> Patch:
        return concat_suggestions(patches, reason=reason)

    def nothing_to_apply(self, merged: Patch) -> str | None:
        return None if merged.suggestions else "skip_no_patches"

    def pool(self, merged: Patch) -> list[Suggestion]:
        return list(merged.suggestions)

    def ranking_request(self, *, skill: str, pool: Any, budget: int, meta_skill: str) -> ChatRequest:
        return suggestion_ranking_request(skill=skill, pool=pool, budget=budget, meta_skill=meta_skill)

    def pick(self, pool: Any, budget: int, reply: RankingReply | None) -> Picked:
        chosen = select_items(pool, budget, reply)
        return Picked(suggestions=chosen.items, fallback=chosen.fallback)

    def candidate(self, skill: str, merged: Patch, picked: Picked, *, rewrite: Rewrite) -> Update | None:
        reply = rewrite(picked.suggestions)
        if reply is None or not reply.new_skill.strip():
            return None
        return rewritten(skill, reply.new_skill, reply.change_summary)


class FullRewriteMode(UpdateMode):
    """Each analyst writes a whole skill; merges combine documents; no budget, no ranking."""

    name = "full_rewrite_minibatch"
    budgeted = False
    analyst_reply = FullRewriteAnalystReply
    merge_reply = SkillMergeReply

    def analyst_request(self, **evidence: Any) -> ChatRequest:
        return rewrite_analyst_request(mode="full_rewrite_minibatch", **evidence)

    def patch_from_analyst(self, reply: Any, *, kind: str, rows: Sequence[ItemResult], budget: int) -> Patch:
        return patch_from_full_rewrite_reply(reply, kind=kind, rows=rows)  # type: ignore[arg-type]

    def merge_request(self, *, kind: str, skill: str, patches: Sequence[Patch], level: int,
                      meta_skill: str) -> ChatRequest:
        return merge_skills_request(kind=kind, skill=skill,  # type: ignore[arg-type]
                                    patches=patches, level=level, meta_skill=meta_skill)

    def patch_from_merge(self, reply: Any, *, kind: str, level: int, patches: Sequence[Patch]) -> Patch:
        return patch_from_skill_merge(reply, kind=kind, level=level,  # type: ignore[arg-type]
                                      patches=patches)

    def merge_fallback(self, patches: Sequence[Patch], *, reason: str) -> Patch:
        return keep_first_skill(patches, reason=reason)

    def nothing_to_apply(self, merged: Patch) -> str | None:
        return None if merged.skill else "skip_no_rewrite"

    def candidate(self, skill: str, merged: Patch, picked: Picked, *, rewrite: Rewrite) -> Update:
        return rewritten(skill, merged.skill or "", [merged.reasoning] if merged.reasoning else [])


#: The registry: the only place a mode's name is read.
UPDATE_MODES: dict[str, type[UpdateMode]] = {mode.name: mode for mode in (PatchMode, SuggestionsMode,
                                                                           FullRewriteMode)}


def update_mode_for(optimizer: OptimizerSection) -> UpdateMode:
    """The strategy of ``optimizer.skill_update_mode`` (validated by the config model)."""
    return UPDATE_MODES[optimizer.skill_update_mode]()
