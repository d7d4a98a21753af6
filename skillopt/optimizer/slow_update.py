"""Slow update: epoch-level guidance from a longitudinal comparison.

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
    <the new skill's trajectory of each pair, format_trajectory>
    Previous skill's run (outcome: failed (hard 0.00, soft 0.00), answer `X`; <its failure reason>)
    New skill's run (outcome: solved (hard 1.00, soft 1.00), answer `Y`)

    ### Regressed
    ...

    ### Persistent failures
    ...

    ### Stable successes
    - `id`: before: solved (hard 1.00, soft 1.00), answer `Y`; after: solved (...), answer `Y`

An empty group reads ``(none)``; trajectories are numbered from 1 across the whole section and
share the room the prompt size leaves (``trajectory.fit_trajectories``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from skillopt.core.prompts import ReplyModel, optimizer_prompt
from skillopt.core.records import ItemResult
from skillopt.llm.chat import ChatRequest, system, user
from skillopt.optimizer.reflect import room_left, skill_or_empty
from skillopt.optimizer.trajectory import elide_middle, fit_trajectories, one_line
from skillopt.skill.document import strip_markers

Pair = tuple[ItemResult, ItemResult]
PairPolicy = Literal["mixed", "changed", "unchanged"]

#: How much of an answer (and of the previous run's failure reason) a pair line shows.
ANSWER_CHARS = 300


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

    A pair with an error row on either side is left out: a failed model call says nothing about
    either skill. Raises ``ValueError`` when an id repeats on either side or the two sides hold
    different ids.
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
        if old.is_error or new.is_error:
            continue
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


def format_comparison(pairs: Pairs, *, section_chars: int | None = None,
                      trajectory_chars: int | None = None) -> str:
    """The ``## Comparison`` section (format in the module docstring).

    The new runs' trajectories share what ``section_chars`` leaves after the rest of the section
    (None: no limit), each at most ``trajectory_chars`` (``trajectory.fit_trajectories``).
    """
    lines = [
        "## Comparison",
        f"Improved: {len(pairs.improved)}",
        f"Regressed: {len(pairs.regressed)}",
        f"Persistent failures: {len(pairs.persistent_fail)}",
        f"Stable successes: {len(pairs.stable_success)}",
    ]
    groups = (("Improved", pairs.improved), ("Regressed", pairs.regressed),
              ("Persistent failures", pairs.persistent_fail))
    shown = [pair for _, group in groups for pair in group]
    stable = "\n".join(f"- `{after.id}`: {_side('before', before)}; {_side('after', after)}"
                       for before, after in pairs.stable_success) or "(none)"
    tail = f"\n### Stable successes\n{stable}"
    comparisons = [_pair_lines(before, after) for before, after in shown]
    headings = [f"\n### {title}\n" + ("" if group else "(none)") for title, group in groups]
    fixed = [*lines, *headings, *comparisons, tail]
    room = room_left(section_chars, *fixed, "\n" * (len(fixed) + 2 * len(shown)))
    blocks = iter(fit_trajectories([after for _, after in shown], budget_chars=room,
                                   per_trajectory_chars=trajectory_chars))
    notes = iter(comparisons)
    for title, group in groups:
        texts = [f"{next(blocks)}\n{next(notes)}" for _ in group]
        lines.append(f"\n### {title}\n" + ("\n\n".join(texts) if texts else "(none)"))
    lines.append(tail)
    return "\n".join(lines)


def _side(label: str, row: ItemResult) -> str:
    answer = elide_middle(one_line(row.predicted_answer), ANSWER_CHARS)
    outcome = "failed" if row.failed else "solved"
    text = f"{label}: {outcome} (hard {row.hard:.2f}, soft {row.soft:.2f}), answer `{answer or '(none)'}`"
    return text


def _pair_lines(before: ItemResult, after: ItemResult) -> str:
    """The previous and the new skill's answers and scores of one pair, under the new run's trajectory."""
    reason = f"; {elide_middle(one_line(before.fail_reason), ANSWER_CHARS)}" if before.fail_reason else ""
    return (f"Previous skill's run ({_side('outcome', before)}{reason})\n"
            f"New skill's run ({_side('outcome', after)})")


class SlowUpdateReply(ReplyModel):
    """``{"reasoning": str, "guidance": str}`` (§4.11)."""

    reasoning: str = ""
    guidance: str


def comparison_message(sections: Sequence[tuple[str, str]], pairs: Pairs, *, message_chars: int | None = None,
                       trajectory_chars: int | None = None) -> str:
    """``## <title>\n<text>`` for each ``(title, text)`` section, then ``format_comparison(pairs)``
    sized to what ``message_chars`` leaves (None: no limit)."""
    head = [f"## {title}\n{text}" for title, text in sections]
    room = room_left(message_chars, *head, "\n\n" * (len(head) + 1))
    comparison = format_comparison(pairs, section_chars=room, trajectory_chars=trajectory_chars)
    return "\n\n".join([*head, comparison]) + "\n"


def comparison_request(stage: Literal["slow_update", "meta_skill"], sections: Sequence[tuple[str, str]],
                       pairs: Pairs, *, prompt_chars: int | None = None,
                       trajectory_chars: int | None = None) -> ChatRequest:
    """An epoch-boundary call: the template named like ``stage`` as the system message, the
    ``sections`` and the comparison (sized to ``prompt_chars``) as the user message, tags
    ``{"item_ids"}`` (train items only)."""
    instructions = optimizer_prompt(stage) + "\n"
    message = comparison_message(sections, pairs, message_chars=room_left(prompt_chars, instructions),
                                 trajectory_chars=trajectory_chars)
    return ChatRequest(messages=[system(instructions), user(message)], stage=stage,
                       tags={"item_ids": pairs.ids()})


def block_text(text: str) -> str:
    """Model-written text for a protected block or the memory: stripped, protected-block markers removed."""
    return strip_markers(text).strip()


def slow_update_sections(*, start_skill: str, current_skill: str,
                         previous_guidance: str) -> list[tuple[str, str]]:
    """The slow-update message before the comparison: both skills and the previous guidance."""
    return [
        ("Skill at the start of the epoch", skill_or_empty(start_skill)),
        ("Current skill", skill_or_empty(current_skill)),
        ("Previous guidance", previous_guidance.strip() or "(none)"),
    ]


def slow_update_request(
    *, start_skill: str, current_skill: str, previous_guidance: str, pairs: Pairs,
    prompt_chars: int | None = None, trajectory_chars: int | None = None,
) -> ChatRequest:
    """The slow-update call: stage ``slow_update``, tags ``{"item_ids"}`` (train items only), sized
    to ``prompt_chars`` (None: whole trajectories)."""
    sections = slow_update_sections(start_skill=start_skill, current_skill=current_skill,
                                    previous_guidance=previous_guidance)
    return comparison_request("slow_update", sections, pairs, prompt_chars=prompt_chars,
                              trajectory_chars=trajectory_chars)


def guidance_from_reply(reply: SlowUpdateReply) -> str:
    """The new content of the slow-update block: the guidance stripped, protected-block markers removed."""
    return block_text(reply.guidance)
