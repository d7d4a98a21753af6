"""Reading a skill named on the command line: a file, a folder, a run directory or a registry version.

A skill reference is one of:

- ``initial``: the benchmark's starting skill (``train.skill_init``, else the plug-in's initial skill);
- ``registry:<bench>`` or ``registry:<bench>@<version>``: the promoted skill of the registry
  (``run.skills_dir``), its current version or version ``N``;
- a run directory (it holds ``summary.json`` or ``best_skill.md``): its ``best_skill.md``;
- an Agent Skills folder (it holds ``SKILL.md``): every trainable file of it, read as training reads it;
- a markdown file: a run's skill text (``best_skill.md``, ``skills/step_NNNN.md``, whose file markers must
  name paths inside the folder), else a single-file skill read as training reads it.

Files and folders are read with the run's ``skill`` settings (``max_file_bytes``, ``train_scripts``) and
the same checks as ``train.skill_init`` (front matter, size, UTF-8, symlinks), so a skill scores here as it
trained. Every problem is a ``SkillSourceError`` naming the reference and what was wrong, raised before any
model call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skillopt.core.errors import SkillFormatError, SkillOptError
from skillopt.skill.document import SkillDocument, skill_hash
from skillopt.skill.files import has_file_markers

if TYPE_CHECKING:
    from skillopt.core.config import SkillSection

REGISTRY_PREFIX = "registry:"
INITIAL = "initial"
#: What a run directory's best skill is called, and what an Agent Skills folder's main file is called.
BEST_SKILL = "best_skill.md"
SKILL_FILE = "SKILL.md"


class SkillSourceError(SkillOptError):
    """A skill reference that cannot be read: the message names it and says why."""


@dataclass(frozen=True)
class SkillSource:
    """A skill read from a reference: its text, where it came from (for people) and its hash."""

    reference: str
    origin: str
    text: str

    @property
    def sha(self) -> str:
        return skill_hash(self.text)


def read_skill(reference: str, *, initial: str | None = None, skills_dir: Path | str | None = None,
               benchmark: str | None = None, settings: SkillSection | None = None) -> SkillSource:
    """The skill ``reference`` names. ``initial`` is the benchmark's starting skill (for ``initial``);
    ``skills_dir`` the registry folder (for ``registry:``); ``benchmark`` the default benchmark of a
    ``registry:@N`` reference; ``settings`` the run's ``skill`` section (defaults when None)."""
    if reference == INITIAL:
        if initial is None:
            raise SkillSourceError("skill 'initial': the benchmark's starting skill is not known here")
        return SkillSource(reference, "the benchmark's initial skill", _checked(initial, reference))
    if reference.startswith(REGISTRY_PREFIX):
        return _from_registry(reference, skills_dir, benchmark)
    path = Path(reference)
    if path.is_dir():
        if (path / BEST_SKILL).is_file():  # a run directory: its best skill (all files in one text)
            return SkillSource(reference, str(path / BEST_SKILL), _read(path / BEST_SKILL, reference))
        if (path / SKILL_FILE).is_file():  # an Agent Skills folder: every trainable file of it
            return SkillSource(reference, str(path), _loaded(path, reference, settings))
        raise SkillSourceError(f"skill {reference}: a folder without {BEST_SKILL} (a run directory) or "
                               f"{SKILL_FILE} (a skill folder)")
    if not path.is_file():
        raise SkillSourceError(f"skill {reference}: no such file or folder (give a .md file, a folder with "
                               f"{SKILL_FILE}, a run directory, 'initial' or registry:<bench>@<version>)")
    from skillopt.skill.folder import is_markdown

    if not is_markdown(path):
        raise SkillSourceError(f"skill {reference}: not a markdown file (give a .md file, a folder with "
                               f"{SKILL_FILE}, a run directory, 'initial' or registry:<bench>@<version>)")
    text = _read(path, reference)
    if has_file_markers(text):  # a run's skill text: the files of a folder in one text
        _check_file_paths(text, reference)
        return SkillSource(reference, str(path), text)
    return SkillSource(reference, str(path), _loaded(path, reference, settings))


def _from_registry(reference: str, skills_dir: Path | str | None, benchmark: str | None) -> SkillSource:
    from skillopt.run.registry import RegistryError, SkillRegistry

    name, _, version_text = reference[len(REGISTRY_PREFIX):].partition("@")
    name = name or (benchmark or "")
    if not name:
        raise SkillSourceError(f"skill {reference}: name the benchmark, e.g. registry:demo@2")
    if skills_dir is None:
        raise SkillSourceError(f"skill {reference}: no registry folder (run.skills_dir) is known here")
    registry = SkillRegistry(Path(skills_dir))
    try:
        if version_text:
            if not version_text.isdigit():
                raise SkillSourceError(f"skill {reference}: the version after '@' must be a number, got "
                                       f"{version_text!r}")
            version = int(version_text)
            text = registry.version_text(name, version)
        else:
            current = registry.current(name)
            if current is None:
                raise SkillSourceError(f"skill {reference}: nothing is promoted for {name} in "
                                       f"{registry.folder(name)}")
            version, text = current.version, current.text
    except RegistryError as error:
        raise SkillSourceError(f"skill {reference}: {error}") from None
    return SkillSource(reference, f"registry {name} version {version}", _checked(text, reference))


def _loaded(path: Path, reference: str, settings: SkillSection | None) -> str:
    """A folder or a single-file skill, read and checked as ``train.skill_init`` reads it."""
    from skillopt.core.config import SkillSection
    from skillopt.skill.folder import SkillFolderError, load_skill

    settings = settings or SkillSection()
    try:
        text = load_skill(path, max_file_bytes=settings.max_file_bytes,
                          train_scripts=settings.train_scripts).text
    except SkillFolderError as error:
        said = str(error)  # names the file, which may be the reference itself
        raise SkillSourceError(f"skill {said}" if said.startswith(f"{reference}:") else
                               f"skill {reference}: {said}") from None
    return _checked(text, reference)


def _check_file_paths(text: str, reference: str) -> None:
    """Every file a run's skill text names stays inside the skill's folder."""
    from skillopt.skill.files import split_files
    from skillopt.skill.folder import SkillFolderError, safe_relative

    for relative in split_files(SkillDocument.parse(text).body):
        try:
            safe_relative(relative)
        except SkillFolderError as error:
            raise SkillSourceError(f"skill {reference}: {error}") from None


def _read(path: Path, reference: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SkillSourceError(f"skill {reference}: {path} is not UTF-8 text") from None
    except OSError as error:
        raise SkillSourceError(f"skill {reference}: cannot read {path}: {error.strerror or error}") from None
    return _checked(text, reference)


def _checked(text: str, reference: str) -> str:
    """``text`` if it parses as a skill document (protected blocks well formed, no NUL byte)."""
    if "\x00" in text:
        raise SkillSourceError(f"skill {reference}: binary content (a NUL byte), not a markdown skill")
    try:
        SkillDocument.parse(text)
    except SkillFormatError as error:
        raise SkillSourceError(f"skill {reference}: does not parse: {error}") from None
    return text


def skill_tokens(text: str) -> int:
    """The skill's length in tokens as the target sees it, estimated as characters / 4 (rounded up)."""
    from skillopt.skill.document import target_text

    return (len(target_text(text)) + 3) // 4
