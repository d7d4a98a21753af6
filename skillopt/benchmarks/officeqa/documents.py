"""The OfficeQA document corpus: roots, candidate files and oracle pages.

- :func:`docs_roots` lists the existing corpus folders (``docs_dirs``, the ``--data`` folder and
  ``$OFFICEQA_DOCS_DIR``; a root's ``transformed/`` subfolder replaces it when present);
- :class:`Corpus` indexes the ``.txt`` documents under those roots by basename, so an item's
  ``source_files`` become absolute candidate paths;
- :func:`oracle_pages` renders the pages named by an item's ``source_docs`` URLs from
  ``jsons/<stem>.json``, with HTML tables as markdown pipe tables.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

DOCS_ENV_VAR = "OFFICEQA_DOCS_DIR"
TRANSFORMED = "transformed"
JSONS = "jsons"
DOCUMENT_SUFFIX = ".txt"
MAX_CANDIDATES_SHOWN = 20
PAGE_CHARS = 24_000
TOTAL_ORACLE_CHARS = 80_000
TRUNCATED = "\n...[truncated]"
_PAGE_KEYS = ("page", "pagenum", "page_id")
# Folders of a split_dir layout: they hold gold and are never part of the corpus.
_SPLIT_FOLDERS = frozenset({"train", "val", "test", "raw"})


def docs_roots(docs_dirs: Sequence[str] | None, data_root: str | None, env: Mapping[str, str]) -> list[Path]:
    """The existing corpus roots, resolved and de-duplicated, in order.

    Candidates are each ``docs_dirs`` entry (a relative entry is looked up under ``data_root``
    first, then as given), ``data_root`` itself (the ``--data`` folder, §1.3) and
    ``$OFFICEQA_DOCS_DIR``. A root holding ``transformed/`` is replaced by that subfolder.
    Folders that do not exist are skipped; ``preflight`` reports when none is left.
    """
    candidates: list[Path] = []
    for entry in docs_dirs or ():
        path = Path(entry).expanduser()
        if not path.is_absolute() and data_root and (Path(data_root) / path).is_dir():
            path = Path(data_root) / path
        candidates.append(path)
    if data_root:
        candidates.append(Path(data_root))
    if env.get(DOCS_ENV_VAR):
        candidates.append(Path(env[DOCS_ENV_VAR]).expanduser())
    roots: list[Path] = []
    for path in candidates:
        if not path.is_dir():
            continue
        if (path / TRANSFORMED).is_dir():
            path = path / TRANSFORMED
        resolved = path.resolve()
        if resolved not in roots:
            roots.append(resolved)
    return roots


def inside(path: Path, roots: Sequence[Path]) -> bool:
    """``path`` (already resolved) lies within one of the resolved ``roots``."""
    return any(path == root or path.is_relative_to(root) for root in roots)


@dataclass
class Corpus:
    """The ``.txt`` documents under the roots, by basename (split folders and ``jsons/`` excluded).

    A document whose real path (symlinks followed) leaves every root is not part of the corpus.
    """

    roots: list[Path]
    by_name: dict[str, list[Path]] = field(default_factory=dict)

    @classmethod
    def index(cls, roots: Sequence[Path]) -> Corpus:
        corpus = cls(list(roots))
        for root in corpus.roots:
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(
                    d
                    for d in dirnames
                    if not d.startswith(".")
                    and d != JSONS
                    and not (Path(dirpath) == root and d in _SPLIT_FOLDERS)
                )
                for name in sorted(filenames):
                    path = Path(dirpath) / name
                    if name.endswith(DOCUMENT_SUFFIX) and inside(path.resolve(), corpus.roots):
                        corpus.by_name.setdefault(name, []).append(path)
        return corpus

    def candidates(self, source_files: Sequence[str]) -> list[Path]:
        """The absolute paths of the named documents (every document when none is named)."""
        if not source_files:
            return [path for name in sorted(self.by_name) for path in self.by_name[name]]
        return [path for name in source_files for path in self.by_name.get(Path(name).name, [])]

    def missing(self, source_files: Sequence[str]) -> list[str]:
        """The named documents found under no root."""
        return [name for name in source_files if Path(name).name not in self.by_name]

    def page_json(self, source_file: str) -> Path | None:
        """``jsons/<stem>.json`` for a source file under the first root that has it."""
        stem = Path(source_file).stem
        for root in self.roots:
            path = root / JSONS / f"{stem}.json"
            if path.is_file() and inside(path.resolve(), self.roots):
                return path
        return None


# ------------------------------------------------------------------------------------ oracle pages


def page_number(url: str) -> int | None:
    """The page named by a source URL's ``page=``, ``pagenum=`` or ``page_id=`` parameter."""
    query = parse_qs(urlsplit(url).query)
    for key in _PAGE_KEYS:
        for value in query.get(key, []):
            if value.strip().isdigit():
                return int(value.strip())
    return None


def page_pairs(source_files: Sequence[str], source_docs: Sequence[str]) -> list[tuple[str, int]]:
    """(source file, page) pairs: docs pair with files by position; a single file takes every doc.

    URLs without a page parameter, and docs beyond the files, are skipped.
    """
    if not source_files:
        return []
    files = list(source_files) * len(source_docs) if len(source_files) == 1 else list(source_files)
    pairs = []
    for name, url in zip(files, source_docs, strict=False):
        page = page_number(url)
        if page is not None and (name, page) not in pairs:
            pairs.append((name, page))
    return pairs


class _TableToMarkdown(HTMLParser):
    """HTML to text: tables become markdown pipe tables, other tags are dropped."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.rows: list[list[str]] | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.rows = []
        elif tag == "tr" and self.rows is not None:
            self.rows.append([])
        elif tag in ("td", "th") and self.rows is not None:
            self.cell = []
        elif tag == "br":
            self._text(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.rows is not None and self.cell is not None:
            if not self.rows:
                self.rows.append([])
            self.rows[-1].append(" ".join("".join(self.cell).split()).replace("|", "\\|"))
            self.cell = None
        elif tag == "table" and self.rows is not None:
            self.parts.append("\n" + _pipe_table([row for row in self.rows if row]) + "\n")
            self.rows, self.cell = None, None

    def handle_data(self, data: str) -> None:
        self._text(data)

    def _text(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)
        elif self.rows is None:
            self.parts.append(data)


def _pipe_table(rows: list[list[str]]) -> str:
    if not rows:
        return ""
    width = max(len(row) for row in rows)
    padded = [row + [""] * (width - len(row)) for row in rows]
    lines = ["| " + " | ".join(padded[0]) + " |", "| " + " | ".join(["---"] * width) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in padded[1:]]
    return "\n".join(lines)


def html_to_markdown(content: str) -> str:
    """An element's content as text: HTML tables as pipe tables, other markup stripped."""
    if "<" not in content:
        return content.strip()
    parser = _TableToMarkdown()
    parser.feed(content)
    parser.close()
    return re.sub(r"\n{3,}", "\n\n", "".join(parser.parts)).strip()


def _element_pages(element: Mapping[str, object]) -> set[int]:
    boxes = element.get("bbox")
    if isinstance(boxes, Mapping):
        boxes = [boxes]
    if not isinstance(boxes, list):
        return set()
    return {
        box["page_id"] for box in boxes if isinstance(box, Mapping) and isinstance(box.get("page_id"), int)
    }


def render_page(doc_json: Path, page: int) -> str:
    """The elements of ``page`` in ``doc_json``, in order; "" when the file is unreadable or the page
    empty."""
    try:
        data = json.loads(doc_json.read_text(encoding="utf-8"))
        elements = data["document"]["elements"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    if not isinstance(elements, list):
        return ""
    texts = [
        html_to_markdown(str(element.get("content") or ""))
        for element in elements
        if isinstance(element, Mapping) and page in _element_pages(element)
    ]
    return "\n\n".join(text for text in texts if text)


def oracle_pages(corpus: Corpus, source_files: Sequence[str], source_docs: Sequence[str]) -> tuple[str, int]:
    """The rendered oracle pages (each ≤ 24,000 chars, all ≤ 80,000) and how many were included."""
    blocks: list[str] = []
    total = 0
    for name, page in page_pairs(source_files, source_docs):
        doc_json = corpus.page_json(name)
        text = render_page(doc_json, page) if doc_json is not None else ""
        if not text:
            continue
        if len(text) > PAGE_CHARS:
            text = text[: PAGE_CHARS - len(TRUNCATED)] + TRUNCATED
        block = f"### {Path(name).name}, page {page}\n{text}"
        if total + len(block) > TOTAL_ORACLE_CHARS:
            room = TOTAL_ORACLE_CHARS - total
            if room <= len(TRUNCATED) + 100:
                break
            block = block[: room - len(TRUNCATED)] + TRUNCATED
        blocks.append(block)
        total += len(block) + 2  # the blank line that joins blocks
    return "\n\n".join(blocks), len(blocks)
