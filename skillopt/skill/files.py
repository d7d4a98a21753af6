"""A multi-file skill held as one text: ``SKILL.md`` first, then each other file behind a marker line.

An Agent Skills folder (``SKILL.md`` plus ``references/``, ``assets/`` …) travels through a run as one
canonical string, so hashing, caching, diffs, snapshots and the step machinery treat it exactly like a
single-file skill. The layout of that string's body (the part before any protected block)::

    <SKILL.md, front matter included>

    <!-- FILE: references/rules.md -->
    <text of references/rules.md>

    <!-- FILE: assets/template.txt -->
    <text of assets/template.txt>

A marker is a line of its own, exactly ``<!-- FILE: <relative path> -->``; the text before the first
marker is ``SKILL.md``. A skill without markers is a folder of one ``SKILL.md``: the single-file skill
of earlier runs, whose text is unchanged. Files are kept in the order given (``SKILL.md`` always
first); every file's text loses its trailing whitespace, like the body of a ``SkillDocument``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = [
    "SKILL_MD",
    "file_marker",
    "file_paths",
    "has_file_markers",
    "join_files",
    "normalise_path",
    "split_files",
    "strip_file_markers",
]

SKILL_MD = "SKILL.md"
_FILE_MARKER_RE = re.compile(r"^<!-- FILE: ([^\n]*?) -->[ \t]*$", re.MULTILINE)


def file_marker(path: str) -> str:
    """The marker line that opens file ``path`` in a skill's text."""
    return f"<!-- FILE: {path} -->"


def normalise_path(path: str | None) -> str:
    """A file name as an edit or a reply may write it (``./references/a.md``, ``\\``-separated, blank =
    ``SKILL.md``) in the form the markers use: a relative POSIX path."""
    text = (path or "").strip().replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    return text.strip("/") or SKILL_MD


def has_file_markers(text: str) -> bool:
    """Whether ``text`` holds at least one file marker line."""
    return _FILE_MARKER_RE.search(text) is not None


def strip_file_markers(text: str) -> str:
    """``text`` with every file marker line removed (an edit's content must not open a file)."""
    return _FILE_MARKER_RE.sub("", text)


def split_files(body: str) -> dict[str, str]:
    """The files of a skill body, ``SKILL.md`` first, each with its trailing whitespace removed.

    A path that appears twice keeps its first text and has the second appended after a blank line,
    so no text is ever lost (the loader never writes such a body).
    """
    files: dict[str, str] = {}
    matches = list(_FILE_MARKER_RE.finditer(body))
    first_end = matches[0].start() if matches else len(body)
    files[SKILL_MD] = body[:first_end].rstrip()
    for position, match in enumerate(matches):
        end = matches[position + 1].start() if position + 1 < len(matches) else len(body)
        path = normalise_path(match.group(1))
        content = body[match.end():end].strip("\n").rstrip()
        files[path] = f"{files[path]}\n\n{content}".strip("\n") if path in files else content
    return files


def join_files(files: Mapping[str, str]) -> str:
    """The body holding ``files`` (``SKILL.md`` first whatever the mapping's order); inverse of
    ``split_files`` for canonical bodies."""
    parts = [files.get(SKILL_MD, "").rstrip()]
    for path, content in files.items():
        if path == SKILL_MD:
            continue
        text = content.strip("\n").rstrip()
        parts.append(f"{file_marker(path)}\n{text}" if text else file_marker(path))
    head, *rest = parts
    if not rest:
        return head
    return "\n\n".join([head, *rest]) if head else "\n\n".join(rest)


def file_paths(body: str) -> list[str]:
    """The files of a skill body, ``SKILL.md`` first."""
    return list(split_files(body))
