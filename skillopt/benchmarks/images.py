"""Images of benchmark items: finding the files, sending them, hashing them.

- :func:`resolve_image` finds a row's image: an absolute path as is, a relative one under each root
  in turn (the ``--data`` folder or ``data_root`` first, then the benchmark's fallbacks), and
  rejects a path that resolves outside those roots;
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
from typing import Any, Literal

from skillopt.benchmarks.rows import confined_path
from skillopt.llm.chat import ImagePart, Message, TextPart, user

__all__ = [
    "IMAGE_FIELDS",
    "image_digests",
    "image_part",
    "item_image_paths",
    "resolve_image",
]

#: The item keys that hold image paths: one path, or a list of paths.
IMAGE_FIELDS = ("image_path", "image_paths")


def resolve_image(value: Any, roots: Sequence[Path], *, field: str = "image_path") -> Path | None:
    """The real path of the image ``value`` names, confined to ``roots`` (see
    :func:`skillopt.benchmarks.rows.confined_path`: a path resolving outside them raises
    ``ValueError`` naming ``field``), or None when no such file exists."""
    found = confined_path(value, roots, field=field)
    return found if found is not None and found.is_file() else None


def image_part(path: str | Path, detail: str | None) -> ImagePart:
    """One image for the target: ``detail`` ``low``/``high`` is kept, ``auto`` (or None) sends none."""
    sent: Literal["low", "high"] | None = "low" if detail == "low" else "high" if detail == "high" else None
    return ImagePart(source=str(path), detail=sent, name=Path(path).name)


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


def text_then_image(text: str, path: str | Path, detail: str | None) -> Message:
    """The user message of a one-image item: ``text``, then the image (``image_part``)."""
    return user([TextPart(text=text), image_part(path, detail)])
