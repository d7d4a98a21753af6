"""How one scored rollout reads in an optimizer prompt.

``format_trajectory`` is shared by reflection, the deep probe, the slow update and the meta skill,
so every optimizer call sees a trajectory the same way::

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
evaluation event is printed verbatim and never shortened: it is the only place the reference
answer reaches the optimizer.

Trajectories are shown whole when they fit. Otherwise the *longest fields* (an event's content,
a tool's command or observation, a step's action, observation or reasoning, the task line, the
failure reason) are shortened to a common width by eliding their middle, marked
``[… N characters elided …]``: a third of the kept text comes from the start and two thirds
from the end, so the question's end (its choices), the last lines of a reasoning (its final
answer) and a tool result's tail survive. Only when even that leaves every field below
``MIN_FIELD_CHARS`` are whole events from the middle left out (``[… N events elided …]``); the
first user message and the last events always stay. ``fit_trajectories`` shares one character
budget among the trajectories of a prompt: short ones are shown whole and the long ones share
what is left.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skillopt.core.records import ItemResult
from skillopt.llm.context import CHARS_PER_TOKEN

#: Below this many characters per field, shortening fields stops being useful and events from the
#: middle of the trajectory are left out instead (its start and its end matter most).
MIN_FIELD_CHARS = 160
#: The share of a shortened field kept from its start; the rest comes from its end.
HEAD_SHARE = 1 / 3
_NEWLINES = re.compile(r"\s*\n\s*")


def one_line(text: str) -> str:
    """``text`` on one line: surrounding whitespace stripped, each line break (with the blanks
    around it) replaced by `` / ``."""
    return _NEWLINES.sub(" / ", text.strip())


def elision_marker(count: int, unit: str = "characters") -> str:
    return f"[… {count} {unit} elided …]"


def elide_middle(text: str, width: int) -> str:
    """``text`` if it is at most ``width`` characters, else its start and end around an elision
    marker, at most ``width`` characters in all (a third from the start, two thirds from the end)."""
    if len(text) <= width:
        return text
    keep = max(0, width - len(elision_marker(len(text))))
    head = int(keep * HEAD_SHARE)
    tail = keep - head
    return text[:head] + elision_marker(len(text) - keep) + (text[len(text) - tail:] if tail else "")


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass
class _Line:
    """One line of a block: fixed text around fields that may be shortened.

    ``parts`` alternates literal text (even positions) and shortenable fields (odd positions)."""

    parts: list[str]

    def render(self, width: int | None) -> str:
        return "".join(part if i % 2 == 0 or width is None else elide_middle(part, width)
                       for i, part in enumerate(self.parts))

    def size(self, width: int | None) -> int:
        return sum(len(part) if i % 2 == 0 or width is None else min(len(part), width)
                   for i, part in enumerate(self.parts)) + 1


def _line(*parts: str) -> _Line:
    return _Line(list(parts))


def _event_lines(event: Mapping[str, Any]) -> list[_Line]:
    """The bulleted lines one non-evaluation event contributes; ``[]`` for the target's system message.

    ``message`` → ``[<role>] <content>``; ``tool_call`` → ``[tool] <command> -> <observation>``;
    ``env_step`` → ``[step k] <action> -> <observation>``, preceded by ``[reasoning] <text>`` when
    the step recorded reasoning; any other type → ``[<type>] <content>`` (``feedback`` included).
    """
    kind = str(event.get("type", "event"))
    if kind == "message":
        role = str(event.get("role", "message"))
        if role == "system":
            return []
        return [_line(f"- [{role}] ", one_line(_text(event.get("content"))))]
    if kind == "tool_call":
        return [_line("- [tool] ", one_line(_text(event.get("command"))), " -> ",
                      one_line(_text(event.get("observation"))))]
    if kind == "env_step":
        reasoning = one_line(_text(event.get("reasoning")))
        step = _line(f"- [step {event.get('step', '?')}] ", one_line(_text(event.get("action"))), " -> ",
                     one_line(_text(event.get("observation"))))
        return [_line("- [reasoning] ", reasoning), step] if reasoning else [step]
    if "content" in event:
        content = _text(event.get("content"))
    else:
        content = json.dumps({k: v for k, v in event.items() if k != "type"}, ensure_ascii=False, default=str)
    return [_line(f"- [{kind}] ", one_line(content))]


@dataclass
class _Block:
    header: list[_Line]
    events: list[list[_Line]]  # the lines of each event, in order
    evaluations: list[str]
    #: The event the question is in (the first user message): never left out.
    question_event: int | None

    def render(self, max_chars: int | None) -> str:
        events = self.events
        width = None
        if max_chars is not None and self._size(events, None) > max_chars:
            width = self._widest(events, max_chars)
            if width < MIN_FIELD_CHARS:
                events = self._fewer_events(max_chars)
                width = max(self._widest(events, max_chars), 0)
        lines = [line.render(width) for line in [*self.header, *(line for event in events for line in event)]]
        if not events:
            lines.append("- (none)")
        return "\n".join([*lines, *self.evaluations]).rstrip("\n")

    def _size(self, events: list[list[_Line]], width: int | None) -> int:
        lines = [*self.header, *(line for event in events for line in event)]
        return sum(line.size(width) for line in lines) + sum(len(text) + 1 for text in self.evaluations)

    def _widest(self, events: list[list[_Line]], max_chars: int) -> int:
        """The widest common field width at which the block fits ``max_chars`` (0 if none does)."""
        low, high = 0, max((len(p) for line in [*self.header, *(x for e in events for x in e)]
                            for p in line.parts[1::2]), default=0)
        while low < high:
            middle = (low + high + 1) // 2
            if self._size(events, middle) <= max_chars:
                low = middle
            else:
                high = middle - 1
        return low

    def _fewer_events(self, max_chars: int) -> list[list[_Line]]:
        """Events from both ends (the question's event always) with one marker for the ones left
        out, as many as fit with every field at least ``MIN_FIELD_CHARS`` wide."""
        count = len(self.events)
        keep_first = {self.question_event} if self.question_event is not None else set()
        head, tail = 0, 0
        chosen: list[list[_Line]] = []
        while head + tail < count:
            take_head = head <= tail
            trial_head, trial_tail = (head + 1, tail) if take_head else (head, tail + 1)
            trial = self._pick(keep_first, trial_head, trial_tail)
            if self._size(trial, MIN_FIELD_CHARS) > max_chars:
                break
            head, tail, chosen = trial_head, trial_tail, trial
        return chosen or self._pick(keep_first, 0, 1)

    def _pick(self, always: set[int], head: int, tail: int) -> list[list[_Line]]:
        count = len(self.events)
        kept = sorted(set(range(min(head, count))) | set(range(max(0, count - tail), count)) | always)
        out: list[list[_Line]] = []
        previous = -1
        for index in kept:
            if index - previous > 1:
                out.append([_line(f"- {elision_marker(index - previous - 1, 'events')}")])
            out.append(self.events[index])
            previous = index
        if count - 1 - previous > 0:
            out.append([_line(f"- {elision_marker(count - 1 - previous, 'events')}")])
        return out


def _block(row: ItemResult, index: int) -> _Block:
    outcome = "failed" if row.failed else "solved"
    header = [
        _line(f"### Trajectory {index}: id `{row.id}`"),
        _line(f"Task type: {row.task_type}"),
        _line("Task: ", one_line(row.task_description)),
        _line(f"Outcome: {outcome}; ", one_line(row.fail_reason or "no failure")),
        _line("Events:"),
    ]
    events: list[list[_Line]] = []
    evaluations: list[str] = []
    question_event = None
    for event in row.trajectory:
        if event.get("type") == "evaluation":
            evaluations.append(_text(event.get("content")).strip("\n"))
            continue
        lines = _event_lines(event)
        if not lines:
            continue
        if question_event is None and event.get("type") == "message" and event.get("role") == "user":
            question_event = len(events)
        events.append(lines)
    return _Block(header, events, evaluations, question_event)


def format_trajectory(row: ItemResult, *, index: int, max_chars: int | None = None) -> str:
    """One trajectory block for an optimizer prompt (format and shortening in the module docstring).

    ``max_chars`` None shows the whole trajectory. Otherwise the block is at most ``max_chars``
    long unless its fixed parts (header labels, the evaluation event, the elision markers) alone
    are longer: those are never cut.
    """
    return _block(row, index).render(max_chars)


def _left_out(count: int) -> str:
    return f"({count} more trajectories left out: the prompt has no room for them in the context window)"


def trajectory_chars(tokens: int | None) -> int | None:
    """``gradient.trajectory_tokens`` in characters (None: no per-trajectory cap)."""
    return tokens * CHARS_PER_TOKEN if tokens else None


def fit_trajectories(rows: Sequence[ItemResult], *, budget_chars: int | None, first_index: int = 1,
                     per_trajectory_chars: int | None = None, drop_to_fit: bool = False) -> list[str]:
    """The blocks of ``rows`` (numbered from ``first_index``) sharing ``budget_chars`` characters
    (the blank lines between blocks counted), each at most ``per_trajectory_chars`` when given.

    A block that fits a fair share is shown whole and leaves the rest to the longer ones: the
    result uses the largest common cap at which the blocks fit. ``budget_chars`` None means
    no shared limit. With ``drop_to_fit``, when even the blocks' uncuttable parts (headers,
    evaluations) pass the budget (a small context window), the last blocks are left out, at least
    one kept, and a last line says how many.
    """
    blocks = [_block(row, i) for i, row in enumerate(rows, start=first_index)]
    if not blocks:
        return []
    if drop_to_fit and budget_chars is not None:
        floors = [len(block.render(0)) + 2 for block in blocks]
        kept = len(blocks)
        while kept > 1 and sum(floors[:kept]) + len(_left_out(len(blocks) - kept)) > budget_chars:
            kept -= 1
        if kept < len(blocks):
            note = _left_out(len(blocks) - kept)
            return [*fit_trajectories(rows[:kept], budget_chars=budget_chars - len(note) - 2,
                                      first_index=first_index, per_trajectory_chars=per_trajectory_chars),
                    note]

    def render(cap: int | None) -> list[str]:
        caps = [c for c in (cap, per_trajectory_chars) if c is not None]
        return [block.render(min(caps) if caps else None) for block in blocks]

    def total(texts: list[str]) -> int:
        return sum(len(text) for text in texts) + 2 * (len(texts) - 1)

    whole = render(None)
    if budget_chars is None or total(whole) <= budget_chars:
        return whole
    low, high = 0, max(len(text) for text in whole)
    while low < high:
        middle = (low + high + 1) // 2
        if total(render(middle)) <= budget_chars:
            low = middle
        else:
            high = middle - 1
    return render(low)
