"""Deep probe: make the target show its intermediate judgement on a few items.

With ``gradient.deep_probe`` each step picks representative rows of its rollout
(``pick_probe_items``: ``deep_probe_failures`` failures and ``deep_probe_successes`` successes,
one per task type first), asks the optimizer for a short diagnostic instruction
(``probe_request`` → ``ProbeReply``), re-runs those items with the instruction appended to the
target's prompt under ``## Training readout`` (``benchmarks.runner.run_item(probe_instruction=…)``)
and reflects on the re-run trajectories as extra minibatches. ``probe_record`` is what
``StepRecord.probe`` keeps.

The user message is the analyst's without a budget section (``reflect.format_analyst_message``)::

    ## Current skill
    <skill, or "(empty)">

    ## Step buffer                 (only when not empty)
    ## Optimizer memory            (only when there is a meta skill)

    ## Trajectories
    <format_trajectory block 1> ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import field_validator

from skillopt.core.error_rows import answered_rows
from skillopt.core.prompts import ReplyModel, optimizer_prompt
from skillopt.core.records import ItemResult
from skillopt.llm.chat import ChatRequest
from skillopt.optimizer.reflect import analyst_chat_request
from skillopt.skill.document import strip_markers


def pick_probe_items(rows: Sequence[ItemResult], *, failures: int, successes: int) -> list[ItemResult]:
    """Up to ``failures`` failed rows, then up to ``successes`` solved rows, to probe.

    Error rows are never picked. Within each group, rows are taken in id order, one per task type first (task
    types in the order of their first id), then the rest; a repeated id is probed once. Deterministic: the
    result depends on the rows, not their order. Raises ``ValueError`` for a negative count.
    """
    if failures < 0 or successes < 0:
        raise ValueError(f"probe counts must be >= 0, got failures={failures}, successes={successes}")
    rows = answered_rows(rows)  # an error row has no judgement to probe
    return (_one_per_task_type_first([row for row in rows if row.failed], failures)
            + _one_per_task_type_first([row for row in rows if not row.failed], successes))


def _one_per_task_type_first(rows: Sequence[ItemResult], count: int) -> list[ItemResult]:
    by_id: dict[str, ItemResult] = {}
    for row in sorted(rows, key=lambda r: r.id):
        by_id.setdefault(row.id, row)
    first_of_type: dict[str, str] = {}
    for row in by_id.values():
        first_of_type.setdefault(row.task_type, row.id)
    firsts = list(first_of_type.values())
    ordered = firsts + [item_id for item_id in by_id if item_id not in set(firsts)]
    return [by_id[item_id] for item_id in ordered[:count]]


def probe_request(
    *,
    skill: str,
    rows: Sequence[ItemResult],
    step_buffer: str = "",
    meta_skill: str = "",
    prompt_chars: int | None = None,
    trajectory_chars: int | None = None,
    benchmark_guidance: str = "",
) -> ChatRequest:
    """The deep-probe call on the picked rows: stage ``deep_probe``, tags ``{"item_ids"}``; sized
    like an analyst's (``reflect.analyst_request``). ``benchmark_guidance`` (the benchmark's
    ``deep_probe.md``) says what readout suits its tasks."""
    instructions = optimizer_prompt("deep_probe") + "\n"
    if benchmark_guidance.strip():
        instructions += f"\n## Benchmark guidance\n{benchmark_guidance.strip()}\n"
    return analyst_chat_request(
        instructions,
        stage="deep_probe",
        tags={},
        skill=skill,
        budget=None,
        rows=rows,
        step_buffer=step_buffer,
        meta_skill=meta_skill,
        prompt_chars=prompt_chars,
        trajectory_chars=trajectory_chars,
    )


class ProbeReply(ReplyModel):
    """``{"reasoning": str, "probe_instruction": str}`` (§4.11). The instruction is stripped (and
    loses any protected-block marker); a blank one is a parse failure."""

    reasoning: str = ""
    probe_instruction: str

    @field_validator("probe_instruction")
    @classmethod
    def _an_instruction(cls, value: str) -> str:
        text = strip_markers(value).strip()
        if not text:
            raise ValueError("probe_instruction is empty: expected an instruction for the target")
        return text


def probe_record(
    instruction: str | None, rows: Sequence[ItemResult], *, fallback: str | None = None
) -> dict[str, Any]:
    """``StepRecord.probe``: the instruction (None when the call failed), the ids of ``rows`` (the
    probe's re-runs, or the picked rows when there was no re-run), how many of them failed, and why
    the probe fell back, if it did."""
    return {
        "instruction": instruction,
        "item_ids": [row.id for row in rows],
        "n_fail": sum(row.failed for row in rows),
        "fallback": fallback,
    }
