"""The report's Pareto front (``train.selection: pareto``): selection score against skill length.

Read from the run's ``front.json`` (``flows/front.py``); each member is a mark, the chosen skill a ringed
mark of its own series, and a table lists every member's step, score, length and the items it is best on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from skillopt.optimizer.pareto import FRONT_FILE
from skillopt.run.report import Series, _esc, line_chart


def front_section(run_dir: Path) -> str:
    """The ``<h2>Pareto front</h2>`` section, or "" for a run without a front."""
    path = Path(run_dir) / FRONT_FILE
    if not path.is_file():
        return ""
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return '<h2>Pareto front</h2><p class="empty">front.json cannot be read</p>'
    members = sorted(data.get("members", []), key=lambda m: (m["objectives"].get("skill_tokens") or 0))
    chosen = data.get("chosen")

    def point(member: dict[str, Any]) -> tuple[float, float]:
        return float(member["objectives"].get("skill_tokens") or 0), float(member["score"])

    kept = [m for m in members if m["sha"] != chosen]
    picked = [m for m in members if m["sha"] == chosen]
    series = [Series("front", [point(m) for m in kept], line=False),
              Series("chosen", [point(m) for m in picked], marks=["gate"] * len(picked), line=False)]
    chart = line_chart("chart-front", "Pareto front: selection score against skill length", series,
                       x_label="skill tokens", y_label="selection score", y_range=(0.0, 1.0))
    marked = ' class="chosen"'
    rows = "".join(
        f"<tr{marked if m['sha'] == chosen else ''}><td>{m['step']}</td><td>{m['score']:.3f}</td>"
        f"<td>{int(m['objectives'].get('skill_tokens') or 0)}</td><td>{len(m.get('best_items', []))}</td>"
        f"<td>{_esc(', '.join(m.get('best_objectives', [])))}</td>"
        f"<td>{'chosen' if m['sha'] == chosen else ''}</td></tr>"
        for m in members)
    table = ("<table><tr><th>step</th><th>score</th><th>skill tokens</th><th>items best on</th>"
             f"<th>best on objective</th><th></th></tr>{rows}</table>")
    rule = ("<p>Kept: accepted skills best on some selection item or objective and dominated by none. "
            "Chosen: the highest score; skills the gate cannot tell from it go to the shortest.</p>")
    return f'<h2>Pareto front</h2><div class="charts">{chart}</div>{rule}{table}'
