"""Materialize the released SearchQA split from Hugging Face rows.

The id manifest names the items of each split by their HF ``key`` (32 hex characters)::

    {"train": ["<key>", ...], "val": [...], "test": [...]}

A ``split_manifest.json`` written by a ratio run (the same lists under ``"ids"``) is accepted too.
The script joins those ids to the rows of ``lucadiliello/searchqa`` and writes
``<out_dir>/{train,val,test}/items.json`` in the ``searchqa`` item schema
``{id, question, context, answers}``, items in manifest order. An id listed twice, an id no HF row
has, or an id two HF rows share is an error naming the ids; nothing is written then.

Usage (needs the network and ``pip install datasets``)::

    python scripts/materialize_searchqa.py --manifest searchqa_ids.json --out_dir data/searchqa_split
    skillopt train searchqa --data data/searchqa_split

The conversion (:func:`read_manifest`, :func:`materialize`, :func:`write_splits`) is pure and takes
any iterable of row dicts, so it is tested offline; only :func:`download_rows` touches the network.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from skillopt.benchmarks.searchqa import normalise_row
from skillopt.core.atomic import atomic_write_bytes
from skillopt.core.data import SPLIT_NAMES

HF_DATASET = "lucadiliello/searchqa"
#: The HF splits searched for the manifest's keys (the released items come from both).
HF_SPLITS = ("train", "validation")
#: How many ids an error message lists before it says "and N more".
SHOWN_IDS = 20
#: A progress line every this many HF rows.
PROGRESS_EVERY = 10_000

Progress = Callable[[str], None]


class MaterializeError(ValueError):
    """The manifest or the HF rows do not give one item per manifest id."""


def _some(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:SHOWN_IDS])
    return shown + (f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else "")


def parse_manifest(data: Any, *, where: str = "manifest") -> dict[str, list[str]]:
    """The ids of each split from a manifest object; an id listed twice (in one split or two) raises.

    ``data`` is ``{"train": [...], "val": [...], "test": [...]}`` or that mapping under ``"ids"``.
    """
    if isinstance(data, Mapping) and isinstance(data.get("ids"), Mapping):
        data = data["ids"]
    if not isinstance(data, Mapping):
        raise MaterializeError(f"{where}: expected an object with train, val and test id lists")
    missing = [name for name in SPLIT_NAMES if name not in data]
    if missing:
        raise MaterializeError(f"{where}: no id list for split(s) {', '.join(missing)}; "
                               "expected keys train, val and test")
    manifest: dict[str, list[str]] = {}
    first_split: dict[str, str] = {}
    duplicates: list[str] = []
    for name in SPLIT_NAMES:
        ids = data[name]
        if not isinstance(ids, list) or not all(isinstance(i, str) and i.strip() for i in ids):
            raise MaterializeError(f"{where}: split {name!r} must be a list of non-empty id strings")
        manifest[name] = [i.strip() for i in ids]
        for item_id in manifest[name]:
            if item_id in first_split:
                duplicates.append(f"{item_id} ({first_split[item_id]} and {name})")
            else:
                first_split[item_id] = name
    if duplicates:
        raise MaterializeError(f"{where}: {len(duplicates)} id(s) listed more than once: {_some(duplicates)}")
    return manifest


def read_manifest(path: Path) -> dict[str, list[str]]:
    """:func:`parse_manifest` of the JSON file at ``path``; an unreadable file names the path."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise MaterializeError(f"{path}: cannot read the id manifest: {exc}") from exc
    return parse_manifest(data, where=str(path))


def item_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The ``searchqa`` item of one HF row (its ``key`` becomes the id); a bad row names its key."""
    key = row.get("key")
    try:
        item = normalise_row({"id": key, "question": row.get("question"), "context": row.get("context"),
                              "answers": row.get("answers")})
    except KeyError as exc:
        raise MaterializeError(f"HF row {key}: missing field {exc.args[0]!r}") from exc
    except ValueError as exc:
        raise MaterializeError(f"HF row {key}: {exc}") from exc
    return {field: item[field] for field in ("id", "question", "context", "answers")}


def materialize(manifest: Mapping[str, Sequence[str]], rows: Iterable[Mapping[str, Any]],
                *, progress: Progress | None = None) -> dict[str, list[dict[str, Any]]]:
    """The items of each split, in manifest order, joined from ``rows`` on their ``key``.

    Raises :class:`MaterializeError` naming the ids that no row has or that two rows share.
    """
    wanted = {item_id for ids in manifest.values() for item_id in ids}
    found: dict[str, dict[str, Any]] = {}
    shared: list[str] = []
    seen = 0
    for seen, row in enumerate(rows, 1):
        key = row.get("key")
        if key in wanted:
            if key in found:
                shared.append(str(key))
            else:
                found[str(key)] = item_of(row)
        if progress and seen % PROGRESS_EVERY == 0:
            progress(f"read {seen} HF rows, matched {len(found)}/{len(wanted)} ids")
    if progress:
        progress(f"read {seen} HF rows, matched {len(found)}/{len(wanted)} ids")
    if shared:
        shared = sorted(set(shared))
        raise MaterializeError(f"{len(shared)} manifest id(s) match more than one HF row: {_some(shared)}")
    missing = [item_id for name in SPLIT_NAMES for item_id in manifest[name] if item_id not in found]
    if missing:
        raise MaterializeError(f"{len(missing)} manifest id(s) are in no HF row: {_some(missing)}")
    return {name: [found[item_id] for item_id in manifest[name]] for name in SPLIT_NAMES}


def write_splits(splits: Mapping[str, Sequence[Mapping[str, Any]]], out_dir: Path,
                 *, progress: Progress | None = None) -> dict[str, Path]:
    """Write ``<out_dir>/<split>/items.json`` (UTF-8, indent 2) atomically; returns the files by split."""
    written: dict[str, Path] = {}
    for name in SPLIT_NAMES:
        path = Path(out_dir) / name / "items.json"
        text = json.dumps(list(splits[name]), indent=2, ensure_ascii=False) + "\n"
        atomic_write_bytes(path, text.encode("utf-8"))
        written[name] = path
        if progress:
            progress(f"wrote {len(splits[name])} items to {path}")
    return written


def download_rows(dataset: str = HF_DATASET, hf_splits: Sequence[str] = HF_SPLITS,
                  *, progress: Progress | None = None) -> Iterator[Mapping[str, Any]]:
    """The rows of ``dataset``'s ``hf_splits`` from the Hugging Face hub (network; needs ``datasets``)."""
    try:
        import datasets
    except ImportError as exc:
        raise MaterializeError(
            "materialize_searchqa needs the Hugging Face 'datasets' package: pip install datasets"
        ) from exc
    for split in hf_splits:
        if progress:
            progress(f"loading {dataset} split {split}")
        yield from datasets.load_dataset(dataset, split=split)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Join the SearchQA id manifest to the HF lucadiliello/searchqa rows and write "
                    "<out_dir>/{train,val,test}/items.json for `skillopt train searchqa --data <out_dir>`.")
    parser.add_argument("--manifest", required=True, type=Path,
                        help='JSON id manifest: {"train": [key, ...], "val": [...], "test": [...]} '
                             "or a split_manifest.json (its \"ids\")")
    parser.add_argument("--out_dir", type=Path, default=Path("data/searchqa_split"),
                        help="the split folder to write (default: data/searchqa_split)")
    parser.add_argument("--dataset", default=HF_DATASET, help=f"the HF dataset (default: {HF_DATASET})")
    parser.add_argument("--hf_splits", nargs="+", default=list(HF_SPLITS),
                        help="the HF splits searched for the ids (default: train validation)")
    args = parser.parse_args(argv)
    try:
        manifest = read_manifest(args.manifest)
        print(f"manifest {args.manifest}: " + ", ".join(f"{n} {len(manifest[n])}" for n in SPLIT_NAMES))
        splits = materialize(
            manifest, download_rows(args.dataset, args.hf_splits, progress=print), progress=print
        )
        write_splits(splits, args.out_dir, progress=print)
    except MaterializeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"done: skillopt train searchqa --data {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
