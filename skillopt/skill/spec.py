"""The Agent Skills specification's rules for ``SKILL.md``'s front matter, checked on every candidate.

``SKILL.md`` opens with YAML front matter between two ``---`` lines: ``name`` (lowercase letters,
digits and hyphens, no leading, trailing or doubled hyphen, at most 64 characters, equal to the
folder's name) and ``description`` (non-empty, at most 1,024 characters); ``license``,
``allowed-tools``, ``metadata`` and ``compatibility`` (at most 500 characters) are the only other keys.
These are the rules the reference validator (``skills-ref``) applies; the tests hold the two to the
same verdicts. Values are read as strings, as that validator reads them.

``SkillSpec`` is what a run checks a candidate skill against: the folder name, and whether the skill
carries front matter (a single ``.md`` without one gets it only when exported).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

import yaml

from skillopt.core.errors import SkillFormatError
from skillopt.skill.document import SkillDocument
from skillopt.skill.files import SKILL_MD, split_files

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "MAX_NAME_CHARS",
    "SkillSpec",
    "front_matter",
    "metadata_problems",
    "skill_name_from",
]

MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_COMPATIBILITY_CHARS = 500
ALLOWED_FIELDS = frozenset({"name", "description", "license", "allowed-tools", "metadata", "compatibility"})


def front_matter(skill_md: str) -> tuple[dict[str, Any] | None, str]:
    """``(metadata, body)`` of a ``SKILL.md`` text; metadata is None when the text has no front matter.

    Raises ``SkillFormatError`` when the front matter is opened but never closed, is not YAML, or is
    not a mapping.
    """
    if not skill_md.startswith("---"):
        return None, skill_md
    first_line, _, rest = skill_md.partition("\n")
    if first_line.strip() != "---":
        return None, skill_md
    lines = rest.split("\n")
    for index, line in enumerate(lines):
        if line.strip() == "---":
            head, body = "\n".join(lines[:index]), "\n".join(lines[index + 1:])
            break
    else:
        raise SkillFormatError(
            "SKILL.md: the YAML front matter opened by '---' on line 1 is never closed by '---'")
    try:
        # BaseLoader reads every scalar as a string, as the reference validator does.
        metadata = yaml.load(head, Loader=yaml.BaseLoader)  # noqa: S506 - BaseLoader builds no objects
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" (front matter line {where.line + 1})" if where is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise SkillFormatError(f"SKILL.md: the front matter is not valid YAML{line}: {problem}") from None
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise SkillFormatError(
            "SKILL.md: the front matter must be a YAML mapping (name: ..., description: ...)")
    return metadata, body.lstrip("\n")


def metadata_problems(metadata: dict[str, Any], folder_name: str | None) -> list[str]:
    """What breaks the specification in ``metadata`` (empty = valid); ``folder_name`` None skips the
    check that ``name`` equals the folder's name."""
    problems: list[str] = []
    extra = sorted(set(metadata) - ALLOWED_FIELDS)
    if extra:
        problems.append(f"unexpected front matter keys: {', '.join(extra)} "
                        f"(allowed: {', '.join(sorted(ALLOWED_FIELDS))})")
    if "name" not in metadata:
        problems.append("front matter has no name")
    else:
        problems += _name_problems(metadata["name"], folder_name)
    description = metadata.get("description")
    if "description" not in metadata:
        problems.append("front matter has no description")
    elif not isinstance(description, str) or not description.strip():
        problems.append("description must be a non-empty string")
    elif len(description) > MAX_DESCRIPTION_CHARS:
        problems.append(
            f"description is {len(description)} characters; at most {MAX_DESCRIPTION_CHARS} allowed")
    compatibility = metadata.get("compatibility")
    if "compatibility" in metadata:
        if not isinstance(compatibility, str):
            problems.append("compatibility must be a string")
        elif len(compatibility) > MAX_COMPATIBILITY_CHARS:
            problems.append(f"compatibility is {len(compatibility)} characters; at most "
                            f"{MAX_COMPATIBILITY_CHARS} allowed")
    return problems


def _name_problems(value: Any, folder_name: str | None) -> list[str]:
    if not isinstance(value, str) or not value.strip():
        return ["name must be a non-empty string"]
    name = unicodedata.normalize("NFKC", value.strip())
    problems = []
    if len(name) > MAX_NAME_CHARS:
        problems.append(f"name {name!r} is {len(name)} characters; at most {MAX_NAME_CHARS} allowed")
    if name != name.lower():
        problems.append(f"name {name!r} must be lowercase")
    if name.startswith("-") or name.endswith("-"):
        problems.append(f"name {name!r} must not start or end with a hyphen")
    if "--" in name:
        problems.append(f"name {name!r} must not hold two hyphens in a row")
    if not all(c.isalnum() or c == "-" for c in name):
        problems.append(f"name {name!r} may hold only letters, digits and hyphens")
    if folder_name is not None and unicodedata.normalize("NFKC", folder_name) != name:
        problems.append(f"name {name!r} must match the skill's folder name {folder_name!r}")
    return problems


def skill_name_from(text: str) -> str:
    """A valid skill name made from ``text`` (a file stem, a benchmark id): lowercase letters, digits and
    single hyphens, at most 64 characters; ``skill`` when nothing is left."""
    cleaned = "".join(c if c.isascii() and c.isalnum() else "-" for c in text.lower())
    name = "-".join(part for part in cleaned.split("-") if part)[:MAX_NAME_CHARS].strip("-")
    return name or "skill"


@dataclass(frozen=True)
class SkillSpec:
    """What every candidate skill of a run must keep: ``name`` is the skill's folder name; with
    ``front_matter`` the skill's ``SKILL.md`` carries the front matter and must keep it valid."""

    name: str
    front_matter: bool

    def problem(self, text: str, *, current: str | None = None) -> str | None:
        """Why ``text`` breaks the specification, in one line; None when it holds. With ``current`` (the
        skill it would replace), a candidate that lost one of its files (a rewrite that dropped a
        ``<!-- FILE: … -->`` line) is refused too."""
        if current is not None:
            try:
                lost = [p for p in split_files(SkillDocument.parse(current).body)
                        if p not in split_files(SkillDocument.parse(text).body)]
            except SkillFormatError:
                lost = []
            if lost:
                return f"the update lost the file(s) {', '.join(lost)} (their marker lines are gone)"
        try:
            skill_md = split_files(SkillDocument.parse(text).body)[SKILL_MD]
            metadata, _ = front_matter(skill_md)
        except SkillFormatError as error:
            return str(error)
        if metadata is None:
            return "SKILL.md lost its YAML front matter (name, description)" if self.front_matter else None
        problems = metadata_problems(metadata, self.name)
        return "SKILL.md front matter: " + "; ".join(problems) if problems else None
