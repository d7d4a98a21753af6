"""The ``scripted`` target for the OfficeQA fixtures (tests/fixtures/officeqa, BENCHMARKS.md §3.8).

It follows the tool protocol so a scripted run exercises the tool loop: the gross-public-debt item
greps, reads the hit and answers ``$255,724 million`` (solved); the receipts item greps once and
answers a rounded ``12.4%`` (missed); the savings-bond item globs once and answers ``4`` (solved).
With tools off it answers at once. Each step is chosen from the conversation so far, so the
replies are deterministic and need no state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from skillopt.llm.chat import ChatRequest

_TOOL_RESULT = re.compile(r"<tool_result>\n?(.*?)\n?</tool_result>", re.DOTALL)
_FIRST_HIT = re.compile(r"^(\d+): ", re.MULTILINE)

#: A step gets (candidate paths, the last tool result) and returns the reply.
Step = Callable[[Sequence[str], str], str]


def _call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _read_first_hit(candidates: Sequence[str], result: str) -> str:
    hit = _FIRST_HIT.search(result)
    start = int(hit.group(1)) if hit else 1
    return "The grep found the row; reading around it.\n" + _call("read", path=candidates[0], start=start, limit=3)


_PLANS: tuple[tuple[re.Pattern[str], str, Sequence[Step]], ...] = (
    (
        re.compile(r"## Question\nPer the March 1950 Treasury Bulletin, what was the gross public debt"),
        "<answer>$255,724 million</answer>",
        (
            lambda files, _: "First find the debt row.\n" + _call("grep", pattern="Gross public debt", path=files[0]),
            _read_first_hit,
            lambda files, _: "The row reads 255,724 (millions of dollars).\n<answer>$255,724 million</answer>",
        ),
    ),
    (
        re.compile(r"## Question\nPercent change in total receipts"),
        "<answer>12.4%</answer>",
        (
            lambda files, _: _call("grep", pattern="Total receipts", path=files[0]),
            lambda files, _: "Roughly a twelve percent rise.\n<answer>12.4%</answer>",
        ),
    ),
    (
        re.compile(r"## Question\nHow many savings bond series were outstanding in June 1961"),
        "<answer>4</answer>",
        (
            lambda files, _: _call("glob", pattern="*1961*"),
            lambda files, _: "Series E, H, J and K were outstanding.\n<answer>4</answer>",
        ),
    ),
)


def _candidates(text: str) -> list[str]:
    section = text.split("## Candidate Files\n", 1)
    if len(section) < 2:
        return []
    return [line[2:].strip() for line in section[1].splitlines() if line.startswith("- /")]


def scripted_target(request: ChatRequest, seed: int) -> str | None:
    """The next protocol step for a fixture question; None declines any other item."""
    first_user = next((m.text() for m in request.messages if m.role == "user"), "")
    system_text = "\n".join(m.text() for m in request.messages if m.role == "system")
    results = [
        found.group(1)
        for m in request.messages
        if m.role == "user" and (found := _TOOL_RESULT.search(m.text())) is not None
    ]
    for pattern, direct, steps in _PLANS:
        if not pattern.search(first_user):
            continue
        candidates = _candidates(first_user)
        if "<tool_call>" not in system_text or not candidates:
            return f"Answering from the pages given.\n{direct}"
        step = steps[min(len(results), len(steps) - 1)]
        return step(candidates, results[-1] if results else "")
    return None
