"""The execution-notes appendix (``optimizer.use_appendix``).

Failure analysts may classify a failure as "the rule exists but was not followed" and return
short reminders (``Patch.execution_notes``). After the gate, the flow folds the notes of the step
into the skill's ``APPENDIX`` protected block (``with_execution_notes``): one ``- `` bullet per
note, deduplicated case- and whitespace-insensitively, at most ``max_notes`` (the newest win).
Edits and rewrites never touch the block; only this does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from skillopt.optimizer.trajectory import one_line
from skillopt.skill.document import APPENDIX, SkillDocument, extract_block, replace_block, strip_markers

#: How many notes the appendix keeps by default.
MAX_NOTES = 12

_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


def note_key(note: str) -> str:
    """What two notes share when they are the same note: case and whitespace ignored."""
    return " ".join(note.split()).casefold()


def existing_notes(block: str | None) -> list[str]:
    """The notes of an appendix block's content: one per non-blank line, bullet removed."""
    return [_BULLET.sub("", line).strip() for line in (block or "").splitlines() if line.strip()]


def merge_notes(existing: str | None, notes: Iterable[str], *, max_notes: int = MAX_NOTES) -> str:
    """The appendix content after adding ``notes`` to the ``existing`` content (None = no block).

    Every note is put on one line without a leading bullet or protected-block markers; blank notes are
    dropped; a note equal to an earlier one (ignoring case and whitespace) is dropped, so the
    first wording and position stay; when more than ``max_notes`` remain, the oldest go. Returns
    ``- `` bullets, one per line ("" for none). Raises ``ValueError`` for a negative ``max_notes``.
    """
    if max_notes < 0:
        raise ValueError(f"max_notes must be >= 0, got {max_notes}")
    kept: dict[str, str] = {}
    for note in [*existing_notes(existing), *notes]:
        text = _BULLET.sub("", one_line(strip_markers(note))).strip()
        if text:
            kept.setdefault(note_key(text), text)
    newest = list(kept.values())[-max_notes:] if max_notes else []
    return "\n".join(f"- {note}" for note in newest)


def with_execution_notes(skill: str, notes: Iterable[str], *, max_notes: int = MAX_NOTES) -> str:
    """``skill`` with ``notes`` merged into its ``APPENDIX`` block (created if absent and there is a
    note to keep); the body and the slow-update block are untouched. Returns canonical text."""
    existing = extract_block(skill, APPENDIX)
    merged = merge_notes(existing, notes, max_notes=max_notes)
    if existing is None and not merged:
        return SkillDocument.parse(skill).text
    return replace_block(skill, APPENDIX, merged)
