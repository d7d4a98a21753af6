"""What a chat target sees of a skill: ``SKILL.md``'s body, then each other text file.

This is ``skill.render: inline``.

The front matter is left out (it is for the agent that lists skills, not for the task), and every other
file follows the body under a heading naming its path, before the non-empty protected blocks::

    <SKILL.md body>

    ## Reference file: references/rules.md

    <its text>

A skill of one file without front matter renders exactly as ``skill.target_text`` does, so the
prompts of single-file runs are what they always were.
"""

from __future__ import annotations

from dataclasses import replace

from skillopt.core.errors import SkillFormatError
from skillopt.skill.document import SkillDocument
from skillopt.skill.files import SKILL_MD, split_files
from skillopt.skill.spec import front_matter

__all__ = ["render_inline"]

REFERENCE_HEADING = "## Reference file: {path}"


def render_inline(text: str) -> str:
    """The skill as a chat target's prompt holds it (format in the module docstring). Raises
    ``SkillFormatError`` for malformed protected-block markers."""
    document = SkillDocument.parse(text)
    files = split_files(document.body)
    skill_md = files.pop(SKILL_MD)
    try:
        _, body = front_matter(skill_md)
    except SkillFormatError:
        body = skill_md  # shown as written: the gate never lets such a skill through, a baseline may hold one
    if not files and body == skill_md:
        return document.target_text
    parts = [body.strip("\n")] if body.strip() else []
    parts += [f"{REFERENCE_HEADING.format(path=path)}\n\n{content}" for path, content in files.items()]
    return replace(document, body="\n\n".join(parts)).target_text
