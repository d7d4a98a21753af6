"""The run directory: the human-readable record of one training run.

```
<run.runs_dir>/<run-name>/
  config.yaml           resolved config (secrets redacted), its hash in the header, provenance
  history.jsonl         one StepRecord per (kind, step), rewritten whole on every record
  summary.json          RunSummary (numeric scores per phase and split)
  best_skill.md         the best validated skill (a skill folder's files behind file marker lines)
  skill.json            the skill's name, description and front matter flag (``skillopt skill export``)
  skill_carried/        the skill folder's files that are carried unchanged (binaries, scripts/)
  skills/step_NNNN.md   the current skill after global step N (0 = initial); never changed later
  steps/NNNN/           free-form JSON per step: patches, merged patch, ranked edits, gate, ...
  epochs/EE/            slow-update and meta-skill inputs and outputs
  eval/<name>/          results.jsonl, scores.json, predictions/<id>/ for people to read
  usage.jsonl           written by the usage ledger (only its path is known here)
  splits/               the split manifest used
```

Every file is written atomically (temp file in the same folder, fsync, ``os.replace``), so a
kill -9 leaves either the old or the new content, never half of it. The directory is written by
the flows and read back only for reports: Prefect's result store is the resume mechanism, and
nothing here decides what to skip.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from skillopt.core.atomic import atomic_write_bytes, check_writable
from skillopt.core.config import SkillOptConfig, flatten
from skillopt.core.error_rows import answered_rows
from skillopt.core.errors import ConfigError, SkillOptError, StorageError, storage_error
from skillopt.core.gate import Scores, score_rows
from skillopt.core.records import (
    ItemResult,
    PhaseScores,
    RunSummary,
    SplitScores,
    StepRecord,
    counted,
    unusable_replies_warning,
)
from skillopt.core.redact import Redactor, redact_tree

#: Config fields left out of ``config_hash``: they name or place the run, or change only how fast
#: it goes (parallelism), whether the cache is re-filled or what is warned about, never what it computes.
RESULT_NEUTRAL_FIELDS: tuple[str, ...] = (
    "run.run_name",
    "run.runs_dir",
    "run.refresh_cache",
    "run.reports_url",
    "run.skills_dir",
    "benchmark.workers",
    "gradient.analyst_workers",
    "evaluation.min_split_items",
    # A cap decides where a run stops, never what a step computes: raising one resumes the run.
    "budget.max_usd",
    "budget.max_tokens",
    "budget.max_calls",
    "budget.hard_factor",
    "budget.allow_unpriced",
)

CONFIG_FILE = "config.yaml"
HISTORY_FILE = "history.jsonl"
SUMMARY_FILE = "summary.json"
BEST_SKILL_FILE = "best_skill.md"
SKILL_SOURCE_FILE = "skill.json"
CARRIED_DIR = "skill_carried"
USAGE_FILE = "usage.jsonl"
#: Held (``lockf``) by the process writing the run; it holds that process's pid.
LOCK_FILE = ".lock"

_log = logging.getLogger(__name__)
#: The lines a run prints (the command line shows them; a flow run's logs hold them).
_progress = logging.getLogger("skillopt.progress")

_HASH_HEADER = re.compile(r"^# config_hash: ([0-9a-f]{64})\s*$", re.MULTILINE)
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SAFE_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
# history.jsonl order within one step number: the step itself, then the epoch's slow update, then
# the final check (which carries the last step number).
_KIND_ORDER = {"step": 0, "slow_update": 1, "final": 2}
_ACCEPT_DECISIONS = frozenset({"accept", "accept_new_best", "force_accept"})


ModelT = TypeVar("ModelT", bound=BaseModel)


class RunDirError(SkillOptError):
    """The run directory cannot take a write: a recorded file would change, or a path leaves it."""


# --------------------------------------------------------------------------------------------
# Names and hashes


def config_hash(config: SkillOptConfig) -> str:
    """sha256 hex digest of the canonical JSON of the resolved config.

    Canonical = ``model_dump(mode="json")`` with keys sorted and no whitespace. The fields in
    ``RESULT_NEUTRAL_FIELDS`` (``run.run_name``, ``run.runs_dir``, ``run.refresh_cache``, ``run.skills_dir``,
    ``benchmark.workers``, ``gradient.analyst_workers``) are left out, so renaming, moving or
    re-parallelising a run keeps its hash; every other value, benchmark-specific keys included,
    changes it.
    """
    data = config.model_dump(mode="json")
    for dotted in RESULT_NEUTRAL_FIELDS:
        section, key = dotted.split(".")
        data.get(section, {}).pop(key, None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def default_run_name(benchmark: str, config_hash: str, now: datetime) -> str:
    """``<bench>-<yyyymmdd-hhmmss>-<first 6 of the config hash>``, e.g.
    ``searchqa-20261130-041210-3fa9c1``."""
    return f"{benchmark}-{now:%Y%m%d-%H%M%S}-{config_hash[:6]}"


def run_directory_name(benchmark: str, config: SkillOptConfig, *, prefix: str | None = None,
                       now: datetime | None = None) -> str:
    """The name of a run's directory, which is also its Prefect flow run's name: ``run.run_name`` when set,
    else ``default_run_name`` of ``<bench>`` (``<bench>-<prefix>`` for an evaluation) at ``now`` (local
    time)."""
    if config.run.run_name:
        return config.run.run_name
    owner = f"{benchmark}-{prefix}" if prefix else benchmark
    return default_run_name(owner, config_hash(config), datetime.now() if now is None else now)


def per_task_type(rows: Iterable[ItemResult]) -> dict[str, dict[str, float | int]]:
    """Mean hard and soft score and row count per ``task_type``, task types sorted by name; error rows (calls
    that failed after their retries) say nothing about the skill and are left out."""
    groups: dict[str, list[ItemResult]] = {}
    for row in answered_rows(list(rows)):
        groups.setdefault(row.task_type, []).append(row)
    breakdown: dict[str, dict[str, float | int]] = {}
    for task_type in sorted(groups):
        scores = score_rows(groups[task_type])
        breakdown[task_type] = {"hard": scores.hard, "soft": scores.soft, "n": scores.n}
    return breakdown


# --------------------------------------------------------------------------------------------
# Summary

ScoreLike = Scores | SplitScores | Mapping[str, float]


def build_summary(
    *,
    run_name: str,
    benchmark: str,
    config: SkillOptConfig,
    baseline_selection: ScoreLike | None,
    best_selection: ScoreLike | None,
    final_selection: ScoreLike | None,
    baseline_test: ScoreLike | None = None,
    best_test: ScoreLike | None = None,
    history: Sequence[StepRecord] = (),
    usage: Mapping[str, Any] | None = None,
    wall_s: float = 0.0,
    stopped_by: str | None = None,
    stopped_message: str | None = None,
    best_skill_sha: str = "",
    redactor: Redactor | None = None,
    context_windows: Mapping[str, Any] | None = None,
    answer_formats: Mapping[str, int] | None = None,
) -> RunSummary:
    """The ``summary.json`` record of a run.

    ``scores`` is ``{"baseline": {"selection", "test"}, "best": {"selection", "test"}, "final":
    {"selection"}}``, each a ``{"hard", "soft"}`` pair of finite numbers. Test scores are required
    when ``evaluation.eval_test`` is on (except for a run stopped early, ``stopped_by`` set, which
    skips the test evaluation) and refused when it is off (then the ``test`` keys are absent). Score arguments
    may be ``gate.Scores``, ``SplitScores`` or ``{"hard", "soft"}`` mappings. A run the budget stopped
    during its baseline evaluation scored nothing: its selection scores are None and ``scores`` is empty.

    ``counts`` tallies ``history`` (the last record per (kind, step) wins):
    ``{"total": tally, "per_epoch": {"<epoch>": tally}, "slow_updates": tally}`` where a tally is
    ``{"n", "accepts", "new_best", "rejects", "skips", "other"}``; ``total`` and ``per_epoch``
    count ``kind == "step"`` records only. Accepts are ``accept``, ``accept_new_best`` and
    ``force_accept``; ``new_best`` is the subset that became the best; skips are decisions
    starting with ``skip``; ``other`` is anything else.

    ``usage`` is the ledger's ``summary()``; ``config`` is the resolved config with every string
    passed through ``redactor`` (default: ``Redactor.from_environment()``).
    Raises ValueError for a missing, surplus or non-finite score.
    """
    eval_test = config.evaluation.eval_test
    if stopped_by is None and None in (baseline_selection, best_selection, final_selection):
        raise ValueError("selection scores are required for a run that was not stopped")
    for label, value in (("baseline_test", baseline_test), ("best_test", best_test)):
        if eval_test and value is None and stopped_by is None:
            raise ValueError(f"{label} scores are required when evaluation.eval_test is true")
        if not eval_test and value is not None:
            raise ValueError(f"{label} scores were given but evaluation.eval_test is false")

    phases = {"baseline": (baseline_selection, baseline_test), "best": (best_selection, best_test),
              "final": (final_selection, None)}

    def phase(selection: ScoreLike, test: ScoreLike | None, label: str) -> PhaseScores:
        return PhaseScores(
            selection=_split_scores(selection, f"{label}.selection"),
            test=None if test is None else _split_scores(test, f"{label}.test"),
        )

    redactor = Redactor.from_environment() if redactor is None else redactor
    return RunSummary(
        run_name=run_name,
        benchmark=benchmark,
        scores={label: phase(selection, test, label) for label, (selection, test) in phases.items()
                if selection is not None},
        counts={**decision_counts(history), **signal_counts(history),
                **({"answer_formats": dict(answer_formats)} if answer_formats is not None else {})},
        usage=dict(usage or {}),
        wall_s=wall_s,
        stopped_by=stopped_by,
        stopped_message=stopped_message,
        best_skill_sha=best_skill_sha,
        config=redact_tree(config.model_dump(mode="json"), redactor),
        warnings=summary_warnings(history),
        context_windows=dict(context_windows or {}),
    )


def _latest_steps(history: Sequence[StepRecord]) -> list[StepRecord]:
    latest = {(record.kind, record.step): record for record in history}
    return [r for key, r in sorted(latest.items(), key=lambda kv: _history_key(kv[1])) if key[0] == "step"]


def answer_format_counts(rows: Iterable[ItemResult]) -> dict[str, int]:
    """How the target's answers were read in ``rows``: ``untagged`` (a fallback read them: no ``<answer>``
    tag) and ``ambiguous`` (untagged and naming more than one option: scored 0), out of ``rows``."""
    counts = {"rows": 0, "untagged": 0, "ambiguous": 0}
    for row in rows:
        counts["rows"] += 1
        fmt = (row.extras or {}).get("format")
        if fmt in ("untagged", "ambiguous"):
            counts[fmt] += 1
    return counts


def signal_counts(history: Sequence[StepRecord]) -> dict[str, Any]:
    """What the optimizer's evidence was made of: ``optimizer_replies`` ``{"parsed", "fallback"}`` over the
    steps, and ``errors`` ``{"rollout", "gate"}``: error rows in training batches and selection items left
    out of gates (the last record per step counts)."""
    steps = _latest_steps(history)
    return {
        "optimizer_replies": {"parsed": sum(r.replies_parsed for r in steps),
                              "fallback": sum(r.replies_fallback for r in steps)},
        "errors": {"rollout": sum(r.n_error for r in steps),
                   "gate": sum(len(r.gate_error_ids) for r in steps)},
    }


def summary_warnings(history: Sequence[StepRecord]) -> list[str]:
    """The run-level warnings of ``summary.json``: most optimizer replies unusable; error rows seen."""
    counts = signal_counts(history)
    replies, errors = counts["optimizer_replies"], counts["errors"]
    warnings = [w for w in [unusable_replies_warning(replies["parsed"], replies["fallback"])] if w]
    if errors["rollout"] or errors["gate"]:
        warnings.append(f"{errors['rollout']} training rollouts and {errors['gate']} gate items were error "
                        "rows (model calls that failed after their retries); they were left out of "
                        "reflection and gates")
    return warnings


def summary_dict(summary: RunSummary) -> dict[str, Any]:
    """``summary`` as the JSON object written to ``summary.json``.

    Unlike a plain ``model_dump``, a phase without a split (``final`` has no ``test``; neither
    does any phase with ``evaluation.eval_test: false``) has no key for it rather than a null.
    """
    data = summary.model_dump(mode="json")
    data["scores"] = {
        name: phase.model_dump(mode="json", exclude_none=True) for name, phase in summary.scores.items()
    }
    return data


def summary_line(summary: Mapping[str, Any]) -> str:
    """``summary.json``'s object in one line for a run's log, e.g. ``finished demo-…: best selection hard
    1.000 soft 1.000, test hard 0.900 soft 0.920 (baseline: selection hard 0.667 …); 6 steps: 2 accepted, 3
    rejected, 1 skipped; 120 model calls``."""
    def phase(name: str) -> str:
        splits = summary["scores"].get(name, {})
        return ", ".join(
            f"{'selection' if split == 'val' else split} hard {v['hard']:.3f} soft {v['soft']:.3f}"
            for split, v in (("val", splits.get("selection")), ("test", splits.get("test")))
            if v
        ) or "not scored"

    total = summary.get("counts", {}).get("total", {})
    steps = total.get("n", 0)
    stopped = f" (stopped by {summary['stopped_by']})" if summary.get("stopped_by") else ""
    return (f"finished {summary['run_name']}{stopped}: best {phase('best')} (baseline: {phase('baseline')}); "
            f"{counted(steps, 'step')}: {total.get('accepts', 0)} accepted, "
            f"{total.get('rejects', 0)} rejected, {total.get('skips', 0)} skipped; "
            f"{summary.get('usage', {}).get('total', {}).get('calls', 0)} model calls")


def decision_counts(history: Sequence[StepRecord]) -> dict[str, Any]:
    """Accept / reject / skip tallies of ``history`` per epoch and in total (see ``build_summary``)."""
    latest = {(record.kind, record.step): record for record in history}
    steps = _latest_steps(history)
    per_epoch: dict[str, dict[str, int]] = {}
    for epoch in sorted({record.epoch for record in steps}):
        per_epoch[str(epoch)] = _tally(record for record in steps if record.epoch == epoch)
    return {
        "total": _tally(steps),
        "per_epoch": per_epoch,
        "slow_updates": _tally(r for key, r in latest.items() if key[0] == "slow_update"),
    }


def _tally(records: Iterable[StepRecord]) -> dict[str, int]:
    tally = {"n": 0, "accepts": 0, "new_best": 0, "rejects": 0, "skips": 0, "other": 0}
    for record in records:
        tally["n"] += 1
        decision = record.decision
        if decision in _ACCEPT_DECISIONS:
            tally["accepts"] += 1
            if decision == "accept_new_best" or (record.gate is not None and record.gate.new_best):
                tally["new_best"] += 1
        elif decision == "reject":
            tally["rejects"] += 1
        elif decision.startswith("skip"):
            tally["skips"] += 1
        else:
            tally["other"] += 1
    return tally


def _split_scores(value: ScoreLike, label: str) -> SplitScores:
    if isinstance(value, Mapping):
        hard, soft = value.get("hard"), value.get("soft")
    else:
        hard, soft = value.hard, value.soft
    for name, number in (("hard", hard), ("soft", soft)):
        if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
            raise ValueError(f"scores.{label}.{name} must be a finite number, got {number!r}")
    return SplitScores(hard=float(hard), soft=float(soft))  # type: ignore[arg-type]


def _history_key(record: StepRecord) -> tuple[int, int]:
    return record.step, _KIND_ORDER.get(record.kind, len(_KIND_ORDER))


# --------------------------------------------------------------------------------------------
# Atomic writes


def _encode_text(text: str) -> bytes:
    # A lone surrogate (from decoded JSON) cannot be UTF-8; write it as a visible \udXXX escape,
    # which inside a JSON string is also a valid escape that reads back to the same character.
    return text.encode("utf-8", "backslashreplace")


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    raise TypeError(f"cannot write a {type(value).__name__} as JSON")


def to_json(obj: Any, *, indent: int | None = 2) -> str:
    """JSON text of ``obj``; pydantic models anywhere inside are dumped with ``mode="json"``."""
    return json.dumps(obj, indent=indent, ensure_ascii=False, default=_json_default)


def read_jsonl_models(path: Path, model: type[ModelT], error: type[SkillOptError], what: str, *,
                      torn_last_line_ok: bool = False) -> list[ModelT]:
    """The ``model`` records of a JSON-lines file, blank lines skipped; [] when there is no file.

    A line that is not a valid record raises ``error`` naming ``path:line`` and ``what`` it should be,
    except, with ``torn_last_line_ok``, the last line: a write cut short (a crash, a full disk) is
    dropped with a warning naming the file and line, and the next rewrite of the file repairs it.
    """
    if not path.is_file():
        return []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise storage_error(path, exc, "read") from None
    last = max((n for n, line in enumerate(lines, 1) if line.strip()), default=0)
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(model.model_validate_json(line))
        except ValueError as exc:
            if torn_last_line_ok and number == last:
                _log.warning("%s:%d: not a valid %s (a write cut short?); ignored, the file is rewritten "
                             "whole at the next record", path, number, what)
                continue
            raise error(f"{path}:{number}: not a valid {what} ({exc})") from None
    return records


def _safe_component(name: str) -> str:
    """``name`` as one file name: kept when already safe, else cleaned and suffixed with a short hash."""
    if _SAFE_COMPONENT.fullmatch(name) and name not in (".", ".."):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".")[:80] or "item"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{cleaned}-{digest}"


# --------------------------------------------------------------------------------------------
# The run directory


class RunDir:
    """One run's folder. ``RunDir(path)`` wraps an existing folder (reports); ``RunDir.open`` creates
    or resumes one for training. Paths given to the write helpers are relative to the run folder."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._history_lock = threading.Lock()
        self._lock_handle: int | None = None
        #: While a resumed run replays the steps it had recorded (up to this step), ``best_skill.md`` is not
        #: rewritten: the replay passes through older bests, and a replay that fails must leave the file
        #: as it was. The newest best is written once the run gets past the recorded steps (or finishes).
        self._replaying_through: int | None = None
        self._pending_best: str | None = None
        #: What each step recorded before this (resumed) process spent on it: a replay finds its calls in the
        #: cache, so its own spend is nothing.
        self._recorded_usage: dict[int, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ---- creation -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        runs_dir: Path | str,
        name: str,
        config: SkillOptConfig,
        *,
        config_hash: str,
        provenance: Mapping[str, str],
    ) -> RunDir:
        """Create ``runs_dir/name`` and write its ``config.yaml``, or resume it.

        An existing folder whose ``config.yaml`` records the same ``config_hash`` is reused as is
        (its ``config.yaml`` is kept); a different hash is a ``ConfigError`` naming both hashes.
        A folder without ``config.yaml`` is treated as new. ``config.yaml`` holds a header comment
        with the hash, the resolved config, then ``sources:`` (the provenance of each value), the
        whole text passed through ``Redactor.from_environment()``.
        """
        if not _RUN_NAME.fullmatch(name):
            raise ConfigError(
                f"run name {name!r} must start with a letter or digit and contain only letters, digits, "
                "'.', '_' and '-'"
            )
        check_writable(Path(runs_dir), "run.runs_dir")
        run = cls(Path(runs_dir) / name)
        run.path.mkdir(parents=True, exist_ok=True)
        run.lock()
        if run.config_path.is_file() and (run.started() or run.recorded_config_hash() == config_hash):
            recorded = run.recorded_config_hash()
            if recorded is None:
                raise ConfigError(
                    f"{run.config_path} records no config hash, so resuming into it is unsafe; "
                    "choose another run name with --run-name"
                )
            if recorded != config_hash:
                changed = run.changed_settings(config)
                more = " …" if len(changed) > 5 else ""
                what = f"; changed: {', '.join(changed[:5])}{more}" if changed else ""
                raise ConfigError(
                    f"run directory {run.path} was created with config hash {recorded[:12]}, but this "
                    f"config hashes to {config_hash[:12]}{what}; resume it with the same config, or start "
                    "a new run with --run-name"
                )
            history = run.read_history()  # a damaged record stops the resume now, before anything is written
            run._replaying_through = max((r.step for r in history if r.kind == "step"), default=0)
            run._recorded_usage = {r.step: r.usage for r in history if r.kind == "step"}
            own = (", its own (--no-cache calls again only what earlier runs stored)"
                   if config.run.refresh_cache else "")
            _progress.info("resuming %s: %d calls from the cache%s", name, run.paid_calls(), own)
            return run
        if run.config_path.is_file():
            # A run that stopped before its first step (a set-up error, a failed baseline) has no result to
            # keep: it takes this config rather than blocking the name. Its usage.jsonl (calls it paid for)
            # stays; what its baseline wrote for the old config goes.
            _log.warning("run directory %s stopped before its first step; it starts again with this config",
                         run.path)
            run._discard_baseline()
        run.write_text(CONFIG_FILE, _config_yaml(config, config_hash, provenance))
        return run

    @classmethod
    def join(cls, runs_dir: Path | str, name: str) -> RunDir:
        """The directory of a run that another process holds — its flow — for a worker of that run (a Dask
        worker rebuilding the run): no lock taken, nothing rewritten; the worker's calls only append their
        usage lines. The flow must have opened it already, on storage this process reaches."""
        run = cls(Path(runs_dir) / name)
        if not run.config_path.is_file():
            raise StorageError(
                f"run directory {run.path} has no {CONFIG_FILE} here: a worker joins a run its flow has "
                "opened, so the run's folders must be on storage every worker reaches, at the same path"
            )
        return run

    def started(self) -> bool:
        """Whether the run recorded a step (or finished): from then on it holds results to keep."""
        return self.history_path.exists() or self.summary_path.exists()

    def _discard_baseline(self) -> None:
        for folder in ("skills", "eval", "splits"):
            shutil.rmtree(self.path / folder, ignore_errors=True)
        for name in (BEST_SKILL_FILE, "STOPPED"):
            (self.path / name).unlink(missing_ok=True)

    def lock(self) -> None:
        """Hold the run's lock file for the life of this process, or raise naming the process that holds it.

        A POSIX record lock: released by the system when the holder exits or is killed, so a crashed run
        never leaves a stale lock. Taking it again from the same process is allowed (a test, a second flow).
        """
        if self._lock_handle is not None or os.name == "nt":  # pragma: no branch - POSIX record locks only
            return
        import fcntl

        path = self.path / LOCK_FILE
        try:
            handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise storage_error(path, exc, "create") from None
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(handle, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(handle)
            raise StorageError(
                f"run directory {self.path} is in use by another skillopt process (pid {holder}); wait for "
                "it to finish or stop it, or choose another --run-name"
            ) from None
        os.ftruncate(handle, 0)
        os.pwrite(handle, f"{os.getpid()}\n".encode("ascii"), 0)
        self._lock_handle = handle

    def in_use(self) -> bool:
        """Whether a live process holds the run's lock (``lock``); a directory never locked is not in use."""
        path = self.path / LOCK_FILE
        if os.name == "nt" or not path.exists():  # pragma: no cover - POSIX record locks only
            return False
        import fcntl

        try:
            handle = os.open(path, os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(handle)  # closing releases a lock this test took
        return False

    def recorded_config_hash(self) -> str | None:
        """The hash in ``config.yaml``'s header, or None when there is no file or no header."""
        if not self.config_path.is_file():
            return None
        match = _HASH_HEADER.search(self.config_path.read_text(encoding="utf-8", errors="replace"))
        return match.group(1) if match else None

    def changed_settings(self, config: SkillOptConfig) -> list[str]:
        """The dotted settings whose value in ``config`` differs from ``config.yaml``'s (the hashed ones)."""
        try:
            recorded = yaml.safe_load(self.config_path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            return []
        if not isinstance(recorded, dict):
            return []
        recorded.pop("sources", None)
        before = flatten(recorded)
        now = flatten(redact_tree(config.model_dump(mode="json"), Redactor.from_environment()))
        neutral = set(RESULT_NEUTRAL_FIELDS)
        return [key for key in sorted(set(before) | set(now))
                if key not in neutral and before.get(key) != now.get(key)]

    # ---- layout ---------------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def history_path(self) -> Path:
        return self.path / HISTORY_FILE

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def best_skill_path(self) -> Path:
        return self.path / BEST_SKILL_FILE

    def paid_calls(self, *, since: str | None = None) -> int:
        """Model calls recorded in ``usage.jsonl`` that were made (not served from a cache), all of them or
        those recorded at or after the ISO time ``since``. Lines that do not read are not counted."""
        if not self.usage_path.is_file():
            return 0
        count = 0
        for line in self.usage_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and not record.get("cache_hit") and (
                    since is None or str(record.get("ts", "")) >= since):
                count += 1
        return count

    @property
    def usage_path(self) -> Path:
        """Where the usage ledger appends one line per model call (this class never writes it)."""
        return self.path / USAGE_FILE

    @property
    def splits_dir(self) -> Path:
        return self.path / "splits"

    def skill_snapshot_path(self, step: int, after: str | None = None) -> Path:
        """``skills/step_NNNN.md``, or with ``after`` (``slow_update``) ``skills/step_NNNN_slow_update.md``:
        the skill once the epoch boundary that followed step NNNN changed it."""
        return self.path / "skills" / (f"step_{step:04d}_{after}.md" if after else f"step_{step:04d}.md")

    def step_dir(self, step: int) -> Path:
        return self.path / "steps" / f"{step:04d}"

    def epoch_dir(self, epoch: int) -> Path:
        return self.path / "epochs" / f"{epoch:02d}"

    def eval_dir(self, name: str) -> Path:
        return self.path / "eval" / _checked_name(name, "evaluation name")

    # ---- generic writes -------------------------------------------------------------------

    def resolve(self, rel: str | Path) -> Path:
        """``rel`` inside the run folder; an absolute path or one that climbs out is a ``RunDirError``."""
        rel_path = Path(rel)
        if rel_path.is_absolute() or ".." in rel_path.parts or not rel_path.parts:
            raise RunDirError(f"{str(rel)!r} is not a path inside the run directory {self.path}")
        return self.path / rel_path

    def write_text(self, rel: str | Path, text: str) -> Path:
        """Write ``text`` (UTF-8) to ``rel`` atomically; returns the full path."""
        path = self.resolve(rel)
        atomic_write_bytes(path, _encode_text(text))
        return path

    def write_json(self, rel: str | Path, obj: Any) -> Path:
        """Write ``obj`` as indented JSON (pydantic models dumped with ``mode="json"``) atomically."""
        return self.write_text(rel, to_json(obj) + "\n")

    def write_jsonl(self, rel: str | Path, rows: Iterable[Any]) -> Path:
        """Write one compact JSON line per row (pydantic models dumped with ``mode="json"``) atomically."""
        return self.write_text(rel, "".join(to_json(row, indent=None) + "\n" for row in rows))

    def write_step_json(self, step: int, name: str, obj: Any) -> Path:
        """``steps/NNNN/<name>.json`` — e.g. ``patches``, ``merged_patch``, ``ranked_edits``, ``gate``."""
        return self.write_json(f"steps/{step:04d}/{_checked_name(name, 'file name')}.json", obj)

    def write_epoch_json(self, epoch: int, name: str, obj: Any) -> Path:
        """``epochs/EE/<name>.json`` — e.g. ``slow_update``, ``meta_skill``."""
        return self.write_json(f"epochs/{epoch:02d}/{_checked_name(name, 'file name')}.json", obj)

    # ---- skills ---------------------------------------------------------------------------

    def write_skill_snapshot(self, step: int, text: str, *, after: str | None = None) -> Path:
        """Write ``skills/step_NNNN.md``, the current skill after global step ``step`` (0 = initial), or
        with ``after`` the skill after what followed that step (``skill_snapshot_path``).

        Writing the same content again is a no-op (a resumed run); different content for an
        existing step is a ``RunDirError``: snapshots are never overwritten.
        """
        path = self.skill_snapshot_path(step, after)
        data = _encode_text(text)
        if path.exists():
            if path.read_bytes() == data:
                return path
            raise RunDirError(
                f"{path} already holds a different skill for step {step}; snapshots are never overwritten. "
                "A resumed run produced another skill for this step (was the cache refreshed or cleared?); "
                "start a new run with --run-name"
            )
        atomic_write_bytes(path, data)
        return path

    def write_skill_source(self, *, name: str, description: str, front_matter: bool,
                           carried: Mapping[str, bytes]) -> None:
        """Write ``skill.json`` (what an export needs beyond the skill's text) and the carried files under
        ``skill_carried/`` (each at its path in the skill folder)."""
        self.write_json(SKILL_SOURCE_FILE, {"name": name, "description": description,
                                            "front_matter": front_matter, "carried": sorted(carried)})
        for relative, data in carried.items():
            path = self.resolve(Path(CARRIED_DIR) / relative)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, data)

    def replays(self, step: int) -> bool:
        """Whether ``step`` was recorded before this (resumed) process began: it is being taken again from
        the cache, as the run took it then."""
        return self._replaying_through is not None and step <= self._replaying_through

    def recorded_usage(self, step: int) -> dict[str, Any] | None:
        """The usage ``step`` recorded when the run first took it, if this process replays it."""
        return self._recorded_usage.get(step) if self.replays(step) else None

    def write_best_skill(self, text: str) -> Path:
        """Replace ``best_skill.md`` atomically (held back while a resumed run replays its recorded steps)."""
        if self._replaying_through is not None:
            self._pending_best = text
            return self.best_skill_path
        return self.write_text(BEST_SKILL_FILE, text)

    def _end_replay(self) -> None:
        self._replaying_through = None
        if self._pending_best is not None:
            pending, self._pending_best = self._pending_best, None
            self.write_text(BEST_SKILL_FILE, pending)

    # ---- history --------------------------------------------------------------------------

    def record_step(self, record: StepRecord) -> None:
        """Put ``record`` into ``history.jsonl``, replacing any line with the same (kind, step).

        The file is rewritten whole and atomically, lines ordered by step (then step, slow
        update, final), so recording a step again — a resumed run — never duplicates a line.
        """
        with self._history_lock:
            records = {(r.kind, r.step): r for r in self.read_history()}
            records[(record.kind, record.step)] = record
            ordered = sorted(records.values(), key=_history_key)
            self.write_text(HISTORY_FILE, "".join(r.model_dump_json() + "\n" for r in ordered))
            replaying = self._replaying_through
            if replaying is not None and record.kind == "step" and record.step > replaying:
                self._end_replay()

    def read_history(self) -> list[StepRecord]:
        """The records in ``history.jsonl`` (for reports; never used to decide what to skip).

        A line that is not a valid ``StepRecord`` is a ``RunDirError`` naming the file and line, except a
        torn last line (a write cut short), which is dropped with a warning.
        """
        return read_jsonl_models(self.history_path, StepRecord, RunDirError, "step record",
                                 torn_last_line_ok=True)

    # ---- evaluations and summary ------------------------------------------------------------

    def write_evaluation(
        self,
        name: str,
        rows: Sequence[ItemResult],
        *,
        split: str,
        skill_sha: str,
        scores: Scores | None = None,
    ) -> Path:
        """Write one evaluation under ``eval/<name>/`` and return that folder.

        - ``results.jsonl``: one row per item, in the given order, without the trajectory and the
          target's prompts (those are in ``predictions/``);
        - ``scores.json``: ``{name, split, skill_sha, hard, soft, n, errors, per_task_type}`` (``scores``
          defaults to the mean of the rows that are not error rows; ``errors`` counts those);
        - ``predictions/<id>/trajectory.json``, ``target_system_prompt.txt``,
          ``target_user_prompt.txt``: for people reading what the target did.

        Duplicate item ids are a ValueError. An id that is not a safe file name gets a cleaned
        folder name with a short hash suffix.
        """
        folder = self.eval_dir(name)
        rel = folder.relative_to(self.path)
        duplicates = sorted(item for item, count in Counter(row.id for row in rows).items() if count > 1)
        if duplicates:
            raise ValueError(f"evaluation {name!r} has duplicate item ids: {', '.join(duplicates[:10])}")
        scores = score_rows(answered_rows(rows) or rows) if scores is None else scores
        lines = [
            row.model_dump_json(exclude={"trajectory", "target_system_prompt", "target_user_prompt"}) + "\n"
            for row in rows
        ]
        self.write_text(rel / "results.jsonl", "".join(lines))
        for row in rows:
            item = rel / "predictions" / _safe_component(row.id)
            self.write_json(item / "trajectory.json", row.trajectory)
            self.write_text(item / "target_system_prompt.txt", row.target_system_prompt)
            self.write_text(item / "target_user_prompt.txt", row.target_user_prompt)
        self.write_json(
            rel / "scores.json",
            {
                "name": name,
                "split": split,
                "skill_sha": skill_sha,
                "hard": scores.hard,
                "soft": scores.soft,
                "n": scores.n,
                "errors": sum(row.is_error for row in rows),
                "per_task_type": per_task_type(rows),
            },
        )
        return folder

    def write_summary(self, summary: RunSummary) -> Path:
        """Write ``summary.json`` in its documented shape (see ``summary_dict``); the run reached its
        end, so a best skill held back during a replay is written first."""
        self._end_replay()
        return self.write_json(SUMMARY_FILE, summary_dict(summary))


def _checked_name(name: str, what: str) -> str:
    if not _SAFE_COMPONENT.fullmatch(name):
        raise RunDirError(f"{what} {name!r} must be one file name of letters, digits, '.', '_' and '-'")
    return name


def _config_yaml(config: SkillOptConfig, digest: str, provenance: Mapping[str, str]) -> str:
    """The text of ``config.yaml``: hash header, resolved config, ``sources:``; redacted."""

    def dump(data: Any) -> str:
        # width=inf: a folded line could split a secret-shaped string where the redactor cannot see it.
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=float("inf"))

    header = (
        "# skillopt resolved configuration (secrets are references only, and redacted)\n"
        f"# config_hash: {digest}\n"
        f"# not part of the hash: {', '.join(RESULT_NEUTRAL_FIELDS)}\n"
    )
    sources = {"sources": {key: str(provenance[key]) for key in sorted(provenance)}}
    redactor = Redactor.from_environment()
    text = header + dump(redact_tree(config.model_dump(mode="json"), redactor)) + dump(sources)
    return redactor(text)
