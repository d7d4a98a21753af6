"""Download BabyVision into the folder the ``babyvision`` plug-in reads in ratio mode.

Loads HF ``UnipatAI/BabyVision`` split ``train`` and writes::

    <out_dir>/images/<taskId>.png   one PNG per task
    <out_dir>/meta_data.jsonl       one line per task: every HF field, with ``image`` = the PNG's file name

Rows without an image are skipped and counted. Usage (needs the network and
``pip install datasets pillow``)::

    python scripts/download_babyvision.py --out_dir data/babyvision
    skillopt train babyvision --data data/babyvision

The conversion (:func:`write_babyvision`) is pure and takes any iterable of row dicts whose ``image``
is what ``datasets`` gives for an Image feature (an object with ``save(fp, format)``, such as a PIL
image), encoded bytes, or ``{"bytes": ...}``; only :func:`download_rows` touches the network.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skillopt.core.atomic import atomic_write_bytes
from skillopt.core.data import safe_id

HF_DATASET = "UnipatAI/BabyVision"
HF_SPLIT = "train"
META_FILE = "meta_data.jsonl"
IMAGES_DIR = "images"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: A progress line every this many rows.
PROGRESS_EVERY = 50

Progress = Callable[[str], None]


class DownloadError(ValueError):
    """A row cannot become a task with an image, or a package the download needs is missing."""


@dataclass(frozen=True)
class DownloadSummary:
    out_dir: Path
    written: int
    skipped_without_image: int


def png_bytes(image: Any, *, where: str) -> bytes | None:
    """The PNG encoding of a row's ``image`` value, or None when the row has no image.

    Accepts an object with ``save(fp, format)`` (a PIL image), PNG bytes, other encoded image bytes
    (converted with Pillow) or ``{"bytes": ...}`` (an undecoded ``datasets`` Image).
    """
    if isinstance(image, Mapping):
        image = image.get("bytes")
    if image is None or image == b"":
        return None
    if hasattr(image, "save"):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()
    if isinstance(image, bytes | bytearray):
        data = bytes(image)
        if data.startswith(PNG_SIGNATURE):
            return data
        return _convert_to_png(data, where=where)
    raise DownloadError(f"{where}: field 'image' is a {type(image).__name__}; expected an image "
                        "with save(), encoded image bytes or {'bytes': ...}")


def _convert_to_png(data: bytes, *, where: str) -> bytes:
    try:
        from PIL import Image
    except ImportError as exc:
        raise DownloadError(
            f"{where}: the image is not a PNG; converting it needs Pillow: pip install pillow"
        ) from exc
    try:
        with Image.open(io.BytesIO(data)) as opened:
            buffer = io.BytesIO()
            opened.save(buffer, format="PNG")
    except OSError as exc:
        raise DownloadError(f"{where}: field 'image' holds bytes Pillow cannot read: {exc}") from exc
    return buffer.getvalue()


def write_babyvision(rows: Iterable[Mapping[str, Any]], out_dir: Path,
                     *, progress: Progress | None = None) -> DownloadSummary:
    """Write ``<out_dir>/images/<taskId>.png`` and ``<out_dir>/meta_data.jsonl`` from ``rows``.

    Every file is written atomically, and ``meta_data.jsonl`` last, so its presence means the folder is
    complete. Rows without an image are skipped (counted); a row without ``taskId``, two rows with the
    same ``taskId``, or no row with an image raises :class:`DownloadError`.
    """
    out_dir = Path(out_dir)
    lines: list[str] = []
    owner: dict[str, Any] = {}
    skipped = 0
    for index, row in enumerate(rows, 1):
        task_id = row.get("taskId")
        where = f"row {index} (taskId {task_id})"
        if task_id in (None, ""):
            raise DownloadError(f"row {index}: no taskId; the images are named after it")
        file_name = f"{safe_id(task_id)}.png"
        if file_name in owner:
            raise DownloadError(f"{where}: taskId {task_id!r} is also row {owner[file_name]}'s; "
                                f"both would be {IMAGES_DIR}/{file_name}")
        owner[file_name] = index
        data = png_bytes(row.get("image"), where=where)
        if data is None:
            skipped += 1
            continue
        try:
            line = json.dumps({**row, "image": file_name}, ensure_ascii=False)
        except TypeError as exc:
            raise DownloadError(f"{where}: a field is not JSON-serialisable: {exc}") from exc
        atomic_write_bytes(out_dir / IMAGES_DIR / file_name, data)
        lines.append(line)
        if progress and index % PROGRESS_EVERY == 0:
            progress(f"{index} rows: {len(lines)} images saved, {skipped} without an image")
    if not lines:
        raise DownloadError(f"none of the {skipped} rows has an image; nothing to write")
    atomic_write_bytes(out_dir / META_FILE, ("\n".join(lines) + "\n").encode("utf-8"))
    if progress:
        progress(f"wrote {len(lines)} tasks to {out_dir / META_FILE} and {out_dir / IMAGES_DIR}/; "
                 f"skipped {skipped} row(s) without an image")
    return DownloadSummary(out_dir=out_dir, written=len(lines), skipped_without_image=skipped)


def download_rows(dataset: str = HF_DATASET, split: str = HF_SPLIT) -> Iterable[Mapping[str, Any]]:
    """The rows of ``dataset``'s ``split`` from the Hugging Face hub (network; needs datasets and Pillow)."""
    missing = []
    try:
        import datasets
    except ImportError:
        missing.append("datasets")
    try:
        import PIL  # noqa: F401  (datasets decodes Image features with it)
    except ImportError:
        missing.append("pillow")
    if missing:
        raise DownloadError(f"download_babyvision needs {' and '.join(missing)}: pip install datasets pillow")
    return datasets.load_dataset(dataset, split=split)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Download HF UnipatAI/BabyVision (split train) into <out_dir>/images/<taskId>.png and "
                    "<out_dir>/meta_data.jsonl for `skillopt train babyvision --data <out_dir>`.")
    parser.add_argument(
        "--out_dir", required=True, type=Path, help="the folder to write (e.g. data/babyvision)"
    )
    parser.add_argument("--dataset", default=HF_DATASET, help=f"the HF dataset (default: {HF_DATASET})")
    parser.add_argument("--split", default=HF_SPLIT, help=f"the HF split (default: {HF_SPLIT})")
    args = parser.parse_args(argv)
    try:
        print(f"loading {args.dataset} split {args.split}")
        summary = write_babyvision(download_rows(args.dataset, args.split), args.out_dir, progress=print)
    except DownloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done: skillopt train babyvision --data {summary.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
