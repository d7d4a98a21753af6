"""Slow update: epoch-level guidance from a longitudinal comparison (DESIGN.md §4.8).

The same train items are rolled out under the skill the epoch started with ("before") and the
current skill ("after"); ``pair_by_id`` sorts the pairs into improved / regressed / persistent
failures / stable successes, ``select_pairs`` applies ``optimizer.longitudinal_pair_policy``,
and ``slow_update_request`` asks the optimizer for new guidance for the target, which the flow
writes into the slow-update block (``guidance_from_reply``). The comparison section is shared
with the meta skill::

    ## Comparison
    Improved: N
    Regressed: N
    Persistent failures: N
    Stable successes: N

    ### Improved
    <the AFTER trajectory of each pair, format_trajectory>

    ### Regressed
    ...

    ### Persistent failures
    ...

    ### Stable successes
    - `id`

An empty group reads ``(none)``; trajectories are numbered from 1 across the whole section.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from skillopt.llm.chat import ChatRequest, system, user
from skillopt.prompts import ReplyModel, optimizer_prompt
from skillopt.records import ItemResult
from skillopt.reflect import skill_or_empty
from skillopt.skill import strip_markers
from skillopt.trajectory import format_trajectory

Pair = tuple[ItemResult, ItemResult]
PairPolicy = Literal["mixed", "changed", "unchanged"]

#: Each trajectory block's size in the comparison; up to 20 pairs share one prompt.
COMPARISON_TRAJECTORY_CHARS = 4000


class Pairs(BaseModel):
    """``(before, after)`` rows of the same items, by how their outcome changed."""

    improved: list[Pair] = Field(default_factory=list)
    regressed: list[Pair] = Field(default_factory=list)
    persistent_fail: list[Pair] = Field(default_factory=list)
    stable_success: list[Pair] = Field(default_factory=list)

    def ids(self) -> list[str]:
        """Every paired item id, group by group."""
        return [after.id for group in self.groups() for _, after in group]

    def groups(self) -> tuple[list[Pair], list[Pair], list[Pair], list[Pair]]:
        return self.improved, self.regressed, self.persistent_fail, self.stable_success


def pair_by_id(before: Sequence[ItemResult], after: Sequence[ItemResult]) -> Pairs:
    """Pair the rows of the same item ids, in the order of ``before``, and sort them by outcome.

    Raises ``ValueError`` when an id repeats on either side or the two sides hold different ids.
    """
    for side, rows in (("before", before), ("after", after)):
        repeated = sorted(i for i, n in Counter(row.id for row in rows).items() if n > 1)
        if repeated:
            raise ValueError(f"ids repeated in the {side} rows: {', '.join(repeated)}")
    after_by_id = {row.id: row for row in after}
    only_before = sorted({row.id for row in before} - after_by_id.keys())
    only_after = sorted(after_by_id.keys() - {row.id for row in before})
    if only_before or only_after:
        raise ValueError(
            "before and after rows must cover the same item ids; "
            f"only before: {', '.join(only_before) or '-'}; only after: {', '.join(only_after) or '-'}"
        )
    pairs = Pairs()
    for old in before:
        new = after_by_id[old.id]
        if old.failed and not new.failed:
            pairs.improved.append((old, new))
        elif not old.failed and new.failed:
            pairs.regressed.append((old, new))
        elif old.failed:
            pairs.persistent_fail.append((old, new))
        else:
            pairs.stable_success.append((old, new))
    return pairs


def select_pairs(pairs: Pairs, policy: PairPolicy) -> Pairs:
    """The pairs ``optimizer.longitudinal_pair_policy`` shows: ``mixed`` all of them, ``changed``
    improved and regressed, ``unchanged`` persistent failures and stable successes."""
    if policy == "mixed":
        return pairs.model_copy()
    if policy == "changed":
        return Pairs(improved=list(pairs.improved), regressed=list(pairs.regressed))
    if policy == "unchanged":
        return Pairs(persistent_fail=list(pairs.persistent_fail), stable_success=list(pairs.stable_success))
    raise ValueError(f"unknown longitudinal pair policy {policy!r}; expected mixed, changed or unchanged")


def format_comparison(pairs: Pairs, *, trajectory_chars: int = COMPARISON_TRAJECTORY_CHARS) -> str:
    """The ``## Comparison`` section (format in the module docstring)."""
    lines = [
        "## Comparison",
        f"Improved: {len(pairs.improved)}",
        f"Regressed: {len(pairs.regressed)}",
        f"Persistent failures: {len(pairs.persistent_fail)}",
        f"Stable successes: {len(pairs.stable_success)}",
    ]
    index = 0
    for title, group in (("Improved", pairs.improved), ("Regressed", pairs.regressed),
                         ("Persistent failures", pairs.persistent_fail)):
        blocks = []
        for _, after in group:
            index += 1
            blocks.append(format_trajectory(after, index=index, max_chars=trajectory_chars))
        lines.append(f"\n### {title}\n" + ("\n\n".join(blocks) if blocks else "(none)"))
    stable = "\n".join(f"- `{after.id}`" for _, after in pairs.stable_success) or "(none)"
    lines.append(f"\n### Stable successes\n{stable}")
    return "\n".join(lines)


class SlowUpdateReply(ReplyModel):
    """``{"reasoning": str, "guidance": str}`` (§4.11)."""

    reasoning: str = ""
    guidance: str


def comparison_message(sections: Sequence[tuple[str, str]], pairs: Pairs) -> str:
    """``## <title>\n<text>`` for each ``(title, text)`` section, then ``format_comparison(pairs)``."""
    return "\n\n".join([*(f"## {title}\n{text}" for title, text in sections), format_comparison(pairs)]) + "\n"


def comparison_request(stage: Literal["slow_update", "meta_skill"], message: str, pairs: Pairs) -> ChatRequest:
    """An epoch-boundary call: the template named like ``stage`` as the system message, ``message``
    as the user message, tags ``{"item_ids"}`` (train items only)."""
    return ChatRequest(
        messages=[system(optimizer_prompt(stage) + "\n"), user(message)],
        stage=stage,
        tags={"item_ids": pairs.ids()},
    )


def block_text(text: str) -> str:
    """Model-written text for a protected block or the memory: stripped, protected-block markers removed."""
    return strip_markers(text).strip()


def format_slow_update_message(
    *, start_skill: str, current_skill: str, previous_guidance: str, pairs: Pairs
) -> str:
    """The slow-update user message: both skills, the previous guidance (``(none)``), the comparison."""
    return comparison_message([
        ("Skill at the start of the epoch", skill_or_empty(start_skill)),
        ("Current skill", skill_or_empty(current_skill)),
        ("Previous guidance", previous_guidance.strip() or "(none)"),
    ], pairs)


def slow_update_request(
    *, start_skill: str, current_skill: str, previous_guidance: str, pairs: Pairs
) -> ChatRequest:
    """The slow-update call: stage ``slow_update``, tags ``{"item_ids"}`` (train items only)."""
    message = format_slow_update_message(start_skill=start_skill, current_skill=current_skill,
                                         previous_guidance=previous_guidance, pairs=pairs)
    return comparison_request("slow_update", message, pairs)


def guidance_from_reply(reply: SlowUpdateReply) -> str:
    """The new content of the slow-update block: the guidance stripped, protected-block markers removed."""
    return block_text(reply.guidance)
