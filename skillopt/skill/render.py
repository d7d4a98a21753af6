"""What a chat target sees of a skill: ``SKILL.md``'s body, then each other text file.

This is ``skill.render: inline``.

The front matter is left out (it is for the agent that lists skills, not for the task). The non-empty
protected blocks (the epoch guidance, the appendix) belong to ``SKILL.md`` and follow its body, as they do in
an exported folder; every other file comes after them under a heading naming its path::

    <SKILL.md body>

    <!-- SLOW_UPDATE_START -->
    <guidance>
    <!-- SLOW_UPDATE_END -->

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
    skill_part = replace(document, body=body.strip("\n")).target_text.strip("\n")  # with its blocks
    parts = [skill_part] if skill_part else []
    parts += [f"{REFERENCE_HEADING.format(path=path)}\n\n{content}" for path, content in files.items()]
    return "\n\n".join(parts) + "\n" if parts else ""
