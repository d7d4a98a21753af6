"""Reading benchmark rows: CSV tables, list cells, text fields, and paths confined to the data root.

Every plug-in reads its raw rows through these helpers, so each gets the same checks:

- :func:`read_table` reads a CSV file (or the one CSV in a folder) or any shape
  :func:`skillopt.core.data.read_records` accepts; :func:`rows_from` marks each row with its file's
  folder (``ROW_DIR``), where relative paths in the row may also resolve;
- :func:`parse_list` reads a list cell (a list, a JSON or Python-literal list, or one value);
  :func:`text_field`, :func:`first_text` and :func:`required_text` read text fields, and
  :func:`hashed_id` names a row that has no id;
- :func:`confined_path` resolves a path a row names (an image, a document, a workbook, a
  repository, a game file) and rejects, before any byte of the file is read, one that resolves —
  symlinks included — outside the benchmark's data roots: a row may name only its own data;
- :func:`check_item_size` rejects an item larger than ``benchmark.max_item_chars``.

A bad row raises ``ValueError`` (or ``KeyError(field)``): the split loader turns it into a
``DataError`` that names the file and the row, and the message here names the field.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from skillopt.core.data import at_line, read_records
from skillopt.core.errors import DataError

__all__ = [
    "ROW_DIR",
    "check_item_size",
    "confined_path",
    "first_text",
    "hashed_id",
    "parse_list",
    "read_table",
    "required_text",
    "roots_of",
    "rows_from",
    "text_field",
]

#: The key a raw reader adds to each row: the folder of the file it came from, where relative
#: paths may resolve. Normalisers read it and never copy it into the item.
ROW_DIR = "_row_dir"
_SPLIT_NAMES = ("train", "val", "test")


def read_table(path: str | Path, *, list_columns: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows of a CSV file (by extension), of a folder holding exactly one CSV, or of any shape
    :func:`read_records` accepts. In a CSV, empty cells count as absent and a ``list_columns`` cell
    that holds a JSON list is that list."""
    path = Path(path)
    if path.is_dir() and not any((path / split).is_dir() for split in _SPLIT_NAMES):
        found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == ".csv")
        if len(found) == 1:
            path = found[0]
    if path.suffix.lower() != ".csv":
        return read_records(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid UTF-8 at byte offset {exc.start}; data files must be UTF-8"
                        ) from None
    rows: list[dict[str, Any]] = []
    reader = csv.DictReader(io.StringIO(text, newline=""))
    for raw in reader:
        # The reader has just read the row's last line; a row whose cells hold line breaks started earlier.
        line = reader.line_num - sum(cell.count("\n") for cell in raw.values() if isinstance(cell, str))
        if None in raw:
            raise DataError(f"{path}: line {line}: more cells than the header has columns")
        rows.append(at_line({key: _json_list(cell) if key in list_columns else cell
                             for key, cell in raw.items() if cell not in (None, "")}, line))
    return rows


def _json_list(cell: str) -> Any:
    """A cell holding a JSON list becomes that list; any other text stays text."""
    if not cell.lstrip().startswith("["):
        return cell
    try:
        value = json.loads(cell)
    except json.JSONDecodeError:
        return cell
    return value if isinstance(value, list) else cell


def rows_from(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` read from ``path`` (a file, or a folder), each marked with that folder under ``ROW_DIR``."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    return [{**row, ROW_DIR: str(folder)} for row in rows]


def roots_of(*candidates: str | Path | None) -> list[Path]:
    """The distinct, non-empty folders among ``candidates``, in order (relative ones stay relative to
    the working directory)."""
    roots: list[Path] = []
    for candidate in candidates:
        if candidate in (None, ""):
            continue
        path = Path(candidate)
        if path not in roots:
            roots.append(path)
    return roots


def parse_list(value: Any, field_name: str) -> list[str]:
    """A list cell as a list of non-empty strings.

    Accepts a list, a JSON list (``["a", "b"]``), a Python-literal list (``['a', 'b']``), a single
    plain value (a one-element list) or nothing (``[]``). A bracketed cell that parses as neither
    literal raises ``ValueError`` naming the field.
    """
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if not text.startswith("["):
            return [text]
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                shown = text if len(text) <= 80 else text[:77] + "..."
                raise ValueError(f"field {field_name!r} is not a JSON or Python list: {shown}") from None
    if not isinstance(value, list | tuple):
        raise ValueError(f"field {field_name!r} must be a list, got {type(value).__name__}")
    return [str(entry).strip() for entry in value if entry is not None and str(entry).strip()]


def text_field(row: Mapping[str, Any], name: str) -> str:
    """The stripped text of ``row[name]`` ("" when absent); a number is read as text (``3.0`` as
    ``3``), anything else raises ``ValueError`` naming the field."""
    value = row.get(name)
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"field {name!r} must be a string, got {type(value).__name__}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def first_text(row: Mapping[str, Any], *names: str) -> str:
    """The text of the first of ``names`` that the row holds non-empty ("" when none does)."""
    for name in names:
        if text := text_field(row, name):
            return text
    return ""


def required_text(row: Mapping[str, Any], *names: str) -> str:
    """:func:`first_text` of ``names``; ``KeyError(name)`` when none holds text.

    ``name`` is the first of ``names`` the row has at all (null or empty), else ``names[0]``, so the
    split loader can say whether the field is null, empty or missing.
    """
    text = first_text(row, *names)
    if not text:
        raise KeyError(next((name for name in names if name in row), names[0]))
    return text


def hashed_id(prefix: str, text: str) -> str:
    """The id of a row that has none: ``prefix`` plus the first 12 hex characters of ``sha1(text)``."""
    return prefix + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def confined_path(value: Any, roots: Sequence[str | Path], *, field: str) -> Path | None:
    """The real path of the file ``value`` names, kept inside ``roots``; None when it names nothing
    that exists.

    A relative path is tried under each root in turn; an absolute one is taken as it is. Either
    way the path is resolved (``..`` and symlinks followed) and only a result inside one of the
    roots (themselves resolved) counts; a path that resolves only outside them raises
    ``ValueError`` naming the field and the path. Only the file
    system's metadata is consulted: no byte of the file is read.
    """
    if value is None or not str(value).strip():
        return None
    path = Path(str(value).strip()).expanduser()
    real_roots = [Path(root).resolve() for root in roots]
    candidates = [path] if path.is_absolute() else [Path(root) / path for root in roots]
    outside: Path | None = None
    for candidate in candidates:
        real = candidate.resolve()
        if not any(real == root or real.is_relative_to(root) for root in real_roots):
            outside = outside or real
        elif real.exists():
            return real
    if outside is not None:
        where = ", ".join(str(root) for root in real_roots) or "none given"
        raise ValueError(f"field {field!r}: {str(value).strip()!r} resolves to {outside}, outside the "
                         f"benchmark's data root ({where}); a row may only name files under its data root")
    return None


def check_item_size(item: Mapping[str, Any], limit: int) -> None:
    """``ValueError`` when the item, as JSON, holds more than ``limit`` characters
    (``benchmark.max_item_chars``): one huge row would become a huge prompt on every rollout."""
    size = len(json.dumps(item, ensure_ascii=False, default=str))
    if size > limit:
        raise ValueError(f"the item holds {size} characters, more than benchmark.max_item_chars ({limit}); "
                         "shorten the row or raise the limit")
