"""Scripted target rules keyed on the question, for a plug-in's ``scripted_rules`` (BENCHMARKS.md §1.11).

A ``scripted`` rule's ``user`` pattern sees only the last user message, which on a self-check
turn (§1.8) is the harness's feedback, not the question. The rules built here match with the
``question`` key (the first user message) instead, so the scripted target gives the same reply on
every turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

#: ``(pattern searched in the first user message, reply text)`` pairs; the first match wins.
ReplyTable = Sequence[tuple[re.Pattern[str], str]]


def question_rules(benchmark: str, replies: ReplyTable) -> tuple[dict[str, Any], ...]:
    """One ``rollout`` rule per ``(pattern, reply)`` of ``replies``, in order."""
    return tuple({"name": f"{benchmark} fixture target {number}", "stage": "rollout", "question": pattern.pattern,
                  "text": reply} for number, (pattern, reply) in enumerate(replies, start=1))
