"""Meta skill: the optimizer's memory across epochs.

At the end of epoch e ≥ 2 the optimizer compares the last skills of epochs e−1 and e on the same
train items (the ``Pairs`` of ``slow_update``) and writes a short memory for itself: which kinds
of edits helped or hurt on this benchmark. Analysts, merges, ranking and the autonomous budget
call read it under ``## Optimizer memory`` during epoch e+1; the target never sees it.

The user message::

    ## Previous epoch's last skill
    <skill, or "(empty)">

    ## This epoch's last skill
    <skill, or "(empty)">

    ## Previous memory
    <memory, or "(none)">

    ## Comparison
    <as in slow_update.format_comparison>
"""

from __future__ import annotations

from skillopt.core.prompts import ReplyModel
from skillopt.llm.chat import ChatRequest
from skillopt.optimizer.reflect import skill_or_empty
from skillopt.optimizer.slow_update import Pairs, block_text, comparison_request


class MetaSkillReply(ReplyModel):
    """``{"reasoning": str, "memory": str}`` (§4.11)."""

    reasoning: str = ""
    memory: str


def meta_skill_sections(*, previous_skill: str, current_skill: str,
                        previous_memory: str) -> list[tuple[str, str]]:
    """The meta-skill message before the comparison: both skills and the previous memory."""
    return [
        ("Previous epoch's last skill", skill_or_empty(previous_skill)),
        ("This epoch's last skill", skill_or_empty(current_skill)),
        ("Previous memory", previous_memory.strip() or "(none)"),
    ]


def meta_skill_request(*, previous_skill: str, current_skill: str, previous_memory: str, pairs: Pairs,
                       prompt_chars: int | None = None, trajectory_chars: int | None = None) -> ChatRequest:
    """The meta-skill call: stage ``meta_skill``, tags ``{"item_ids"}`` (train items only), sized to
    ``prompt_chars`` (None: whole trajectories)."""
    sections = meta_skill_sections(previous_skill=previous_skill, current_skill=current_skill,
                                   previous_memory=previous_memory)
    return comparison_request("meta_skill", sections, pairs, prompt_chars=prompt_chars,
                              trajectory_chars=trajectory_chars)


def memory_from_reply(reply: MetaSkillReply) -> str:
    """The new optimizer memory: the reply's memory stripped, protected-block markers removed."""
    return block_text(reply.memory)
