"""Per-file changes between two skill texts: which files of a skill folder an update changed, and how.

A skill's text holds its files behind marker lines (``skill_files``); the protected blocks belong to
``SKILL.md`` (they are written at its end when the skill becomes a folder), so a change to them is a
change to ``SKILL.md``. A file present on one side only is diffed against the empty text.
"""

from __future__ import annotations

from skillopt.core.errors import SkillFormatError
from skillopt.skill.document import SkillDocument, unified_diff
from skillopt.skill.files import SKILL_MD, split_files

__all__ = ["changed_files", "file_diffs", "skill_file_texts"]


def skill_file_texts(text: str) -> dict[str, str]:
    """Each file's text, ``SKILL.md`` (with its non-empty protected blocks) first; a malformed skill is one
    ``SKILL.md`` holding the text as written."""
    try:
        document = SkillDocument.parse(text)
    except SkillFormatError:
        return {SKILL_MD: text}
    files = split_files(document.body)
    files[SKILL_MD] = SkillDocument(body=files[SKILL_MD], slow_update=document.slow_update,
                                    appendix=document.appendix).target_text.rstrip("\n")
    return files


def changed_files(old: str, new: str) -> list[str]:
    """The files whose text differs between ``old`` and ``new`` (added and removed files included), in
    ``new``'s order, then the removed ones."""
    before, after = skill_file_texts(old), skill_file_texts(new)
    paths = [*after, *(p for p in before if p not in after)]
    return [path for path in paths if before.get(path, "") != after.get(path, "")]


def file_diffs(old: str, new: str, *, old_label: str = "before", new_label: str = "after") -> dict[str, str]:
    """A unified diff per changed file (``changed_files`` order), each named ``<label>/<path>``."""
    before, after = skill_file_texts(old), skill_file_texts(new)
    return {path: unified_diff(before.get(path, ""), after.get(path, ""), old_name=f"{old_label}/{path}",
                               new_name=f"{new_label}/{path}")
            for path in changed_files(old, new)}
