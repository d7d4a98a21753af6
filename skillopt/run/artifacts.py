"""The content of the Prefect artifacts a person watches during training.

Pure builders: each returns markdown text or table rows; the tasks in ``tasks/`` publish them
under ``artifact_key(benchmark, run, kind)``. Every string that leaves a builder has been passed
through a ``Redactor`` (default: ``Redactor.from_environment()``), so no artifact shows a secret
even if one slipped into a skill, an edit or a model name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

from skillopt.core.gate import GateResult
from skillopt.core.records import StepRecord, unusable_replies_warning
from skillopt.core.redact import Redactor
from skillopt.llm.chat import ROLE_OF_STAGE
from skillopt.skill.diff import file_diffs, skill_file_texts
from skillopt.skill.document import ApplyReport, Edit, unified_diff

#: The artifact kinds the flows publish, one stable key each per benchmark and run.
PROGRESS = "progress"
SKILL_DIFF = "skill-diff"
EDITS = "edits"
GATES = "gates"
COST = "cost"
REPORT = "report"
PROMOTION = "promotion"

#: How many characters of an edit's target the edits table shows.
TARGET_WIDTH = 60
#: How many characters of an edit's text the edits table shows (a rule is usually one or two sentences).
CONTENT_WIDTH = 400

_NOT_SLUG = re.compile(r"[^a-z0-9-]")
_ACCEPTED = frozenset({"accept", "accept_new_best", "force_accept"})


def slug(text: str) -> str:
    """Lower case, with every character outside ``[a-z0-9-]`` turned into ``-`` (``My_Run.2`` →
    ``my-run-2``)."""
    return _NOT_SLUG.sub("-", text.lower())


def artifact_key(benchmark: str, run: str, kind: str) -> str:
    """``slug(benchmark)-slug(run)-slug(kind)``: the only characters Prefect accepts in an artifact key.

    A run name that already starts with the benchmark (every default name does) is not repeated:
    run ``demo-20261201-101500-3fa9c1`` gives ``demo-20261201-101500-3fa9c1-progress``, not ``demo-demo-…``.
    A name the slug changes gets six hex digits of its own hash after it, so that two runs whose names differ
    only where the slug does (``Exp_1``, ``exp.1``) do not share their artifacts: ``demo-exp-1-5c3b1e-…``.
    """
    bench, run_slug = slug(benchmark), slug(run)
    if run_slug != run:
        run_slug += "-" + hashlib.sha256(run.encode("utf-8")).hexdigest()[:6]
    if run_slug == bench or run_slug.startswith(f"{bench}-"):
        return f"{run_slug}-{slug(kind)}"
    return f"{bench}-{run_slug}-{slug(kind)}"


def progress_percent(step: int, total_steps: int) -> float:
    """Completed share of the run in percent (0..100), for Prefect's progress artifact."""
    if total_steps <= 0:
        return 100.0
    return round(100.0 * min(max(step, 0), total_steps) / total_steps, 1)


def progress_markdown(
    epoch: int,
    epochs: int,
    step: int,
    total_steps: int,
    current: float | None,
    best: float | None,
    *,
    last_step: StepRecord | None = None,
    finished: bool = False,
    stopped: str | None = None,
    totals: Mapping[str, Any] | None = None,
    spend: str | None = None,
    redactor: Redactor | None = None,
) -> str:
    """Where training is and how it scores, e.g. ``**Epoch 2/4 · step 7/16 (43.8%)**`` plus a
    two-row table of the current and best gate scores (``–`` before the baseline is known), then
    what ``last_step`` was made of: its optimizer replies (parsed / fallback) and error rows, with
    a warning when most replies were unusable. ``finished``: the run's final figures (after the last
    epoch boundary and the final check), headed ``**Finished · …**``, or ``**Stopped · …**`` and why when
    ``stopped`` holds the message of a run that stopped early (a budget); ``totals`` (``runs.signal_counts``):
    the run's optimizer replies and error rows so far; ``spend``: what the run's model calls have cost so far
    (the ``cost`` artifact has it by stage once the run ends)."""
    done = progress_percent(step, total_steps)
    position = f"Epoch {epoch}/{epochs} · step {step}/{total_steps} ({done:.1f}%)"
    heading = ("Stopped · " if stopped else "Finished · ") if finished else ""
    text = (
        f"**{heading}{position}**\n\n" + (f"{stopped}\n\n" if finished and stopped else "")
        + "| skill | gate score |\n|---|---|\n"
        f"| current | {_score(current)} |\n| best | {_score(best)} |\n"
    )
    if last_step is not None:
        text += (f"\nLast step: optimizer replies {last_step.replies_parsed} parsed, "
                 f"{last_step.replies_fallback} fallback; error rows {last_step.n_error} in the batch, "
                 f"{len(last_step.gate_error_ids)} in the gate\n")
        warning = unusable_replies_warning(last_step.replies_parsed, last_step.replies_fallback)
        if warning:
            text += f"\n**Warning:** {warning}\n"
    if totals is not None:
        replies, errors = totals["optimizer_replies"], totals["errors"]
        text += (f"\nRun: optimizer replies {replies['parsed']} parsed, {replies['fallback']} fallback; "
                 f"error rows {errors['rollout']} in batches, {errors['gate']} in gates\n")
        warning = unusable_replies_warning(replies["parsed"], replies["fallback"])
        if warning and finished:
            text += f"\n**Warning:** {warning}\n"
    if spend:
        text += f"\nSpend so far: {spend}\n"
    return _redactor(redactor)(text)


def skill_diff_markdown(
    step: int, old: str, new: str, gate: GateResult, *, redactor: Redactor | None = None
) -> str:
    """A heading with the gate decision, its one-line explanation, and the unified diff from ``old``
    to ``new`` in a fenced ``diff`` block (the fence is longer than any backtick run in the diff). A skill
    of several files gets one ``#### <file>`` section and diff per changed file."""
    lines = [f"### Step {step}: {gate.decision}", "", gate.explain(), ""]
    if len(skill_file_texts(old)) < 2 and len(skill_file_texts(new)) < 2:
        diff = unified_diff(old, new, old_name=f"before step {step}", new_name=f"after step {step}")
        lines += _fenced_diff(diff) if diff else ["_The skill did not change._"]
        return _redactor(redactor)("\n".join(lines) + "\n")
    diffs = file_diffs(old, new, old_label=f"before step {step}", new_label=f"after step {step}")
    if not diffs:
        lines.append("_The skill did not change._")
    else:
        lines += [f"Files changed: {', '.join(f'`{path}`' for path in diffs)}", ""]
    for path, diff in diffs.items():
        lines += [f"#### {path}", "", *_fenced_diff(diff), ""]
    return _redactor(redactor)("\n".join(lines).rstrip("\n") + "\n")


def _fenced_diff(diff: str) -> list[str]:
    longest = max((len(run) for run in re.findall(r"`+", diff)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}diff", diff.rstrip("\n"), fence]


def edits_table(
    edits: Sequence[Edit],
    report: ApplyReport | None = None,
    decision: str | None = None,
    *,
    redactor: Redactor | None = None,
) -> list[dict[str, Any]]:
    """One row per edit of a step, in rank order: rank (1-based), the skill file it edits, op, target
    (shortened to ``TARGET_WIDTH`` characters, ``(end of body)`` for an append), content (the edit's text
    on one line, shortened to ``CONTENT_WIDTH``; empty for a delete), support, status, decision.

    ``edits`` are the selected edits in the order given to ``apply_edits``, so ``report.entries[i]``
    belongs to ``edits[i]``; status is the apply status (``not applied`` without a report entry).
    ``decision`` is the step's gate decision: edits that changed the skill show ``accepted`` or
    ``rejected`` (any other decision, e.g. a skip, is shown as is); edits that did not apply show ``–``.
    """
    clean = _redactor(redactor)
    entries = report.entries if report is not None else []
    rows = []
    for index, edit in enumerate(edits):
        status = entries[index].status if index < len(entries) else "not applied"
        changed = status in ("applied", "applied_fuzzy")
        rows.append(
            {
                "rank": index + 1,
                "file": clean(edit.file),
                "op": clean(edit.op),
                "target": clean(_shorten(edit.target)) if edit.target.strip() else "(end of body)",
                "content": clean(_shorten(edit.content, CONTENT_WIDTH)),
                "support": edit.support_count,
                "status": status,
                "decision": _edit_decision(decision) if changed else "–",
            }
        )
    return rows


def gate_table(history: Sequence[StepRecord]) -> list[dict[str, Any]]:
    """Gate results over time, one row per record in ``history`` order: step, epoch, decision,
    candidate / current / best gate scores (rounded to 4 places; ``None`` for a record without a
    gate, such as a skipped step, which shows the current and best scores after it) and flips
    ``+improved/-regressed``, the selection items left out as error rows, and the optimizer replies used
    of those the step asked for (``parsed/total``) and the skill files its candidate changed. Records other
    than plain steps show their kind in the decision."""
    rows = []
    for record in history:
        decision = record.decision if record.kind == "step" else f"{record.kind}: {record.decision}"
        gate = record.gate
        rows.append(
            {
                "step": record.step,
                "epoch": record.epoch,
                "decision": decision,
                "candidate": None if gate is None else round(gate.candidate_gate, 4),
                "current": round(record.current_score if gate is None else gate.current_gate, 4),
                "best": round(record.best_score if gate is None else gate.best_gate, 4),
                "flips": None if gate is None else gate.flips.label(),
                "errors": len(record.gate_error_ids),
                "replies": f"{record.replies_parsed}/{record.replies_parsed + record.replies_fallback}",
                "files": ", ".join(record.files_changed),
            }
        )
    return rows


def cost_table(summary: Mapping[str, Any] | BaseModel) -> list[dict[str, Any]]:
    """Usage per stage — stage, role, calls, tokens, usd — then a ``total`` row.

    ``summary`` is ``summary.json``'s object (or the ``RunSummary``), whose ``usage`` is the
    ledger's ``summary()``; that usage object itself is accepted too. A stage served by no single
    role (``preflight``) shows role ``–``.
    """
    data = summary.model_dump(mode="json") if isinstance(summary, BaseModel) else dict(summary)
    usage = data["usage"] if isinstance(data.get("usage"), Mapping) else data
    rows = [
        {
            "stage": row.get("stage", ""),
            "role": ROLE_OF_STAGE.get(row.get("stage", ""), "–"),
            "calls": row.get("calls", 0),
            "tokens": row.get("tokens", 0),
            "usd": _usd(row),
        }
        for row in usage.get("by_stage", [])
    ]
    total = usage.get("total")
    if isinstance(total, Mapping):
        rows.append(
            {
                "stage": "total",
                "role": "",
                "calls": total.get("calls", 0),
                "tokens": total.get("tokens", 0),
                "usd": _usd(total),
            }
        )
    return rows


def _usd(row: Mapping[str, Any]) -> float | str:
    """A usage row's cost: the USD figure, ``unknown`` when none of its calls has a price, and the priced
    part plus ``unknown`` when only some have."""
    usd = round(float(row.get("usd") or 0.0), 6)
    unpriced = int(row.get("unpriced_calls") or 0)
    if not unpriced:
        return usd
    return "unknown" if not usd else f"{usd} + unknown ({unpriced} unpriced calls)"


def report_url(report: Path, *, run_name: str, reports_url: str | None) -> str:
    """Where a person opens the run's HTML report: ``<reports_url>/<run name>/<file>`` when the run
    directories are served (e.g. by the compose ``reports`` server), else the file's ``file://`` URL."""
    if reports_url:
        return f"{reports_url.rstrip('/')}/{quote(run_name)}/{quote(report.name)}"
    return report.resolve().as_uri()


def _edit_decision(decision: str | None) -> str:
    if decision is None:
        return "pending"
    if decision in _ACCEPTED:
        return "accepted"
    if decision == "reject":
        return "rejected"
    return decision


def _shorten(text: str, width: int = TARGET_WIDTH) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _score(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _redactor(redactor: Redactor | None) -> Redactor:
    return Redactor.from_environment() if redactor is None else redactor
