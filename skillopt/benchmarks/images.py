"""Images of benchmark items: finding the files, sending them, hashing them (BENCHMARKS.md §1.7).

- :func:`resolve_image` finds a row's image: an absolute path as is, a relative one under each root
  in turn (the ``--data`` folder or ``data_root`` first, then the benchmark's fallbacks);
- :func:`image_part` is one image as the target receives it: an ``ImagePart`` whose ``detail`` is
  ``low``/``high`` when ``benchmark.image_detail`` says so and None for ``auto``; backends send it as
  a ``data:`` URI (OpenAI, Azure, OpenAI-compatible), a base64 image block (Anthropic) or an
  attachment file (exec targets);
- :func:`image_digests` hashes image *content*, so every cache key that covers an item covers its
  pixels, not only its path;
- :func:`item_image_paths` lists the image files an item names (``image_path`` / ``image_paths``).

Trajectories and the optimizer see an image only as ``[image] <basename>`` (``Message.text``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from skillopt.llm.chat import ImagePart

__all__ = [
    "IMAGE_FIELDS",
    "ROW_DIR",
    "rows_from",
    "image_digests",
    "image_part",
    "item_image_paths",
    "resolve_image",
    "roots_of",
]

#: The item keys that hold image paths: one path, or a list of paths.
IMAGE_FIELDS = ("image_path", "image_paths")
#: The key a raw reader adds to each row: the folder of the file it came from, where relative image
#: paths may resolve. Normalisers read it and never copy it into the item.
ROW_DIR = "_row_dir"


def rows_from(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` read from ``path`` (a file, or a folder), each marked with that folder under ``ROW_DIR``."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    return [{**row, ROW_DIR: str(folder)} for row in rows]


def roots_of(*candidates: str | Path | None) -> list[Path]:
    """The distinct, non-empty folders among ``candidates``, in order (relative ones stay relative to the cwd)."""
    roots: list[Path] = []
    for candidate in candidates:
        if candidate in (None, ""):
            continue
        path = Path(candidate)
        if path not in roots:
            roots.append(path)
    return roots


def resolve_image(value: Any, roots: Sequence[Path]) -> Path | None:
    """The absolute path of the image ``value`` names, or None when no such file exists.

    An absolute path is used as is; a relative one is tried under each root in ``roots`` in order.
    """
    if value is None or not str(value).strip():
        return None
    path = Path(str(value).strip())
    if path.is_absolute():
        return path if path.is_file() else None
    for root in roots:
        candidate = root / path
        if candidate.is_file():
            return candidate.resolve()
    return None


def image_part(path: str | Path, detail: str | None) -> ImagePart:
    """One image for the target: ``detail`` ``low``/``high`` is kept, ``auto`` (or None) sends none."""
    return ImagePart(source=str(path), detail=detail if detail in ("low", "high") else None,
                     name=Path(path).name)


def item_image_paths(item: Mapping[str, Any]) -> list[Path]:
    """The image files an item names under ``image_path`` or ``image_paths``, in order."""
    paths: list[Path] = []
    for key in IMAGE_FIELDS:
        value = item.get(key)
        values = value if isinstance(value, list | tuple) else [value]
        paths += [Path(str(v)) for v in values if v not in (None, "")]
    return paths


def image_digests(paths: Iterable[str | Path]) -> list[str]:
    """``sha256`` of each file's bytes (``missing:<name>`` for a file that is not there)."""
    digests = []
    for path in paths:
        try:
            digests.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
        except OSError:
            digests.append(f"missing:{Path(path).name}")
    return digests
