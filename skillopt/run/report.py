"""The HTML run report and the side-by-side comparison of runs.

``render_report(run)`` and ``render_compare(runs)`` return one self-contained HTML document: the
plots are inline SVG with one mark per data point, the style and the few lines of script (the
diff viewer's step picker) are inline, and a Content-Security-Policy forbids every fetch, so the
file opens offline and shows the same everywhere. Everything read from the run directory (skill
text, edits, run names, model names) is untrusted and escaped before it reaches the page.

Reading is done by ``load_run`` from the run directory alone (``history.jsonl``, ``summary.json``,
``skills/step_NNNN.md``, ``usage.jsonl``); a run still in progress has no summary yet and gets a
report of what it has.
"""

from __future__ import annotations

import html
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skillopt.core.errors import SkillOptError
from skillopt.core.records import StepRecord, unusable_replies_warning
from skillopt.core.redact import Redactor
from skillopt.llm.usage import cost_text, role_order
from skillopt.run.runs import HISTORY_FILE, SUMMARY_FILE, RunDir
from skillopt.skill.diff import file_diffs, skill_file_texts
from skillopt.skill.document import unified_diff

#: The report's file name inside the run directory.
REPORT_FILE = "report.html"
#: At most this many marks per cost series; longer series are thinned evenly (first and last kept).
MAX_SERIES_POINTS = 300

_log = logging.getLogger(__name__)
_SNAPSHOT = re.compile(r"step_(\d{4,})(?:_(slow_update))?\.md")
_ACCEPTED = frozenset({"accept", "accept_new_best", "force_accept"})
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
        "connect-src 'none'; font-src 'none'")


class ReportError(SkillOptError):
    """A folder that is not a run directory, or a record in it that cannot be read."""


# --------------------------------------------------------------------------------------------
# Reading a run


@dataclass
class RunData:
    path: Path
    name: str
    history: list[StepRecord]
    summary: dict[str, Any] | None
    skills: dict[int, str]
    usage: list[dict[str, Any]] = field(default_factory=list)
    #: The skill after the epoch boundary that followed a step, where the slow update changed it, by step.
    boundaries: dict[int, str] = field(default_factory=dict)

    @property
    def steps(self) -> list[StepRecord]:
        return [r for r in self.history if r.kind == "step"]


def load_run(path: Path | str) -> RunData:
    """Read what a report shows from the run directory ``path``.

    Raises ``ReportError`` when ``path`` is not a run directory (none of ``history.jsonl``,
    ``summary.json``, ``skills/``) or a file in it cannot be parsed (naming the file and line).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ReportError(f"{folder}: no such run directory")
    if not any((folder / name).exists() for name in (HISTORY_FILE, SUMMARY_FILE, "skills")):
        raise ReportError(f"{folder} is not a run directory: it has no {HISTORY_FILE}, {SUMMARY_FILE} or "
                          "skills/")
    run = RunDir(folder)
    try:
        history = run.read_history()
    except SkillOptError as error:
        raise ReportError(str(error)) from None
    summary = None
    if run.summary_path.is_file():
        try:
            summary = json.loads(run.summary_path.read_text(encoding="utf-8"))
        except ValueError as error:
            raise ReportError(f"{run.summary_path}: not valid JSON ({error})") from None
    skills: dict[int, str] = {}
    boundaries: dict[int, str] = {}
    if (folder / "skills").is_dir():
        for snapshot in sorted((folder / "skills").iterdir()):
            match = _SNAPSHOT.fullmatch(snapshot.name)
            if match:
                into = boundaries if match.group(2) else skills
                into[int(match.group(1))] = snapshot.read_text(encoding="utf-8", errors="replace")
    usage = []
    if run.usage_path.is_file():
        for number, line in enumerate(
            run.usage_path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
        ):
            if not line.strip():
                continue
            try:
                usage.append(json.loads(line))
            except ValueError:  # a line cut short by a crash or a full disk; the ledger skips it too
                _log.warning("%s:%d: not a JSON line (a write cut short?); left out of the report",
                             run.usage_path, number)
    name = str(summary.get("run_name")) if summary and summary.get("run_name") else folder.name
    return RunData(path=folder, name=name, history=history, summary=summary, skills=skills, usage=usage,
                   boundaries=boundaries)


# --------------------------------------------------------------------------------------------
# Inline SVG charts


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    #: One CSS class per point (e.g. the step's decision), or empty for plain marks.
    marks: list[str] = field(default_factory=list)
    line: bool = True


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _ticks(low: float, high: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """Round tick values covering ``low``..``high``; ``integer``: whole numbers only (steps, calls)."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    if integer:
        step = max(1, math.ceil(step))
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step + 1e-9) + 1)]


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def line_chart(chart_id: str, title: str, series: Sequence[Series], *, x_label: str, y_label: str,
               y_range: tuple[float, float] | None = None, integer_x: bool = True,
               baseline: tuple[str, float] | None = None) -> str:
    """A ``<figure class="chart">`` holding an inline SVG: one ``<circle class="point">`` per data
    point (``data-x``/``data-y`` carry the values), a polyline per series, axes with ticks (whole numbers
    on x unless ``integer_x`` is off) and a legend. ``baseline`` (label, value): a dashed horizontal line
    (``line.baseline``) with its own legend entry. The figure's ``data-points`` is the number of marks
    drawn."""
    width, height, left, right, top, bottom = 660, 280, 56, 170, 16, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    total = len(xs)
    parts = [f'<figure class="chart" id="{_esc(chart_id)}" data-points="{total}">',
             f"<figcaption>{_esc(title)}</figcaption>"]
    if not total:
        parts.append('<p class="empty">no data yet</p></figure>')
        return "".join(parts)
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range if y_range else (min(0.0, min(ys)), max(ys))
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y1 = y0 + 1

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" aria-label="{_esc(title)}">']
    svg.append(f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
               f'y2="{top + plot_h}"/>')
    svg.append(f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}"/>')
    for tick in _ticks(y0, y1):
        y = py(tick)
        svg.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}"/><text '
                   f'class="tick" x="{left - 6}" y="{y + 4:.1f}" '
                   f'text-anchor="end">{_esc(_number(tick))}</text>')
    for tick in _ticks(x0, x1, 8, integer=integer_x):
        x = px(tick)
        svg.append(f'<text class="tick" x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
                   f"{_esc(_number(tick))}</text>")
    svg.append(f'<text class="label" x="{left + plot_w / 2}" y="{height - 4}" text-anchor="middle">'
               f"{_esc(x_label)}</text>")
    svg.append(f'<text class="label" transform="rotate(-90)" x="{-(top + plot_h / 2)}" y="14" '
               f'text-anchor="middle">{_esc(y_label)}</text>')
    for index, s in enumerate(series):
        color = _COLORS[index % len(_COLORS)]
        svg.append(f'<g class="series" data-series="{_esc(s.name)}" data-points="{len(s.points)}" '
                   f'style="color:{color}">')
        if s.line and len(s.points) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
            svg.append(f'<polyline points="{path}" fill="none" stroke="currentColor" stroke-width="1.5"/>')
        for i, (x, y) in enumerate(s.points):
            mark = s.marks[i] if i < len(s.marks) else ""
            svg.append(f'<circle class="point {_esc(mark)}" cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" '
                       f'data-x="{x:g}" data-y="{y:g}"><title>{_esc(s.name)}: {_esc(_number(x))}, '
                       f"{y:.4g}{(' — ' + _esc(mark)) if mark else ''}</title></circle>")
        svg.append("</g>")
        ly = top + 14 + 18 * index
        svg.append(f'<g class="legend" style="color:{color}"><rect x="{left + plot_w + 12}" y="{ly - 9}" '
                   f'width="10" height="10" fill="currentColor"/><text x="{left + plot_w + 28}" '
                   f'y="{ly}">{_esc(s.name)}</text></g>')
    if baseline is not None and y0 <= baseline[1] <= y1:
        y = py(baseline[1])
        ly = top + 14 + 18 * len(series)
        svg.append(f'<line class="baseline" x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                   f'stroke="#555" stroke-dasharray="4 3" data-y="{baseline[1]:g}"><title>'
                   f'{_esc(baseline[0])}: {baseline[1]:.4g}</title></line>'
                   f'<g class="legend"><line x1="{left + plot_w + 12}" y1="{ly - 4}" '
                   f'x2="{left + plot_w + 22}" y2="{ly - 4}" stroke="#555" stroke-dasharray="4 3"/><text '
                   f'x="{left + plot_w + 28}" y="{ly}">{_esc(baseline[0])}</text></g>')
    svg.append("</svg>")
    parts += svg
    parts.append("</figure>")
    return "".join(parts)


def _decision_mark(decision: str) -> str:
    if decision in _ACCEPTED:
        return "accepted"
    if decision == "reject":
        return "rejected"
    return "skipped"


# --------------------------------------------------------------------------------------------
# The report's sections


def score_chart(run: RunData, chart_id: str = "chart-scores") -> str:
    """Selection (gate) score after each step, the candidate's gate score (marked accepted or
    rejected) and the rollout (train batch) score of each step."""
    steps = run.steps
    selection = Series("selection (current)", [(r.step, r.current_score) for r in steps],
                       ["skipped" if _decision_mark(r.decision) == "skipped" else "" for r in steps])
    gated = [(r, r.gate) for r in steps if r.gate is not None]
    candidate = Series("candidate (gate)", [(r.step, gate.candidate_gate) for r, gate in gated],
                       ["gate " + _decision_mark(r.decision) for r, _ in gated], line=False)
    rollout = Series(
        "rollout (train batch)", [(r.step, r.rollout_hard) for r in steps if r.rollout_hard is not None]
    )
    baseline = baseline_score(run)
    return line_chart(chart_id, "Score per step (gate marks: green accepted, red rejected; grey: step "
                                "skipped; dashed: the initial skill)",
                      [selection, candidate, rollout], x_label="step", y_label="score", y_range=(0.0, 1.0),
                      baseline=None if baseline is None else ("baseline (selection)", baseline))


def baseline_score(run: RunData) -> float | None:
    """The initial skill's gate score on the selection split: from the summary (with the run's gate metric),
    else, for a run in progress, the current score the first step's gate compared against."""
    from skillopt.core.gate import gate_score

    summary = run.summary or {}
    selection = ((summary.get("scores") or {}).get("baseline") or {}).get("selection")
    if isinstance(selection, dict) and isinstance(selection.get("hard"), int | float):
        evaluation = (summary.get("config") or {}).get("evaluation") or {}
        try:
            return gate_score(float(selection["hard"]), float(selection.get("soft") or 0.0),
                              evaluation.get("gate_metric", "hard"),
                              float(evaluation.get("gate_mixed_weight", 0.5)))
        except ValueError:
            return float(selection["hard"])
    first = next((r for r in run.steps if r.step == 1 and r.gate is not None), None)
    return first.gate.current_gate if first is not None and first.gate is not None else None


def budget_chart(run: RunData) -> str:
    steps = run.steps
    return line_chart("chart-budget", "Edit budget (learning rate) per step",
                      [Series("edit budget", [(r.step, r.budget) for r in steps]),
                       Series("edits applied", [(r.step, r.edits_applied) for r in steps])],
                      x_label="step", y_label="edits")


def skill_length_chart(run: RunData) -> str:
    return line_chart(
        "chart-skill-length",
        "Skill length after each step",
        [Series("characters", [(step, len(text)) for step, text in sorted(run.skills.items())])],
        x_label="step",
        y_label="characters",
    )


def cost_chart(run: RunData) -> str:
    """Cumulative spend per stage over the run's calls: USD when any call had a price, else tokens."""
    calls = [r for r in run.usage if not r.get("cache_hit")]
    priced = any((r.get("cost_usd") or 0) > 0 for r in calls)
    unit = "USD" if priced else "tokens"
    running: dict[str, float] = {}
    points: dict[str, list[tuple[float, float]]] = {}
    for index, record in enumerate(calls, start=1):
        stage = str(record.get("stage", "?"))
        amount = (record.get("cost_usd") or 0.0) if priced else \
            (record.get("prompt_tokens") or 0) + (record.get("completion_tokens") or 0)
        running[stage] = running.get(stage, 0.0) + amount
        points.setdefault(stage, []).append((index, running[stage]))
    series = [Series(stage, _thin(values)) for stage, values in points.items()]
    return line_chart("chart-cost", f"Cumulative {unit} by stage over the run's model calls", series,
                      x_label="model call", y_label=unit)


def _thin(points: list[tuple[float, float]], limit: int = MAX_SERIES_POINTS) -> list[tuple[float, float]]:
    if len(points) <= limit:
        return points
    picks = sorted({round(i * (len(points) - 1) / (limit - 1)) for i in range(limit)})
    return [points[i] for i in picks]


def diff_viewer(run: RunData) -> str:
    """One panel per skill snapshot (each step's, and the epoch boundary's after a step where the slow update
    changed the skill): the unified diff from the previous snapshot, lines marked as added or removed; a
    picker shows one panel at a time: the latest accepted change by default (else the latest change, else
    the last snapshot)."""
    decisions = {r.step: r.decision for r in run.steps}
    boundary_decisions = {r.step: r.decision for r in run.history if r.kind == "slow_update"}
    # (panel id, label, what it is called in a diff header, text, accepted)
    snapshots: list[tuple[str, str, str, str, bool]] = []
    for step in sorted({*run.skills, *run.boundaries}):
        if step in run.skills:
            label = f"step {step}" + (f" ({decisions[step]})" if step in decisions else
                                      " (initial skill)" if step == 0 else "")
            snapshots.append((str(step), label, f"step {step}", run.skills[step],
                              decisions.get(step) in _ACCEPTED))
        if step in run.boundaries:
            decision = boundary_decisions.get(step, "slow_update")
            snapshots.append((f"{step}-slow-update", f"after step {step}: epoch boundary, slow update "
                              f"({decision})", f"step {step} + slow update", run.boundaries[step],
                              decision in _ACCEPTED))
    changed = [current[0] for current, previous in zip(snapshots[1:], snapshots, strict=False)
               if current[3] != previous[3]]
    accepted = [key for key, _, _, _, ok in snapshots if ok and key in changed]
    latest = [snapshots[-1][0]] if snapshots else []
    shown = next(iter(reversed(accepted or changed or latest)), None)
    panels, options = [], []
    for (key, label, name, text, _), previous in zip(snapshots, [None, *snapshots], strict=False):
        before = previous[3] if previous else ""
        old_name = previous[2] if previous else "(empty)"
        if len(skill_file_texts(before)) > 1 or len(skill_file_texts(text)) > 1:
            # A skill folder: one diff per changed file, each headed by the file's path.
            per_file = file_diffs(before, text, old_label=old_name, new_label=name)
            diff = "".join(per_file.values())
            if per_file:
                label += " — files changed: " + ", ".join(per_file)
        else:
            diff = unified_diff(before, text, old_name=old_name, new_name=name)
        lines = []
        for line in diff.splitlines():
            kind = ("add" if line.startswith("+") and not line.startswith("+++") else
                    "del" if line.startswith("-") and not line.startswith("---") else
                    "hunk" if line.startswith("@@") else "meta" if line.startswith(("+++", "---")) else "ctx")
            lines.append(f'<span class="line {kind}">{_esc(line)}</span>')
        body = "".join(lines) if lines else '<span class="line ctx">(no change)</span>'
        hidden = "" if key == shown else " hidden"
        panels.append(f'<section class="diff-panel" data-step="{key}"{hidden}><h3>{_esc(label)}</h3><pre '
                      f'class="diff">{body}</pre><details><summary>full skill after {_esc(name)}</summary>'
                      f'<pre class="skill">{_esc(text)}</pre></details></section>')
        options.append(f'<option value="{key}"{" selected" if key == shown else ""}>{_esc(label)}</option>')
    if not panels:
        return '<p class="empty">no skill snapshots (skills/step_NNNN.md) yet</p>'
    picker = (f'<label>Show the change made by <select id="diff-step">{"".join(options)}</select></label>')
    return f'<div id="diff-viewer">{picker}{"".join(panels)}</div>'


_DIFF_SCRIPT = """
document.getElementById('diff-step')?.addEventListener('change', function (event) {
  for (const panel of document.querySelectorAll('.diff-panel')) {
    panel.hidden = panel.dataset.step !== event.target.value;
  }
});
"""


def models_used(usage: Sequence[Mapping[str, Any]]) -> str:
    """The models that answered each role's calls, from ``usage.jsonl`` (``target local/SmolLM2-….gguf;
    optimizer scripted/scripted``); a role answered by several models gets each one's number of calls."""
    by_role: dict[str, Counter[str]] = {}
    for row in usage:
        if row.get("role"):
            model = row.get("model_served") or row.get("model_requested") or "?"
            by_role.setdefault(str(row["role"]), Counter())[f"{row.get('backend')}/{model}"] += 1
    parts = []
    for role in sorted(by_role, key=role_order):
        models = by_role[role]
        if len(models) == 1:
            parts.append(f"{role} {next(iter(models))}")
        else:
            calls = (f"{model} ({n} call{'s' if n != 1 else ''})" for model, n in models.most_common())
            parts.append(f"{role} {', '.join(calls)}")
    return "; ".join(parts)


def summary_section(run: RunData) -> str:
    summary = run.summary
    if summary is None:
        return '<p class="empty">no summary.json yet: the run has not finished</p>'
    rows = []
    for phase, splits in (summary.get("scores") or {}).items():
        for split, value in (splits or {}).items():
            if isinstance(value, dict):
                rows.append(f"<tr><td>{_esc(phase)}</td><td>{_esc(split)}</td><td>{_fmt(value.get('hard'))}</td>"
                            f"<td>{_fmt(value.get('soft'))}</td></tr>")
    scores = ("<table class='scores'><tr><th>skill</th><th>split</th><th>hard</th><th>soft</th></tr>"
              + "".join(rows) + "</table>")
    total = (summary.get("counts") or {}).get("total") or {}
    usage = (summary.get("usage") or {}).get("total") or {}
    facts = [
        ("benchmark", summary.get("benchmark", "")),
        ("steps", f"{total.get('n', 0)}: {total.get('accepts', 0)} accepted, {total.get('rejects', 0)} "
                  f"rejected, {total.get('skips', 0)} skipped"),
        ("model calls", usage.get("calls", 0)),
        ("tokens", f"{usage.get('tokens', 0):,}" if isinstance(usage.get("tokens"), int) else ""),
        ("cost", "n/a" if usage.get("usd") is None else cost_text(usage)),
        ("wall time", f"{summary.get('wall_s', 0):.0f} s"),
        ("stopped by", summary.get("stopped_by") or "— (ran to the end)"),
        ("best skill sha256", summary.get("best_skill_sha", "")),
    ]
    if summary.get("stopped_message"):
        facts.insert(-1, ("stop message", summary["stopped_message"]))
    replies = (summary.get("counts") or {}).get("optimizer_replies") or {}
    errors = (summary.get("counts") or {}).get("errors") or {}
    facts.insert(2, ("optimizer replies", f"{replies.get('parsed', 0)} parsed, {replies.get('fallback', 0)} "
                                          "unusable (stage fallback)"))
    facts.insert(3, ("error rows", f"{errors.get('rollout', 0)} training rollouts, {errors.get('gate', 0)} "
                                   "gate items (left out of reflection and gates)"))
    if models := models_used(run.usage):
        facts.insert(1, ("models", models))
    dl = "".join(f"<dt>{_esc(k)}</dt><dd>{_esc(v)}</dd>" for k, v in facts)
    warnings = "".join(f"<p class='warning'><strong>Warning:</strong> {_esc(w)}</p>"
                       for w in summary.get("warnings") or [])
    stages = (summary.get("usage") or {}).get("by_stage") or []
    cost_rows = "".join(
        f"<tr><td>{_esc(r.get('stage'))}</td><td>{_esc(r.get('calls'))}</td><td>{_esc(r.get('tokens'))}</td>"
        f"<td>{_esc(_usd(r))}</td></tr>" for r in stages)
    cost = ("<table class='cost'><tr><th>stage</th><th>calls</th><th>tokens</th><th>USD</th></tr>"
            + cost_rows + "</table>") if stages else ""
    return f'<div id="summary">{warnings}{scores}<dl>{dl}</dl>{cost}{steps_table(run)}</div>'


def steps_table(run: RunData) -> str:
    """One row per step: decision, failures and error rows of the batch, gate items left out as errors,
    and the optimizer replies used (parsed) and unusable (fallback), flagged when most were unusable."""
    rows = []
    for record in run.steps:
        flag = " ⚠" if unusable_replies_warning(record.replies_parsed, record.replies_fallback) else ""
        rows.append(f"<tr><td>{record.step}</td><td>{_esc(record.decision)}</td><td>{record.n_fail}/{record.n_total}"
                    f"</td><td>{record.n_error}</td><td>{len(record.gate_error_ids)}</td><td>{record.replies_parsed}"
                    f"</td><td>{record.replies_fallback}{flag}</td></tr>")
    if not rows:
        return ""
    return (
        "<table class='steps'><tr><th>step</th><th>decision</th><th>failed</th><th>error rows</th>"
        "<th>gate errors</th><th>replies parsed</th><th>replies unusable</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _usd(usage: Mapping[str, Any]) -> str:
    """A USD table cell: the cost without its dollar sign (``unknown`` parts included), ``–`` for none."""
    return "–" if usage.get("usd") is None else cost_text(usage).removeprefix("$")


def _fmt(value: Any, places: int = 3) -> str:
    return "–" if not isinstance(value, int | float) else f"{value:.{places}f}"


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1000px}
body{color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0;border:1px solid #eee;padding:6px}
figcaption{font-weight:600;font-size:13px}svg text{font-size:11px;fill:#444}.axis{stroke:#888}
.grid{stroke:#eee}
circle.point{fill:currentColor;stroke:#fff;stroke-width:1}circle.gate{r:6;stroke:#222;stroke-width:1.5}
circle.accepted{fill:#2ca02c}circle.rejected{fill:#d62728}circle.skipped{fill:#bbb}.legend text{fill:#333}
.runs circle.accepted{fill:currentColor}.runs circle.rejected{fill:#fff;stroke:currentColor;stroke-width:2}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dt{font-weight:600}
dd{margin:0;word-break:break-all}
pre{background:#f7f7f7;padding:8px;overflow:auto;white-space:pre-wrap}.diff .line{display:block}
.diff .add{background:#e6ffed;color:#22863a}.diff .del{background:#ffeef0;color:#b31d28}
.diff .hunk{color:#6f42c1}
.diff .meta{color:#888}.empty{color:#888;font-style:italic}.warning{background:#fff4e5;padding:6px 8px}
"""


def _page(title: str, body: str, script: str = "") -> str:
    """The whole document; every secret the environment holds is redacted from it, as from artifacts."""
    return Redactor.from_environment()(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{_esc(title)}</title><style>{_STYLE}</style></head><body>{body}"
        + (f"<script>{script}</script>" if script else "") + "</body></html>\n"
    )


def render_report(run: RunData) -> str:
    """The self-contained HTML report of one run."""
    from skillopt.run.front_chart import front_section

    body = [
        f"<h1>skillopt run {_esc(run.name)}</h1>",
        "<h2>Summary</h2>", summary_section(run),
        "<h2>Training curves</h2><div class=\"charts\">",
        score_chart(run), budget_chart(run), skill_length_chart(run), cost_chart(run), "</div>",
        front_section(run.path),
        "<h2>Skill changes</h2>", diff_viewer(run),
    ]
    return _page(f"skillopt report: {run.name}", "".join(body), _DIFF_SCRIPT)


def render_compare(runs: Sequence[RunData]) -> str:
    """Several runs side by side: score curves, final scores and cost."""
    if not runs:
        raise ReportError("compare needs at least one run directory")
    # Colour tells the runs apart here, so a gate decision is a shape: filled accepted, hollow rejected.
    curves = line_chart("chart-compare-scores", "Selection score (current skill) per step (gate marks: "
                        "filled accepted, hollow rejected, grey skipped)",
                        [Series(run.name, [(r.step, r.current_score) for r in run.steps],
                                [_decision_mark(r.decision) for r in run.steps]) for run in runs],
                        x_label="step", y_label="score", y_range=(0.0, 1.0))
    costs = line_chart("chart-compare-cost", "Cumulative tokens over the run's model calls",
                       [Series(run.name, _thin(_cumulative_tokens(run))) for run in runs],
                       x_label="model call", y_label="tokens")
    header = ("<tr><th>run</th><th>benchmark</th><th>models</th><th>baseline selection</th><th>best "
              "selection</th><th>baseline test</th><th>best "
              "test</th><th>steps</th><th>calls</th><th>tokens</th><th>USD</th><th>stopped by</th></tr>")
    rows = []
    for run in runs:
        s = run.summary or {}
        scores = s.get("scores") or {}
        usage = (s.get("usage") or {}).get("total") or {}

        def score(phase: str, split: str, scores: dict = scores) -> str:
            return _fmt(((scores.get(phase) or {}).get(split) or {}).get("hard"))

        rows.append(f"<tr><td>{_esc(run.name)}</td><td>{_esc(s.get('benchmark', ''))}</td>"
                    f"<td>{_esc(models_used(run.usage) or '–')}</td>"
                    f"<td>{score('baseline', 'selection')}</td><td>{score('best', 'selection')}</td>"
                    f"<td>{score('baseline', 'test')}</td><td>{score('best', 'test')}</td>"
                    f"<td>{len(run.steps)}</td><td>{_esc(usage.get('calls', '–'))}</td>"
                    f"<td>{_esc(usage.get('tokens', '–'))}</td><td>{_esc(_usd(usage))}</td>"
                    f"<td>{_esc(s.get('stopped_by') or '–' if s else 'unfinished')}</td></tr>")
    table = f"<table id='compare-table'>{header}{''.join(rows)}</table>"
    body = (f"<h1>skillopt: {len(runs)} runs compared</h1><h2>Final scores and cost (hard scores)</h2>{table}"
            f"<h2>Curves</h2><div class=\"charts runs\">{curves}{costs}</div>")
    return _page("skillopt compare", body)


def _cumulative_tokens(run: RunData) -> list[tuple[float, float]]:
    total = 0.0
    points: list[tuple[float, float]] = []
    for index, record in enumerate((r for r in run.usage if not r.get("cache_hit")), start=1):
        total += (record.get("prompt_tokens") or 0) + (record.get("completion_tokens") or 0)
        points.append((index, total))
    return points


def write_report(run_dir: Path | str, out: Path | str | None = None) -> Path:
    """Render the report of ``run_dir`` to ``out`` (default ``<run_dir>/report.html``), atomically."""
    from skillopt.core.atomic import atomic_write_bytes

    run = load_run(run_dir)
    target = Path(out) if out else run.path / REPORT_FILE
    atomic_write_bytes(target, render_report(run).encode("utf-8"))
    return target
