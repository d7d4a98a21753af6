"""How one scored rollout reads in an optimizer prompt (DESIGN.md §4.3 step 2, BENCHMARKS.md §1.6).

``format_trajectory`` is shared by reflection, the slow update and the meta skill, so every
optimizer call sees a trajectory the same way::

    ### Trajectory 3: id `q-17`
    Task type: lookup
    Task: Who wrote ...?
    Outcome: failed; wrong: predicted 'X'
    Events:
    - [user] Who wrote ...?
    - [assistant] <answer>X</answer>
    - [tool] search "..." -> 3 results / ...
    - [step 2] go to desk 1 -> You arrive at desk 1.
    [EVALUATION RESULT] predicted 'X', expected 'Y' ...

The target's system message is left out (it holds the skill, which the prompt shows once). The
evaluation event is printed verbatim and never cut: it is the only place the reference answer
reaches the optimizer. Every other event is one line, cut to fit ``max_chars``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from skillopt.records import ItemResult

TRUNCATION_MARK = "…[truncated]"

# Below this many characters per event line, cutting every line stops being useful and events
# from the middle of the trajectory are left out instead (its start and its end matter most).
_MIN_EVENT_LINE = 160
_NEWLINES = re.compile(r"\s*\n\s*")


def one_line(text: str) -> str:
    """``text`` on one line: surrounding whitespace stripped, each line break (with the blanks
    around it) replaced by `` / ``."""
    return _NEWLINES.sub(" / ", text.strip())


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def format_event(event: Mapping[str, Any]) -> list[str]:
    """The lines (without the ``- `` bullet) one non-evaluation event contributes; ``[]`` for the
    target's system message.

    ``message`` → ``[<role>] <content>``; ``tool_call`` → ``[tool] <command> -> <observation>``;
    ``env_step`` → ``[step k] <action> -> <observation>``, preceded by ``[reasoning] <text>`` when
    the step recorded reasoning; any other type → ``[<type>] <content>`` (``feedback`` included).
    """
    kind = str(event.get("type", "event"))
    if kind == "message":
        role = str(event.get("role", "message"))
        if role == "system":
            return []
        return [f"[{role}] {one_line(_text(event.get('content')))}"]
    if kind == "tool_call":
        command, observation = one_line(_text(event.get("command"))), one_line(_text(event.get("observation")))
        return [f"[tool] {command} -> {observation}"]
    if kind == "env_step":
        action, observation = one_line(_text(event.get("action"))), one_line(_text(event.get("observation")))
        reasoning = one_line(_text(event.get("reasoning")))
        step = f"[step {event.get('step', '?')}] {action} -> {observation}"
        return [f"[reasoning] {reasoning}", step] if reasoning else [step]
    if "content" in event:
        content = _text(event.get("content"))
    else:
        content = json.dumps({k: v for k, v in event.items() if k != "type"}, ensure_ascii=False, default=str)
    return [f"[{kind}] {one_line(content)}"]


def format_trajectory(row: ItemResult, *, index: int, max_chars: int = 6000) -> str:
    """One trajectory block for an optimizer prompt (format in the module docstring).

    The block is at most ``max_chars`` long unless its header and evaluation event alone are
    longer (those are never cut). When the event lines do not fit, each is cut to a common
    length with ``…[truncated]``; if that length would fall below ``_MIN_EVENT_LINE``, events
    from the middle are left out too, replaced by one line that says how many.
    """
    outcome = "failed" if row.failed else "solved"
    header = [
        f"### Trajectory {index}: id `{row.id}`",
        f"Task type: {row.task_type}",
        f"Task: {row.task_description}",
        f"Outcome: {outcome}; {row.fail_reason or 'no failure'}",
        "Events:",
    ]
    events: list[str] = []
    evaluations: list[str] = []
    for event in row.trajectory:
        if event.get("type") == "evaluation":
            evaluations.append(_text(event.get("content")).strip("\n"))
        else:
            events.extend(f"- {line}" for line in format_event(event))
    if not events:
        events = ["- (none)"]
    fixed = sum(len(line) + 1 for line in header) + sum(len(text) + 1 for text in evaluations)
    events = _fit(events, max_chars - fixed)
    return "\n".join([*header, *events, *evaluations]).rstrip("\n")


def _size(lines: list[str]) -> int:
    return sum(len(line) + 1 for line in lines)


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(0, width - len(TRUNCATION_MARK))] + TRUNCATION_MARK


def _fit(lines: list[str], budget: int) -> list[str]:
    """``lines`` made to fit ``budget`` characters (newlines counted)."""
    if _size(lines) <= budget:
        return lines
    # The widest common cap that fits: every line longer than it is cut to it.
    low, high = 0, max(len(line) for line in lines)
    while low < high:
        middle = (low + high + 1) // 2
        if sum(min(len(line), middle) + 1 for line in lines) <= budget:
            low = middle
        else:
            high = middle - 1
    if low >= _MIN_EVENT_LINE:
        return [_cut(line, low) for line in lines]
    # Too many events: keep whole-ish lines from both ends and say how many were left out.
    cut = [_cut(line, _MIN_EVENT_LINE) for line in lines]
    head: list[str] = []
    tail: list[str] = []
    remaining = list(cut)
    while remaining:
        take_head = len(head) <= len(tail)
        candidate = remaining[0] if take_head else remaining[-1]
        omitted = len(remaining) - 1
        note = [f"- {TRUNCATION_MARK} {omitted} events left out"] if omitted else []
        if _size(head) + _size(tail) + len(candidate) + 1 + _size(note) > budget:
            break
        if take_head:
            head.append(remaining.pop(0))
        else:
            tail.insert(0, remaining.pop())
    if remaining:
        return [*head, f"- {TRUNCATION_MARK} {len(remaining)} events left out", *tail]
    return [*head, *tail]
