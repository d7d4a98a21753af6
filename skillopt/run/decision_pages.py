"""The HTML pages of ``skillopt compare`` (two skills, paired) and ``skillopt transfer`` (the heatmap).

Self-contained like the run report (``skillopt.run.report``): inline styles, no script, no network, every
secret the environment holds redacted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from skillopt.core.paired import PairedComparison
from skillopt.run.report import _esc, _page

#: How many flipped item ids the comparison page lists per direction.
SHOWN_FLIPS = 50


def compare_page(comparison: PairedComparison) -> str:
    """Skill B against skill A: scores, the difference with its interval, the test, flips, cost."""
    c = comparison
    rows = "".join(
        f"<tr><th>{name}</th><td>{_esc(side.label)}</td><td>{_esc(side.origin)}</td>"
        f"<td>{side.sha[:12]}</td><td>{side.gate:.3f}</td><td>{side.scores.hard:.3f}</td>"
        f"<td>{side.scores.soft:.3f}</td><td>{side.skill_tokens}</td><td>{side.per_item.tokens:.0f}</td>"
        f"<td>{_usd(side.per_item.usd)}</td></tr>"
        for name, side in (("A", c.a), ("B", c.b)))
    flips = "".join(
        f"<h3>{title} ({len(ids)})</h3><p>{_esc(', '.join(ids[:SHOWN_FLIPS]))}"
        f"{' …' if len(ids) > SHOWN_FLIPS else ''}</p>"
        for title, ids in (("Better with B", c.flips.improved), ("Worse with B", c.flips.regressed)))
    excluded = (f"<p class=\"warning\">{len(c.excluded)} items were error rows under a skill and are left "
                f"out on both sides.</p>" if c.excluded else "")
    body = (
        f"<h1>skillopt compare: {_esc(c.benchmark)} {_esc(c.split)}</h1>"
        f"<p><b>{_esc(c.verdict())}</b></p>"
        "<table><tr><th></th><th>skill</th><th>from</th><th>sha</th>"
        f"<th>score ({_esc(c.metric)})</th><th>hard</th><th>soft</th><th>skill tokens</th>"
        f"<th>target tokens/item</th><th>USD/item</th></tr>{rows}</table>"
        "<dl>"
        f"<dt>difference B − A</dt><dd>{c.difference:+.4f}</dd>"
        f"<dt>{c.confidence:.0%} interval</dt><dd>[{c.ci_low:+.4f}, {c.ci_high:+.4f}]</dd>"
        f"<dt>{_esc(c.method)} test</dt><dd>p = {c.p_value:.4f} (two-sided); one-sided p for B better = "
        f"{c.p_b_better:.4f}</dd>"
        f"<dt>items</dt><dd>{c.n}: {len(c.flips.improved)} better with B, {len(c.flips.regressed)} worse, "
        f"{c.flips.unchanged} unchanged</dd></dl>{excluded}{flips}"
    )
    return _page(f"skillopt compare: {c.benchmark}", body)


def matrix_page(matrix: Mapping[str, Any]) -> str:
    """The transfer heatmap: one table per benchmark, skills as rows, targets as columns; each cell's colour
    is its score, its text the score, the difference to the initial skill with its interval, and the cost."""
    sections = []
    for benchmark in matrix["benchmarks"]:
        head = "".join(f"<th>{_esc(target)}</th>" for target in matrix["targets"])
        lines = []
        for skill in matrix["skills"]:
            cells = []
            for target in matrix["targets"]:
                cell = _cell(matrix["cells"], skill["label"], target, benchmark)
                cells.append(_heat_cell(cell))
            lines.append(f"<tr><th>{_esc(skill['label'])}</th>{''.join(cells)}</tr>")
        sections.append(f"<h2>{_esc(benchmark)}</h2><table class=\"heat\"><tr><th>skill \\ target</th>{head}"
                        f"</tr>{''.join(lines)}</table>")
    legend = ("<p>Colour: the score (white 0, green 1). Δ: the difference to the initial skill on the same "
              f"target and benchmark, with its {matrix.get('confidence', 0.95):.0%} interval.</p>")
    style = "<style>table.heat td{text-align:center;min-width:9em}</style>"
    return _page("skillopt transfer", f"{style}<h1>skillopt transfer: {_esc(matrix['split'])} split</h1>"
                                      f"{legend}{''.join(sections)}")


def _cell(cells: Sequence[Mapping[str, Any]], skill: str, target: str, benchmark: str) -> Mapping[str, Any]:
    for cell in cells:
        if (cell["skill"], cell["target"], cell["benchmark"]) == (skill, target, benchmark):
            return cell
    return {}


def _heat_cell(cell: Mapping[str, Any]) -> str:
    if not cell or cell.get("score") is None:
        return "<td class=\"empty\">—</td>"
    score = float(cell["score"])
    shade = max(0, min(255, round(255 - 155 * score)))
    colour = f"rgb({shade},{max(0, min(255, round(255 - 55 * score)))},{shade})"
    diff = cell.get("difference")
    delta = "" if diff is None else (f"<br>Δ {diff:+.3f} [{cell['ci_low']:+.3f}, {cell['ci_high']:+.3f}]")
    return (f"<td style=\"background:{colour}\" title=\"n={cell.get('n')}\"><b>{score:.3f}</b>{delta}"
            f"<br><small>{_usd(cell.get('usd_per_item'))}/item, "
            f"{cell.get('tokens_per_item', 0):.0f} tok</small>"
            "</td>")


def _usd(value: float | None) -> str:
    return "cost unknown" if value is None else f"${value:.5f}"
