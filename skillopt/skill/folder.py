"""Agent Skills folders on disk: read one into a run's skill text, and write a skill text back as a folder.

A folder holds ``SKILL.md`` (YAML front matter, then the body) and optionally ``references/``,
``scripts/``, ``assets/`` and other files. ``load_skill`` reads it into one canonical text
(``skill_files``): ``SKILL.md`` and every other UTF-8 text file (up to ``max_file_bytes``) are
trainable; binary files and, unless ``train_scripts``, the files under ``scripts/`` are *carried*:
kept byte for byte and written back unchanged. A single ``.md`` file is a folder of one ``SKILL.md``,
read exactly as written (its front matter, if it has none, is added when the skill is written out).

Bad input raises ``SkillFolderError`` with one line naming the file: no ``SKILL.md``, broken front
matter, a symlink leading out of the folder, a text file over the size limit, a text file that is not
UTF-8, a file holding a line skillopt uses as a file marker. Nothing is written by loading.

``write_skill_folder`` writes a skill text (with its carried files and, for a skill without front
matter, the given name and description) as ``<dest>/``: ``SKILL.md`` gets the protected blocks that
are not empty, every other file its own path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import yaml

from skillopt.core.atomic import process_umask
from skillopt.core.errors import SkillFormatError, SkillOptError
from skillopt.skill.document import SkillDocument, strip_markers
from skillopt.skill.files import SKILL_MD, has_file_markers, join_files, split_files
from skillopt.skill.spec import front_matter, metadata_problems, skill_name_from

__all__ = [
    "BINARY_SUFFIXES",
    "LoadedSkill",
    "SkillFolderError",
    "folder_files",
    "is_markdown",
    "load_skill",
    "safe_relative",
    "skill_folder_files",
    "skill_from_text",
    "write_skill_folder",
]

#: Files with these suffixes are carried without being read as text.
BINARY_SUFFIXES = frozenset({
    ".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".ico", ".tif", ".tiff", ".pdf", ".zip", ".gz", ".tgz",
    ".bz2", ".xz", ".tar", ".7z", ".whl", ".woff", ".woff2", ".ttf", ".otf", ".mp3", ".mp4", ".wav", ".ogg",
    ".mov", ".so", ".dylib", ".dll", ".exe", ".bin", ".pyc", ".sqlite", ".db", ".parquet", ".xlsx", ".docx",
    ".pptx",
})
#: The suffixes of a skill given as a single file: a markdown document.
MARKDOWN_SUFFIXES = (".md", ".markdown")
_SKIPPED_NAMES = frozenset({".git", "__pycache__", ".DS_Store"})
#: The folders of the Agent Skills layout beside SKILL.md.
_FOLDER_PARTS = ("assets", "references", "scripts")


class SkillFolderError(SkillOptError):
    """A skill folder or file that cannot be read as an Agent Skill (the message is one line)."""


@dataclass(frozen=True)
class LoadedSkill:
    """A skill read from disk: its canonical text, its name, whether ``SKILL.md`` carries front matter,
    its description (from the front matter, or "" for a single file without one) and its carried files."""

    text: str
    name: str
    front_matter: bool
    description: str = ""
    carried: dict[str, bytes] = field(default_factory=dict)


def load_skill(path: Path, *, max_file_bytes: int, train_scripts: bool = False,
               default_name: str = "skill") -> LoadedSkill:
    """Read ``path`` (an Agent Skills folder, or a single ``.md`` file) as a skill.

    ``default_name`` names a single file without front matter whose own name says nothing (``SKILL.md``
    directly under ``/``); otherwise its stem (or, for a file named ``SKILL.md``, its folder's name) does.
    """
    if path.is_dir():
        return _load_folder(path, max_file_bytes=max_file_bytes, train_scripts=train_scripts)
    if not path.is_file():
        raise SkillFolderError(f"{path}: no skill folder or file there")
    if not is_markdown(path):
        raise SkillFolderError(f"{path}: not a markdown file (a single-file skill is a .md file; give a "
                               f"folder with {SKILL_MD} for a skill with other files)")
    if path.name == SKILL_MD:
        parts = sorted(d for d in _FOLDER_PARTS if (path.parent / d).is_dir())
        if parts:  # read alone, the folder's other files would silently drop out of training
            raise SkillFolderError(
                f"{path}: its folder holds the skill's {', '.join(d + '/' for d in parts)} too: give the "
                f"folder ({path.parent}) to train every file, or copy {SKILL_MD} out of it to train it alone")
    text = _read_text(path, path.name, max_file_bytes)
    _check_no_file_markers(text, path)
    try:
        metadata, _ = front_matter(text)
    except SkillFormatError as error:
        raise _format_error(path, error) from None
    stem = path.parent.name if path.name == SKILL_MD else path.stem
    if metadata is None:
        return LoadedSkill(text=text, name=skill_name_from(stem or default_name), front_matter=False)
    problems = metadata_problems(metadata, None)
    if problems:
        raise SkillFolderError(f"{path}: front matter: {'; '.join(problems)}")
    return LoadedSkill(text=text, name=str(metadata["name"]).strip(), front_matter=True,
                       description=str(metadata["description"]).strip())


def is_markdown(path: Path) -> bool:
    """Whether ``path`` is named as a markdown document (``.md``, ``.markdown``; any case)."""
    return path.suffix.lower() in MARKDOWN_SUFFIXES


def skill_from_text(text: str, *, default_name: str) -> LoadedSkill:
    """A skill already held as a run's text (a registry version, a resumed run): its name and description
    come from ``SKILL.md``'s front matter when it has valid ones, else ``default_name`` names it."""
    try:
        metadata, _ = front_matter(split_files(SkillDocument.parse(text).body)[SKILL_MD])
    except SkillFormatError:
        metadata = None
    if metadata is None or metadata_problems(metadata, None):
        return LoadedSkill(text=text, name=skill_name_from(default_name), front_matter=metadata is not None)
    return LoadedSkill(text=text, name=str(metadata["name"]).strip(), front_matter=True,
                       description=str(metadata["description"]).strip())


def _load_folder(root: Path, *, max_file_bytes: int, train_scripts: bool) -> LoadedSkill:
    skill_md = root / SKILL_MD
    if not skill_md.is_file():
        raise SkillFolderError(f"{root}: no {SKILL_MD} in the folder (an Agent Skill needs one)")
    texts: dict[str, str] = {}
    carried: dict[str, bytes] = {}
    for relative, file in folder_files(root):
        data = file.read_bytes()
        if relative == SKILL_MD or (_trainable(relative, train_scripts) and not _is_binary(relative, data)):
            texts[relative] = _decode(file, relative, data, max_file_bytes)
            _check_no_file_markers(texts[relative], file)
        else:
            carried[relative] = data
    try:
        metadata, _ = front_matter(texts[SKILL_MD])
        document = SkillDocument.parse(texts[SKILL_MD])
    except SkillFormatError as error:
        raise _format_error(skill_md, error) from None
    if metadata is None:
        raise SkillFolderError(f"{skill_md}: no YAML front matter (a '---' block with name and description "
                               "must open the file)")
    problems = metadata_problems(metadata, None)
    if problems:
        raise SkillFolderError(f"{skill_md}: front matter: {'; '.join(problems)}")
    for relative, content in texts.items():
        if relative != SKILL_MD and strip_markers(content) != content:
            raise SkillFolderError(f"{root / relative}: holds a skillopt protected-block marker "
                                   "(<!-- SLOW_UPDATE_START --> or the like); only SKILL.md may")
    files = {SKILL_MD: document.body, **{p: t for p, t in sorted(texts.items()) if p != SKILL_MD}}
    text = SkillDocument(body=join_files(files), slow_update=document.slow_update,
                         appendix=document.appendix).text
    return LoadedSkill(text=text, name=str(metadata["name"]).strip(), front_matter=True,
                       description=str(metadata["description"]).strip(), carried=carried)


def folder_files(root: Path) -> list[tuple[str, Path]]:
    """``(relative POSIX path, path)`` of every file under ``root``, sorted; ``.git``, ``__pycache__`` and
    ``.DS_Store`` left out. A symlink must resolve inside ``root`` (else ``SkillFolderError``); a linked
    folder is not entered (what it holds inside ``root`` is read where it really is)."""
    real_root = root.resolve()
    found: list[tuple[str, Path]] = []
    for directory, dirs, names in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_NAMES)
        for name in [*dirs, *names]:
            entry = Path(directory) / name
            if entry.is_symlink():
                target = entry.resolve()
                if target != real_root and real_root not in target.parents:
                    raise SkillFolderError(f"{entry}: a symlink out of the skill folder (to {target}); copy "
                                           "the file into the folder instead")
        for name in sorted(names):
            if name in _SKIPPED_NAMES:
                continue
            entry = Path(directory) / name
            if entry.is_file():
                found.append((entry.relative_to(root).as_posix(), entry))
    return sorted(found)


def _trainable(relative: str, train_scripts: bool) -> bool:
    return train_scripts or PurePosixPath(relative).parts[0] != "scripts"


def _is_binary(relative: str, data: bytes) -> bool:
    return PurePosixPath(relative).suffix.lower() in BINARY_SUFFIXES or b"\0" in data[:8192]


def _read_text(path: Path, label: str, max_file_bytes: int) -> str:
    return _decode(path, label, path.read_bytes(), max_file_bytes)


def _decode(path: Path, label: str, data: bytes, max_file_bytes: int) -> str:
    if len(data) > max_file_bytes:
        raise SkillFolderError(f"{path}: {len(data):,} bytes, over the limit of {max_file_bytes:,} for a "
                               "skill text file (skill.max_file_bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SkillFolderError(
            f"{path}: not UTF-8 text (byte {error.start}); save {label} as UTF-8") from None
    return text.removeprefix("\ufeff").replace("\r\n", "\n")


def _format_error(path: Path, error: SkillFormatError) -> SkillFolderError:
    """``error`` about ``path``, named once (the parser's messages open with ``SKILL.md:`` already)."""
    return SkillFolderError(f"{path}: {str(error).removeprefix(f'{SKILL_MD}: ')}")


def _check_no_file_markers(text: str, path: Path) -> None:
    if has_file_markers(text):
        raise SkillFolderError(f"{path}: holds a line of the form '<!-- FILE: ... -->', which skillopt uses "
                               "to separate a skill's files; change that line")


# --------------------------------------------------------------------------------------------------
# Writing


def safe_relative(path: str) -> PurePosixPath:
    """``path`` as a relative path that stays inside a folder; ``SkillFolderError`` otherwise."""
    relative = PurePosixPath(path)
    if relative.is_absolute() or not relative.parts or ".." in relative.parts or path.startswith("~"):
        raise SkillFolderError(f"skill file {path!r}: not a relative path inside the skill folder")
    return relative


def skill_folder_files(text: str, *, name: str, description: str,
                       carried: Mapping[str, bytes] | None = None) -> dict[str, bytes]:
    """The files of the folder a skill text becomes: ``SKILL.md`` (front matter added from ``name`` and
    ``description`` when it has none; the non-empty protected blocks at its end), each other text file,
    then the carried files (a text file of the same path wins)."""
    document = SkillDocument.parse(text)
    files = split_files(document.body)
    skill_md = SkillDocument(body=files.pop(SKILL_MD), slow_update=document.slow_update,
                             appendix=document.appendix).target_text
    try:
        metadata, _ = front_matter(skill_md)
    except SkillFormatError as error:
        raise _format_error(Path(SKILL_MD), error) from None
    problems = metadata_problems(metadata, None) if metadata is not None else []
    if problems:  # what is written must be a valid Agent Skills folder
        raise SkillFolderError(f"{SKILL_MD}: front matter: {'; '.join(problems)}")
    if metadata is None:
        head = yaml.safe_dump({"name": name, "description": description}, sort_keys=False,
                              allow_unicode=True, width=1_000_000)
        skill_md = f"---\n{head}---\n\n{skill_md}"
    out: dict[str, bytes] = {SKILL_MD: _text_bytes(skill_md)}
    for path, content in files.items():
        out[str(safe_relative(path))] = _text_bytes(content)
    for path, data in (carried or {}).items():
        out.setdefault(str(safe_relative(path)), data)
    return out


def _text_bytes(text: str) -> bytes:
    return (text.rstrip() + "\n").encode("utf-8") if text.strip() else b""


def write_skill_folder(files: Mapping[str, bytes], dest: Path, *, replace: bool = False) -> Path:
    """Write ``files`` as the folder ``dest`` (its parent is created). The folder is built next to ``dest``
    and moved into place, so a failure leaves ``dest`` as it was. An existing ``dest`` holding different
    files is replaced only with ``replace``; holding the same files it is left alone. Folders and files get
    the modes the umask gives new ones; a file that opens with ``#!`` is executable."""
    if dest.exists() and not dest.is_dir():
        raise SkillFolderError(f"{dest}: exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()):
        if _same_files(dest, files):
            return dest
        if not replace:
            raise SkillFolderError(f"{dest}: holds a different skill; pass --force to replace it")
    try:
        return _write_folder(files, dest)
    except OSError as error:
        where = error.filename or dest
        raise SkillFolderError(f"{where}: cannot write the skill folder there "
                               f"({error.strerror or error})") from None


def _write_folder(files: Mapping[str, bytes], dest: Path) -> Path:
    umask = process_umask()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        staging.chmod(0o777 & ~umask)  # mkdtemp makes it private
        for relative, data in files.items():
            target = staging / safe_relative(relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            if data.startswith(b"#!"):
                target.chmod(0o777 & ~umask)
        if dest.exists():
            old = dest.with_name(f".{dest.name}-old-{os.getpid()}")
            dest.rename(old)
            staging.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return dest


def _same_files(root: Path, files: Mapping[str, bytes]) -> bool:
    try:
        present = {relative: file.read_bytes() for relative, file in folder_files(root)}
    except SkillFolderError:
        return False
    return present == dict(files)
