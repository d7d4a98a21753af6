"""Scripted target replies keyed on the question, for a plug-in's ``scripted_rules`` (BENCHMARKS.md §1.11).

A ``scripted`` rule's ``user`` pattern sees only the last user message, which on a self-check
turn (§1.8) is the harness's feedback, not the question. A plug-in handler built on
:func:`reply_for_question` reads the first user message instead, so the scripted target gives the
same reply on every turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from skillopt.llm.chat import ChatRequest

#: ``(pattern searched in the first user message, reply text)`` pairs; the first match wins.
ReplyTable = Sequence[tuple[re.Pattern[str], str]]


def reply_for_question(request: ChatRequest, replies: ReplyTable) -> str | None:
    """The reply whose pattern matches the request's first user message, or None to decline."""
    question = next((m.text() for m in request.messages if m.role == "user"), "")
    return next((reply for pattern, reply in replies if pattern.search(question)), None)
