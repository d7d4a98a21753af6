"""The skill registry: which skill each benchmark has promoted, and every decision about it.

```
<run.skills_dir>/<benchmark>/
  current.md          the promoted skill; nightly runs warm-start from it
  current/<name>/     the promoted skill as an Agent Skills folder (SKILL.md, references/, ...)
  versions/NNNN.md    every skill ever promoted, numbered from 0001; never changed or removed
  versions/NNNN.files/  the files that version's skill folder carries unchanged (binaries, scripts/)
  history.jsonl       one RegistryEvent per decision: promote, keep (a run that did not beat the
                      promoted skill), rollback
```

Nothing is ever deleted: a rollback is a new event that makes an older version current again, so
the whole lineage stays readable. Every file is replaced atomically, and a lock file serialises
writers (a nightly run and a person at the command line). The history is the source of truth for
which version is current; ``current.md`` is its copy for people and for the warm start.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, NotRequired, TypedDict, Unpack

from pydantic import BaseModel, Field

from skillopt.core.atomic import atomic_write_bytes, exclusive_lock
from skillopt.core.errors import SkillOptError
from skillopt.core.redact import Redactor
from skillopt.run.runs import read_jsonl_models
from skillopt.skill.document import skill_hash
from skillopt.skill.files import SKILL_MD
from skillopt.skill.folder import (
    SkillFolderError,
    folder_files,
    safe_relative,
    skill_folder_files,
    skill_from_text,
    write_skill_folder,
)

CURRENT_FILE = "current.md"
CURRENT_DIR = "current"
HISTORY_FILE = "history.jsonl"
VERSIONS_DIR = "versions"

_BENCHMARK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class RegistryError(SkillOptError):
    """A registry operation cannot be done: unknown benchmark folder, nothing to roll back to, bad files."""


class PromotedSkill(BaseModel):
    """The skill a benchmark currently deploys."""

    benchmark: str
    version: int
    text: str
    sha: str
    #: The promoted skill as an Agent Skills folder (``current/<name>/``).
    folder: str = ""


class _Decision(TypedDict):
    """What a promote and a keep record alike about one run's decision."""

    source: str
    reason: str
    metric: NotRequired[str | None]
    incumbent_score: NotRequired[float | None]
    candidate_score: NotRequired[float | None]
    run_name: NotRequired[str | None]
    run_dir: NotRequired[str | None]


class RegistryEvent(BaseModel):
    """One line of ``history.jsonl``: a decision about a benchmark's promoted skill.

    ``version`` is the current version after the event (None while nothing has been promoted) and
    ``previous`` the one before it. Scores are gate scores on the selection split, measured in the
    same run: ``incumbent_score`` for the skill that was promoted (or the initial skill when none
    was), ``candidate_score`` for the run's best skill.
    """

    at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    benchmark: str
    action: Literal["promote", "keep", "rollback"]
    version: int | None
    previous: int | None
    reason: str
    source: str
    skill_sha: str | None = None
    candidate_sha: str | None = None
    metric: str | None = None
    incumbent_score: float | None = None
    candidate_score: float | None = None
    run_name: str | None = None
    run_dir: str | None = None

    @property
    def promoted(self) -> bool:
        return self.action == "promote"


class PromotionVerdict(BaseModel):
    promote: bool
    reason: str


def promotion_verdict(
    *,
    candidate_score: float,
    incumbent_score: float,
    candidate_sha: str,
    incumbent_sha: str,
    incumbent_version: int | None,
    metric: str,
) -> PromotionVerdict:
    """Promote only a different skill that scores strictly higher than the incumbent on the selection split.

    The incumbent is the promoted skill (``incumbent_version``) or, before anything was promoted, the
    initial skill the run started from: the first nightly run promotes only if training beat it.
    """
    incumbent = (
        f"promoted version {incumbent_version}"
        if incumbent_version
        else "initial skill (nothing promoted yet)"
    )
    figures = f"{metric} {candidate_score:.4f} vs {incumbent_score:.4f}"
    if candidate_sha == incumbent_sha:
        return PromotionVerdict(promote=False, reason=f"training found no better skill than the {incumbent} "
                                                      f"({metric} {incumbent_score:.4f})")
    if candidate_score > incumbent_score:
        return PromotionVerdict(
            promote=True, reason=f"the best skill beats the {incumbent} on the selection split ({figures})"
        )
    return PromotionVerdict(
        promote=False,
        reason=f"the best skill does not beat the {incumbent} on the selection split ({figures})",
    )


class SkillRegistry:
    """The registry folder ``root`` (``run.skills_dir``), one sub-folder per benchmark."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    # ---- reading ----------------------------------------------------------------------------

    def benchmarks(self) -> list[str]:
        """Benchmarks with a history, sorted by name."""
        if not self.root.is_dir():
            return []
        return sorted(p.parent.name for p in self.root.glob(f"*/{HISTORY_FILE}"))

    def folder(self, benchmark: str) -> Path:
        if not _BENCHMARK_NAME.fullmatch(benchmark):
            raise RegistryError(f"not a benchmark name: {benchmark!r} (letters, digits, '.', '_' and '-')")
        return self.root / benchmark

    def history(self, benchmark: str) -> list[RegistryEvent]:
        """Every recorded decision, oldest first."""
        return read_jsonl_models(
            self.folder(benchmark) / HISTORY_FILE, RegistryEvent, RegistryError, "registry event"
        )

    def current_version(self, benchmark: str) -> int | None:
        events = self.history(benchmark)
        return events[-1].version if events else None

    def versions(self, benchmark: str) -> list[int]:
        folder = self.folder(benchmark) / VERSIONS_DIR
        return sorted(int(p.stem) for p in folder.glob("*.md") if p.stem.isdigit()) if folder.is_dir() else []

    def version_text(self, benchmark: str, version: int) -> str:
        path = self._version_path(benchmark, version)
        if not path.is_file():
            raise RegistryError(f"{benchmark}: no version {version} in {path.parent}")
        return path.read_text(encoding="utf-8")

    def current(self, benchmark: str) -> PromotedSkill | None:
        """The promoted skill, read from ``current.md`` (None when nothing has been promoted)."""
        version = self.current_version(benchmark)
        if version is None:
            return None
        path = self.folder(benchmark) / CURRENT_FILE
        folder = self._current_folder(benchmark)
        # Missing after a crash between the history and the copy (the version is authoritative), or the folder
        # written by a version of skillopt before skill folders: written again from the version.
        if not path.is_file() or folder is None:
            text = self.version_text(benchmark, version)
            self._write_current(benchmark, version,
                                *self._folder_of(benchmark, text, self._carried(benchmark, version)))
            folder = self._current_folder(benchmark)
        text = path.read_text(encoding="utf-8")
        return PromotedSkill(benchmark=benchmark, version=version, text=text, sha=skill_hash(text),
                             folder=str(folder or ""))

    # ---- writing ----------------------------------------------------------------------------

    def promote(self, benchmark: str, text: str, *, carried: Mapping[str, bytes] | None = None,
                **decision: Unpack[_Decision]) -> RegistryEvent:
        """Store ``text`` (and the files its folder carries unchanged) as a new version; make it current."""
        if not text.strip():
            source = decision["source"]
            raise RegistryError(f"{benchmark}: refusing to promote an empty skill (from {source})")
        name, files = self._folder_of(benchmark, text, carried or {})  # an invalid folder stops here
        with self._locked(benchmark):
            previous = self.current_version(benchmark)
            version = max(self.versions(benchmark), default=0) + 1
            for relative, data in (carried or {}).items():
                atomic_write_bytes(self._carried_dir(benchmark, version) / safe_relative(relative), data)
            atomic_write_bytes(self._version_path(benchmark, version), text.encode("utf-8"))
            event = RegistryEvent(benchmark=benchmark, action="promote", version=version, previous=previous,
                                  skill_sha=skill_hash(text), candidate_sha=skill_hash(text), **decision)
            self._append(benchmark, event)
            self._write_current(benchmark, version, name, files)
        return event

    def keep(self, benchmark: str, *, candidate_sha: str | None = None,
             **decision: Unpack[_Decision]) -> RegistryEvent:
        """Record a decision not to promote; the current version stays."""
        with self._locked(benchmark):
            version = self.current_version(benchmark)
            sha = skill_hash(self.version_text(benchmark, version)) if version else None
            event = RegistryEvent(benchmark=benchmark, action="keep", version=version, previous=version,
                                  skill_sha=sha, candidate_sha=candidate_sha, **decision)
            self._append(benchmark, event)
        return event

    def decide(self, benchmark: str, *, candidate: str, candidate_score: float, incumbent_sha: str,
               incumbent_score: float, incumbent_version: int | None, metric: str, source: str,
               run_name: str | None = None, run_dir: str | None = None,
               carried: Mapping[str, bytes] | None = None) -> RegistryEvent:
        """Promote ``candidate`` if it beats the incumbent (``promotion_verdict``), else record a keep."""
        verdict = promotion_verdict(candidate_score=candidate_score, incumbent_score=incumbent_score,
                                    candidate_sha=skill_hash(candidate), incumbent_sha=incumbent_sha,
                                    incumbent_version=incumbent_version, metric=metric)
        common: _Decision = {"source": source, "reason": verdict.reason, "metric": metric,
                             "incumbent_score": incumbent_score, "candidate_score": candidate_score,
                             "run_name": run_name, "run_dir": run_dir}
        if verdict.promote:
            return self.promote(benchmark, candidate, carried=carried, **common)
        return self.keep(benchmark, candidate_sha=skill_hash(candidate), **common)

    def rollback(self, benchmark: str, *, source: str = "manual") -> RegistryEvent:
        """Make current again the version that was current before the current one was promoted."""
        with self._locked(benchmark):
            events = self.history(benchmark)
            current = events[-1].version if events else None
            if current is None:
                raise RegistryError(f"{benchmark}: nothing is promoted in {self.folder(benchmark)}; "
                                    "nothing to roll back")
            origin = next(e for e in reversed(events) if e.action == "promote" and e.version == current)
            if origin.previous is None:
                raise RegistryError(f"{benchmark}: version {current} is the first promoted skill; "
                                    "there is no earlier version to roll back to")
            target = origin.previous
            name, files = self._folder_of(benchmark, self.version_text(benchmark, target),
                                          self._carried(benchmark, target))
            event = RegistryEvent(
                benchmark=benchmark,
                action="rollback",
                version=target,
                previous=current,
                reason=f"rolled back from version {current} to version {target}",
                source=source,
                skill_sha=skill_hash(self.version_text(benchmark, target)),
            )
            self._append(benchmark, event)
            self._write_current(benchmark, target, name, files)
        return event

    # ---- helpers ----------------------------------------------------------------------------

    def _version_path(self, benchmark: str, version: int) -> Path:
        return self.folder(benchmark) / VERSIONS_DIR / f"{version:04d}.md"

    def _carried_dir(self, benchmark: str, version: int) -> Path:
        return self.folder(benchmark) / VERSIONS_DIR / f"{version:04d}.files"

    def _current_folder(self, benchmark: str) -> Path | None:
        found = sorted(p for p in (self.folder(benchmark) / CURRENT_DIR).glob(f"*/{SKILL_MD}"))
        return found[0].parent if found else None

    def _carried(self, benchmark: str, version: int) -> dict[str, bytes]:
        carried_dir = self._carried_dir(benchmark, version)
        return ({relative: path.read_bytes() for relative, path in folder_files(carried_dir)}
                if carried_dir.is_dir() else {})

    def _folder_of(self, benchmark: str, text: str,
                   carried: Mapping[str, bytes]) -> tuple[str, dict[str, bytes]]:
        """The name and files of the folder ``text`` is served as; ``RegistryError`` when it cannot be a valid
        Agent Skills folder (raised before anything is written)."""
        name = skill_from_text(text, default_name=benchmark).name
        try:
            description = f"How to solve {benchmark} tasks (promoted by skillopt)."
            return name, skill_folder_files(text, name=name, carried=carried, description=description)
        except SkillFolderError as error:
            raise RegistryError(f"{benchmark}: not promoted: {error}") from None

    def _write_current(self, benchmark: str, version: int, name: str, files: Mapping[str, bytes]) -> None:
        text = self.version_text(benchmark, version)
        atomic_write_bytes(self.folder(benchmark) / CURRENT_FILE, text.encode("utf-8"))
        root = self.folder(benchmark) / CURRENT_DIR
        for stale in (p for p in root.iterdir() if p.is_dir() and p.name != name) if root.is_dir() else ():
            shutil.rmtree(stale)  # a version of another name was current: one folder, the current skill
        write_skill_folder(files, root / name, replace=True)

    def _append(self, benchmark: str, event: RegistryEvent) -> None:
        path = self.folder(benchmark) / HISTORY_FILE
        before = path.read_bytes() if path.is_file() else b""
        if before and not before.endswith(b"\n"):
            before += b"\n"
        atomic_write_bytes(path, before + event.model_dump_json().encode("utf-8") + b"\n")

    def _locked(self, benchmark: str) -> contextlib.AbstractContextManager[None]:
        folder = self.folder(benchmark)
        folder.mkdir(parents=True, exist_ok=True)
        return exclusive_lock(folder / ".lock")


def promotion_markdown(event: RegistryEvent, *, redactor: Redactor | None = None) -> str:
    """The promotion decision of a run as a short markdown report (a Prefect artifact)."""
    verb = {"promote": f"promoted as version {event.version}", "keep": "not promoted",
            "rollback": f"rolled back to version {event.version}"}[event.action]

    def score(value: float | None) -> str:
        return "–" if value is None else f"{value:.4f}"

    current = f"version {event.version} (sha {(event.skill_sha or '')[:12]})" if event.version else "none"
    text = (
        f"**{event.benchmark}: {verb}**\n\n{event.reason}\n\n| skill | {event.metric or 'score'} on the "
        f"selection split |\n|---|---|\n| incumbent (version {event.previous or '–'}) | "
        f"{score(event.incumbent_score)} |\n| this run's best (sha "
        f"{(event.candidate_sha or '')[:12] or '–'}) | {score(event.candidate_score)} |\n\nCurrent promoted "
        f"skill: {current}. Source: {event.source}.\n"
    )
    return (redactor or Redactor.from_environment())(text)
