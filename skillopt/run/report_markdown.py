"""The run report as one markdown document, for the Prefect UI's artifact page.

The UI renders markdown artifacts (tables, headings, images) but cannot open a ``file://`` link to the HTML
report on the machine that ran the flow. So the run publishes the report's content itself: the scores, a
table per step, and the report's plots, each an SVG image carried in the document as a ``data:`` URI (the UI
shows such images inline; nothing is fetched). The HTML report (``skillopt report``) stays the fuller view,
with the skill diff viewer; the document says where it is.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from skillopt.core.redact import Redactor
from skillopt.llm.usage import cost_text
from skillopt.run.report import (
    RunData,
    budget_chart,
    cost_chart,
    models_used,
    score_chart,
    skill_length_chart,
)

#: The report page's chart styles, carried inside each SVG image (an image does not see the page's CSS).
_SVG_STYLE = (
    "text{font:11px system-ui,sans-serif;fill:#444}.axis{stroke:#888}.grid{stroke:#eee}"
    ".baseline{stroke:#555;stroke-dasharray:4 3}"
    "circle.point{fill:currentColor;stroke:#fff;stroke-width:1}circle.gate{r:6;stroke:#222;stroke-width:1.5}"
    "circle.accepted{fill:#2ca02c}circle.rejected{fill:#d62728}circle.skipped{fill:#bbb}"
    ".legend text{fill:#333}"
)
_SVG = re.compile(r"<svg\b.*?</svg>", re.S)


def chart_image(figure_html: str, title: str) -> str:
    """A markdown image of the SVG inside ``figure_html`` (a ``line_chart`` figure), white background and
    chart styles included; ``_no data yet_`` when the figure has no plot."""
    match = _SVG.search(figure_html)
    if match is None:
        return "_no data yet_"
    svg = match.group(0)
    head_end = svg.index(">") + 1
    svg = (svg[:head_end] + f"<style>{_SVG_STYLE}</style><rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>"
           + svg[head_end:])
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f"![{_cell(title)}](data:image/svg+xml;base64,{data})"


def report_markdown(run: RunData, *, html_report: str | None = None) -> str:
    """The report of ``run`` as markdown: summary scores, the plots, one row per step. ``html_report``: where
    the HTML report is (a URL or a path), named at the end."""
    lines = [f"# skillopt run {_cell(run.name)}", ""]
    if models := models_used(run.usage):
        lines += [f"Models: {_cell(models)}.", ""]
    summary = run.summary or {}
    scores = summary.get("scores") or {}
    if scores:
        lines += ["| skill | split | hard | soft |", "|---|---|---|---|"]
        for phase, splits in scores.items():
            for split, value in (splits or {}).items():
                if isinstance(value, dict):
                    lines.append(f"| {_cell(phase)} | {_cell(split)} | {_fmt(value.get('hard'))} | "
                                 f"{_fmt(value.get('soft'))} |")
        usage = (summary.get("usage") or {}).get("total") or {}
        lines += ["", f"Model calls {usage.get('calls', 0)}, tokens {usage.get('tokens', 0):,}"
                  + ("" if usage.get("usd") is None else f", cost {cost_text(usage)}")
                  + f"; stopped by: {summary.get('stopped_by') or 'nothing (ran to the end)'}.", ""]
    else:
        lines += ["_The run has not finished: no summary yet._", ""]
    lines += ["## Training curves", ""]
    for figure, title in ((score_chart(run), "score per step"), (budget_chart(run), "edit budget per step"),
                          (skill_length_chart(run), "skill length"), (cost_chart(run), "cost by stage")):
        lines += [f"**{title.capitalize()}**", "", chart_image(figure, title), ""]
    if run.steps:
        lines += ["## Steps", "", "| step | epoch | decision | candidate | current | best | edits applied |",
                  "|---|---|---|---|---|---|---|"]
        for record in run.steps:
            candidate = _fmt(record.gate.candidate_gate) if record.gate is not None else "–"
            lines.append(f"| {record.step} | {record.epoch} | {_cell(record.decision)} | {candidate} | "
                         f"{_fmt(record.current_score)} | {_fmt(record.best_score)} | "
                         f"{record.edits_applied} |")
        lines.append("")
    if html_report:
        lines += [f"The HTML report, with the skill diff viewer: `{_cell(html_report)}` "
                  "(`skillopt report RUN_DIR` writes it again).", ""]
    return Redactor.from_environment()("\n".join(lines))


def _fmt(value: Any) -> str:
    return "–" if not isinstance(value, int | float) else f"{value:.3f}"


def _cell(text: Any) -> str:
    """Text safe inside a markdown table cell or image title: no pipes, brackets or line breaks."""
    return re.sub(r"[|\[\]\n\r`]", " ", str(text))
