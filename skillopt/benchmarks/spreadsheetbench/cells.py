"""Workbooks, test cases and the cell comparison of SpreadsheetBench.

The comparison mirrors the official ``evaluation.py`` of RUCKBReasoning/SpreadsheetBench: both
values are transformed (numbers and numeric strings → ``round(float(v), 2)``, ``time`` →
``str(v)[:-3]``, ``datetime`` → Excel serial rounded to 0 decimals), ``""`` equals ``None``, then
the types must match and then the values. ``openpyxl`` is imported only inside functions.
"""

from __future__ import annotations

import datetime as dt
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_EXCEL_EPOCH = dt.datetime(1899, 12, 30)
_CASE_FILE = re.compile(r"^(\d+)_(.+)_(input|answer|init|golden)\.xlsx$")
_PAIRS = (("input", "answer"), ("init", "golden"))
PREVIEW_ROWS = 5
PREVIEW_COLS = 20
PREVIEW_VALUE_CHARS = 40


@dataclass(frozen=True)
class TestCase:
    """One input workbook and its golden workbook."""

    __test__ = False  # not a pytest class

    number: int
    input_path: Path
    golden_path: Path


@dataclass(frozen=True)
class CellCheck:
    """One graded cell: the target's value, the expected one and whether they compare equal."""

    where: str
    got: Any
    expected: Any
    ok: bool
    formula: str = ""


@dataclass
class CaseOutcome:
    """One test case: ``fail_reason`` is "" when every cell matched."""

    number: int
    fail_reason: str = ""
    cells: list[CellCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.fail_reason


def find_test_cases(task_dir: Path) -> list[TestCase]:
    """The test-case pairs in ``task_dir``, by number: ``{n}_{id}_input|answer``, ``{n}_{id}_init|golden``,
    or ``initial.xlsx`` + ``golden.xlsx`` (case 1). A file without its partner is ignored."""
    if not task_dir.is_dir():
        return []
    found: dict[tuple[int, str], dict[str, Path]] = {}
    for path in task_dir.iterdir():
        match = _CASE_FILE.match(path.name)
        if match:
            found.setdefault((int(match[1]), match[2]), {})[match[3]] = path
    cases = []
    for (number, _), files in sorted(found.items()):
        for given, gold in _PAIRS:
            if given in files and gold in files:
                cases.append(TestCase(number, files[given], files[gold]))
                break
    if not cases and (task_dir / "initial.xlsx").is_file() and (task_dir / "golden.xlsx").is_file():
        cases.append(TestCase(1, task_dir / "initial.xlsx", task_dir / "golden.xlsx"))
    return cases


def split_ranges(answer_position: str, answer_sheet: str | None) -> list[tuple[str | None, str]]:
    """``answer_position`` as ``[(sheet or None, "A1:B5"), ...]``: split on commas outside quotes,
    quotes stripped, ``answer_sheet`` prefixed to sheetless ranges."""
    parts, current, quoted = [], "", False
    for char in answer_position:
        if char == "'":
            quoted = not quoted
        if char == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    ranges: list[tuple[str | None, str]] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        sheet: str | None = answer_sheet or None
        if "!" in part:
            sheet, part = part.rsplit("!", 1)
            sheet = sheet.strip().strip("'").strip('"')
        ranges.append((sheet, part.strip().replace("$", "").upper()))
    return ranges


def transform_value(value: Any) -> Any:
    """The official value transform (``datetime.date`` counts as midnight of that day)."""
    if isinstance(value, bool | int | float):
        return round(float(value), 2)
    if isinstance(value, dt.time):
        return str(value)[:-3]
    if isinstance(value, dt.datetime | dt.date):
        moment = value if isinstance(value, dt.datetime) else dt.datetime(value.year, value.month, value.day)
        delta = moment.replace(tzinfo=None) - _EXCEL_EPOCH
        return round(delta.days + delta.seconds / 86400.0, 0)
    if isinstance(value, str):
        try:
            return round(float(value), 2)
        except ValueError:
            return value
    return value


def cells_equal(got: Any, expected: Any) -> bool:
    """Equal after :func:`transform_value`: ``""`` ≡ ``None``, then same type, then same value."""
    a, b = transform_value(got), transform_value(expected)
    if a in ("", None) and b in ("", None):
        return True
    return type(a) is type(b) and a == b


def compare_workbooks(number: int, output: bytes, golden_path: Path,
                      ranges: Sequence[tuple[str | None, str]]) -> CaseOutcome:
    """Compare every graded cell of ``output`` (an .xlsx file's bytes) with the golden workbook."""
    from openpyxl import load_workbook
    from openpyxl.utils import get_column_letter, range_boundaries

    outcome = CaseOutcome(number)
    gold_book = load_workbook(golden_path, data_only=True)
    try:
        got_book = load_workbook(io.BytesIO(output), data_only=True)
        formula_book = load_workbook(io.BytesIO(output), data_only=False)
    except Exception as exc:  # a corrupt output is the item's failure, not the harness's
        outcome.fail_reason = f"error: output unreadable: {type(exc).__name__}: {str(exc)[:200]}"
        return outcome
    for sheet, cell_range in ranges:
        name = sheet or gold_book.sheetnames[0]
        if name not in gold_book.sheetnames:
            outcome.fail_reason = (
                outcome.fail_reason or f"error: answer sheet {name!r} not in the golden workbook"
            )
            continue
        if name not in got_book.sheetnames:
            outcome.fail_reason = outcome.fail_reason or f"wrong: sheet {name!r} missing from the output"
            continue
        min_col, min_row, max_col, max_row = range_boundaries(cell_range)
        for row in range(min_row or 1, (max_row or min_row or 1) + 1):
            for col in range(min_col or 1, (max_col or min_col or 1) + 1):
                ref = f"{get_column_letter(col)}{row}"
                got = got_book[name][ref].value
                expected = gold_book[name][ref].value
                raw = formula_book[name][ref].value
                formula = raw if isinstance(raw, str) and raw.startswith("=") and got is None else ""
                check = CellCheck(f"{name}!{ref}", got, expected, cells_equal(got, expected), formula)
                outcome.cells.append(check)
                if not check.ok and not outcome.fail_reason:
                    outcome.fail_reason = f"wrong: value@{check.where} gt={_show(expected)} pred={_show(got)}"
    return outcome


def sheet_preview(path: Path) -> str:
    """Per sheet: name, dimensions, max row/col, the first 5 rows × 20 columns as ``A1=value``
    (values cut to 40 chars), then ``... (N more rows)``."""
    from openpyxl import load_workbook
    from openpyxl.utils import get_column_letter

    book = load_workbook(path, data_only=False)
    blocks = []
    for sheet in book.worksheets:
        lines = [f"## Sheet: {sheet.title}",
                 f"Dimensions: {sheet.dimensions} (max_row={sheet.max_row}, max_column={sheet.max_column})"]
        last_row = min(sheet.max_row, PREVIEW_ROWS)
        for row in range(1, last_row + 1):
            cells = []
            for col in range(1, min(sheet.max_column, PREVIEW_COLS) + 1):
                value = sheet.cell(row=row, column=col).value
                if value is not None:
                    cells.append(f"{get_column_letter(col)}{row}={str(value)[:PREVIEW_VALUE_CHARS]}")
            lines.append(" | ".join(cells) if cells else f"(row {row} empty)")
        if sheet.max_row > last_row:
            lines.append(f"... ({sheet.max_row - last_row} more rows)")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def verification_table(outcomes: Sequence[CaseOutcome]) -> str:
    """The analyst-only per-cell table: got/expected with ✓/✗ and a warning for formula cells."""
    lines = ["[VERIFICATION]"]
    for outcome in outcomes:
        verdict = "passed" if outcome.passed else f"failed ({outcome.fail_reason})"
        lines.append(f"Case {outcome.number}: {verdict}")
        for check in outcome.cells[:60]:
            mark = "✓" if check.ok else "✗"
            line = f"  {mark} {check.where}: got={_show(check.got)} expected={_show(check.expected)}"
            if check.formula:
                line += (
                    f"  ⚠ formula {check.formula[:60]} has no cached value (openpyxl never computes formulas)"
                )
            lines.append(line)
        if len(outcome.cells) > 60:
            lines.append(f"  ... ({len(outcome.cells) - 60} more cells)")
    return "\n".join(lines)


def _show(value: Any) -> str:
    return repr(value)[:60]
