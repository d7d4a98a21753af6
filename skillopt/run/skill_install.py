"""A run's best skill as an Agent Skills folder: ``skillopt skill export`` and ``skillopt skill install``.

``export_run_skill`` writes ``<to>/<name>/`` from the run's ``best_skill.md`` (the skill text), its
``skill.json`` (the name and description, for a skill that had no front matter) and ``skill_carried/``
(files carried unchanged). ``install_run_skill`` writes the same folder where an agent discovers skills:

==============  ==================================  =================================
agent           ``--project DIR``                   ``--global``
==============  ==================================  =================================
``claude-code`` ``DIR/.claude/skills/<name>/``      ``~/.claude/skills/<name>/``
``codex``       ``DIR/.agents/skills/<name>/``      ``~/.agents/skills/<name>/``
==============  ==================================  =================================

A folder already there holding a different skill is replaced only with ``force``; one holding the same
files is left as it is. A run directory written before skill folders existed (no ``skill.json``) is
exported under the benchmark's name from ``summary.json`` or ``config.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import yaml

from skillopt.run.runs import BEST_SKILL_FILE, CARRIED_DIR, SKILL_SOURCE_FILE
from skillopt.skill.folder import (
    SkillFolderError,
    folder_files,
    skill_folder_files,
    skill_from_text,
    write_skill_folder,
)
from skillopt.skill.spec import skill_name_from

__all__ = ["AGENT_SKILL_DIRS", "Agent", "export_run_skill", "install_run_skill", "run_skill_files"]

Agent = Literal["claude-code", "codex"]
#: Where each agent discovers skills, relative to a project folder or to the home folder.
AGENT_SKILL_DIRS: dict[str, Path] = {"claude-code": Path(".claude/skills"), "codex": Path(".agents/skills")}


def run_skill_files(run_dir: Path) -> tuple[str, dict[str, bytes]]:
    """``(name, files)`` of the folder a run's best skill becomes (``skill_folder.skill_folder_files``)."""
    if not run_dir.is_dir():
        raise SkillFolderError(f"{run_dir}: no such run directory")
    best = run_dir / BEST_SKILL_FILE
    if not best.is_file():
        raise SkillFolderError(f"{run_dir}: no {BEST_SKILL_FILE} (not a skillopt run directory, or a run "
                               "that stopped before its baseline)")
    text = best.read_text(encoding="utf-8")
    source = _read_source(run_dir)
    loaded = skill_from_text(text, default_name=str(source.get("name") or _benchmark_of(run_dir)))
    name = loaded.name if loaded.front_matter else str(source.get("name") or loaded.name)
    description = str(source.get("description") or
                      f"How to solve {_benchmark_of(run_dir)} tasks (trained by skillopt).")
    carried = {relative: path.read_bytes() for relative, path in folder_files(run_dir / CARRIED_DIR)} \
        if (run_dir / CARRIED_DIR).is_dir() else {}
    listed = source.get("carried")
    missing = sorted({str(path) for path in listed} - set(carried)) if isinstance(listed, list) else []
    if missing:
        raise SkillFolderError(f"{run_dir / CARRIED_DIR}: the skill carries {', '.join(missing)}, missing "
                               "here; the run directory is incomplete")
    return name, skill_folder_files(text, name=name, description=description, carried=carried)


def export_run_skill(run_dir: Path, to: Path, *, force: bool = False) -> Path:
    """Write the run's best skill as ``<to>/<name>/``; returns that folder."""
    name, files = run_skill_files(run_dir)
    return write_skill_folder(files, to / name, replace=force)


def install_run_skill(run_dir: Path, agent: str, *, project: Path | None = None, home: Path | None = None,
                      force: bool = False) -> Path:
    """Install the run's best skill for ``agent`` in ``project`` (else in ``home``, default ``~``)."""
    if agent not in AGENT_SKILL_DIRS:
        raise SkillFolderError(f"--agent {agent}: unknown agent; choose one of {', '.join(AGENT_SKILL_DIRS)}")
    base = project if project is not None else (home or Path.home())
    if project is not None and not project.is_dir():
        raise SkillFolderError(f"--project {project}: no such folder")
    name, files = run_skill_files(run_dir)
    return write_skill_folder(files, base / AGENT_SKILL_DIRS[agent] / name, replace=force)


def _read_source(run_dir: Path) -> dict[str, object]:
    path = run_dir / SKILL_SOURCE_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SkillFolderError(f"{path}: not valid JSON ({error})") from None
    return data if isinstance(data, dict) else {}


def _benchmark_of(run_dir: Path) -> str:
    """The run's benchmark id (a skill name is made from it), from ``config.yaml``; ``skill`` when unknown."""
    config = run_dir / "config.yaml"
    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8")) if config.is_file() else None
    except yaml.YAMLError:
        data = None
    name = (data.get("benchmark") or {}).get("name") if isinstance(data, dict) else None
    return skill_name_from(str(name)) if name else "skill"
