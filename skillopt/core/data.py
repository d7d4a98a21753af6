"""Benchmark splits and seeded epoch planning.

This module owns everything between a benchmark's data files and the ordered batches a training
epoch walks:

* **Ids** — :func:`safe_id` turns a raw id into a filesystem-safe one; :class:`Item` is the
  dict-like record every benchmark hands around.
* **Reading** — :func:`read_records` is the default raw reader (JSON array, ``{"data": [...]}``,
  a dict of items, JSONL, or a directory holding exactly one such file).
* **Splits** — :func:`load_splits` builds the train/val/test splits in one of three modes:
  ``split_dir`` (a folder holding ``train/ val/ test/``), ``ratio`` (one source split by
  :func:`largest_remainder_counts` after a seeded shuffle, written to disk with a manifest and
  read back) or ``generated`` (a benchmark that builds its items from the seed).
  :func:`resolve_split` maps the accepted split names onto the three splits.
* **Epochs** — :func:`steps_per_epoch`, :func:`plan_epoch` and :func:`check_train_size`.

Everything here is pure apart from reading the data files and writing ratio-mode output; nothing is
cached between calls, so every load returns fresh objects.
"""

from __future__ import annotations

import codecs
import copy
import hashlib
import json
import logging
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, field_validator
from pydantic_core import core_schema

from skillopt.core.atomic import atomic_write_bytes
from skillopt.core.errors import ConfigError, DataError, SkillOptError

__all__ = [
    "DEFAULT_TASK_TYPE",
    "ITEMS_FILE",
    "MANIFEST_FILE",
    "SPLIT_MODES",
    "SPLIT_NAMES",
    "BatchPlan",
    "DropRow",
    "EpochPlan",
    "Item",
    "Splits",
    "SplitName",
    "SplitSpec",
    "StepPlan",
    "check_train_size",
    "small_split_warning",
    "data_overrides",
    "default_split_output_dir",
    "identity_normaliser",
    "largest_remainder_counts",
    "load_splits",
    "parse_split_ratio",
    "plan_epoch",
    "read_records",
    "resolve_split",
    "safe_id",
    "sha256_path",
    "split_output_dir",
    "steps_per_epoch",
]

log = logging.getLogger(__name__)

SplitName = Literal["train", "val", "test"]
SPLIT_NAMES: tuple[SplitName, SplitName, SplitName] = ("train", "val", "test")
SPLIT_MODES = ("split_dir", "ratio", "generated")
ITEMS_FILE = "items.json"
MANIFEST_FILE = "split_manifest.json"
DEFAULT_TASK_TYPE = "default"
MAX_ID_LENGTH = 128

Reader = Callable[[Path], list[dict[str, Any]]]
Normaliser = Callable[[dict[str, Any]], dict[str, Any]]
Generator = Callable[[int], Mapping[str, Sequence[dict[str, Any]]]]
Partitioner = Callable[[list["Item"], "SplitSpec"], Mapping[str, Sequence["Item"]]]


# --------------------------------------------------------------------------------------------- ids


_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def safe_id(raw: Any) -> str:
    """Return the filesystem-safe form of an item id.

    Every character outside ``[A-Za-z0-9._-]`` becomes ``-``; a string or integer is accepted
    (an integer is formatted with ``str``). The result is 1–128 characters long and does not
    start with ``.``, or :class:`DataError` names the raw id. Applying it twice changes nothing.
    """
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise DataError(f"item id {raw!r} must be a string or an integer, not {type(raw).__name__}")
    text = str(raw)
    cleaned = _UNSAFE_ID_CHARS.sub("-", text)
    if not cleaned:
        raise DataError(f"item id {text!r} is empty; ids must be 1-{MAX_ID_LENGTH} characters")
    if len(cleaned) > MAX_ID_LENGTH:
        raise DataError(
            f"item id {text!r} is {len(cleaned)} characters long; ids must be 1-{MAX_ID_LENGTH} characters"
        )
    if cleaned.startswith("."):
        raise DataError(f"item id {text!r} starts with '.'; ids are used as directory names")
    return cleaned


class Item(dict[str, Any]):
    """One benchmark example: a plain dict with at least ``id`` and ``task_type``.

    The remaining keys are the benchmark's payload (question, answers, paths, ...). ``source_id``
    is present only when :func:`safe_id` changed the raw id. Being a ``dict`` it serialises with
    ``json`` unchanged, pickles, and validates as a field of a pydantic model.
    """

    @property
    def id(self) -> str:
        """The filesystem-safe, split-unique id."""
        return str(self["id"])

    @property
    def task_type(self) -> str:
        """The item's task type (the benchmark's default when the data names none)."""
        return str(self["task_type"])

    @property
    def source_id(self) -> str:
        """The id as the data spelled it (equal to :attr:`id` when sanitising changed nothing)."""
        return str(self.get("source_id", self["id"]))

    def copy(self) -> Item:
        """A shallow copy that is still an :class:`Item`."""
        return Item(self)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.dict_schema(keys_schema=core_schema.str_schema()),
            serialization=core_schema.plain_serializer_function_ser_schema(dict),
        )


class DropRow(Exception):
    """Raised by a normaliser to drop a row under one of its benchmark's drop rules.

    ``reason`` is the short rule name counted in the manifest's ``dropped`` map.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def identity_normaliser(row: dict[str, Any]) -> dict[str, Any]:
    """The default normaliser: rows are already in normalized form."""
    return row


# ------------------------------------------------------------------------------------- split names


_SPLIT_ALIASES: dict[str, SplitName] = {
    "train": "train",
    "val": "val",
    "selection": "val",
    "valid_seen": "val",
    "test": "test",
    "valid_unseen": "test",
}


def resolve_split(name: str) -> SplitName:
    """Map a split name onto ``train``, ``val`` or ``test``.

    ``val`` = ``selection`` = ``valid_seen``; ``test`` = ``valid_unseen``. Any other name raises
    :class:`DataError` (a ``ValueError``) listing the accepted names; there is no fallback.
    """
    try:
        return _SPLIT_ALIASES[name]
    except (KeyError, TypeError):
        accepted = ", ".join(_SPLIT_ALIASES)
        raise DataError(f"unknown split name {name!r}; accepted names: {accepted}") from None


def data_overrides(data: str | Path | None) -> list[str]:
    """The ``benchmark.*`` overrides that ``--data PATH`` (or a deployment's ``data`` parameter) stands for.

    A folder holding ``train/``, ``val/`` and ``test/`` is ``split_dir`` input and also the root of every
    relative asset path (images, documents) the benchmark reads; any other file or folder is ``ratio``
    input (``data_path``). Nothing at ``data`` is a :class:`ConfigError`; ``None`` or "" gives no overrides.
    """
    if not data:
        return []
    path = Path(data)
    if not path.exists():
        raise ConfigError(f"--data: nothing at {data}")
    present = [split for split in SPLIT_NAMES if path.is_dir() and (path / split).is_dir()]
    if present and len(present) < len(SPLIT_NAMES):
        missing = ", ".join(f"{split}/" for split in SPLIT_NAMES if split not in present)
        raise ConfigError(f"--data {data}: a folder of split folders needs train/, val/ and test/; missing "
                          f"{missing}")
    if present:
        return [
            "benchmark.split_mode=split_dir",
            f"benchmark.split_dir={data}",
            f"benchmark.data_root={data}",
        ]
    return ["benchmark.split_mode=ratio", f"benchmark.data_path={data}"]


# ----------------------------------------------------------------------------------------- reading


_RECORD_EXTENSIONS = (".json", ".jsonl")
_JSONL_EXTENSIONS = (".jsonl", ".ndjson")


def _read_text(path: Path) -> str:
    """Read a file as UTF-8 (a leading BOM is ignored), or raise DataError with the byte offset."""
    data = path.read_bytes()
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = exc.start + bom  # an offset into the file, not into the decoded slice
        raise DataError(
            f"{path}: not valid UTF-8 at byte offset {offset} (byte 0x{data[offset]:02x}); "
            "data files must be UTF-8"
        ) from None


class SourceRow(dict[str, Any]):
    """A row as a reader found it, with the line of its file where it starts, so that an error about the row
    names the line an editor shows (a JSONL file with blank lines, a CSV file's header)."""

    line: int | None = None


def at_line(row: dict[str, Any], line: int) -> SourceRow:
    """``row`` as a :class:`SourceRow` that starts on ``line``."""
    located = SourceRow(row)
    located.line = line
    return located


def _parse_jsonl(path: Path, text: str) -> list[Any]:
    rows: list[Any] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {lineno}: malformed JSON ({_json_problem(exc)})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}: line {lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append(at_line(row, lineno))
    return rows


def _json_problem(exc: json.JSONDecodeError) -> str:
    """``Expecting value at column 1``; a message that ends in "at" already ("Unterminated string starting
    at") is not given a second one."""
    return f"{exc.msg} {'' if exc.msg.endswith(' at') else 'at '}column {exc.colno}"


def _rows_from_document(path: Path, doc: Any) -> list[Any]:
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        if isinstance(doc.get("data"), list):
            return list(doc["data"])
        if doc and all(isinstance(value, dict) for value in doc.values()):
            return list(doc.values())
    raise DataError(
        f'{path}: expected a JSON array, an object {{"data": [...]}}, or an object whose values are '
        f"items; got {type(doc).__name__}"
    )


def _read_record_file(path: Path) -> list[Any]:
    text = _read_text(path)
    if path.suffix.lower() in _JSONL_EXTENSIONS:
        return _parse_jsonl(path, text)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        # Several JSON values one after another is JSONL saved under another extension.
        if exc.msg == "Extra data":
            return _parse_jsonl(path, text)
        raise DataError(f"{path}: line {exc.lineno}: malformed JSON ({_json_problem(exc)})") from None
    return _rows_from_document(path, doc)


def _visible_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))


def read_records(path: Path | str) -> list[dict[str, Any]]:
    """The default raw reader: return the rows held at ``path`` as a list of dicts.

    Accepted shapes: a JSON array; ``{"data": [...]}``; an object whose values are items (the
    values are used, the keys ignored); JSONL (``.jsonl``/``.ndjson``, or any file holding several
    JSON values); a directory holding exactly one ``.json``/``.jsonl`` file. Raises
    :class:`DataError` for: a missing path; a directory holding ``train/``/``val/``/``test/``
    (that is split_dir input); a directory without exactly one data file; non-UTF-8 bytes (naming
    the byte offset); malformed JSON (naming the line); a row that is not an object (naming it).
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: data path does not exist")
    if path.is_dir():
        split_dirs = [name for name in SPLIT_NAMES if (path / name).is_dir()]
        if split_dirs:
            raise DataError(
                f"{path}: holds split folders ({', '.join(f'{name}/' for name in split_dirs)}); this is "
                f"split_dir input — use split_mode split_dir with split_dir {path}, not data_path"
            )
        candidates = [p for p in _visible_files(path) if p.suffix.lower() in _RECORD_EXTENSIONS]
        if len(candidates) != 1:
            found = ", ".join(p.name for p in candidates) or "none"
            raise DataError(f"{path}: expected exactly one .json or .jsonl file in the folder; found {found}")
        path = candidates[0]
    rows = _read_record_file(path)
    for index, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {index}: expected a JSON object, got {type(row).__name__}")
    return rows


def sha256_path(path: Path | str) -> str:
    """Content hash of a data file, or of every file under a directory (names included).

    For a directory, files are visited in sorted relative-path order and each contributes its
    relative path and its bytes, so renaming or editing any file changes the hash.
    """
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(file.relative_to(path).as_posix().encode("utf-8") + b"\0")
            digest.update(file.read_bytes())
            digest.update(b"\0")
    else:
        digest.update(path.read_bytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------ ratio counts


def parse_split_ratio(ratio: str) -> tuple[int, int, int]:
    """Parse ``"train:val:test"`` weights such as ``"2:1:7"``.

    Three non-negative integers whose sum is positive; anything else raises :class:`ConfigError`
    naming ``benchmark.split_ratio``.
    """
    parts = str(ratio).split(":")
    if len(parts) != 3 or not all(part.strip().isdigit() for part in parts):
        raise ConfigError(
            f"benchmark.split_ratio must be three non-negative integers 'train:val:test' such as '2:1:7'; "
            f"got {ratio!r}"
        )
    weights = (int(parts[0]), int(parts[1]), int(parts[2]))
    if sum(weights) == 0:
        raise ConfigError(f"benchmark.split_ratio {ratio!r} has weights summing to 0")
    return weights


def largest_remainder_counts(n: int, ratio: str) -> tuple[int, int, int]:
    """Split ``n`` items into train/val/test counts by the weights in ``ratio`` (e.g. ``"2:1:7"``).

    Integer largest remainder: ``base_i = n*w_i // W``; the leftover slots go to the largest
    ``n*w_i % W``, ties to the larger ``w_i``, then to the earlier split. The counts sum to ``n``
    and each is within 1 of ``n*w_i/W``. A bad ratio raises :class:`ConfigError`.
    """
    weights = parse_split_ratio(ratio)
    if n < 0:
        raise ValueError(f"item count must be >= 0, got {n}")
    total = sum(weights)
    counts = [n * w // total for w in weights]
    order = sorted(range(3), key=lambda i: (-(n * weights[i] % total), -weights[i], i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts[0], counts[1], counts[2]


# ------------------------------------------------------------------------------------------ splits


class SplitSpec(BaseModel):
    """The benchmark settings that decide how splits are built (keys under ``benchmark:``).

    Built from the benchmark config section with ``SplitSpec.model_validate(section)``; other keys
    in the section are ignored. An empty string for a path means unset.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    split_mode: str = "split_dir"
    split_dir: Path | None = None
    data_path: Path | None = None
    split_ratio: str = "2:1:7"
    split_seed: int = 42
    limit: int = 0
    split_output_dir: Path | None = None

    @classmethod
    def from_benchmark_config(
        cls, section: BaseModel | Mapping[str, Any], *, default_split_mode: str
    ) -> SplitSpec:
        """Build from the ``benchmark:`` config section; an unset ``split_mode`` takes the benchmark's
        default."""
        values = dict(section.model_dump() if isinstance(section, BaseModel) else section)
        if values.get("split_mode") is None:
            values["split_mode"] = default_split_mode
        return cls.model_validate(values)

    @field_validator("split_dir", "data_path", "split_output_dir", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value


@dataclass(frozen=True)
class Splits:
    """The three loaded splits plus where they came from.

    ``source_sha256`` is the content hash of the data that produced them (for cache keys),
    ``dropped`` counts rows dropped by reason, ``files`` names the file each split was read from
    (``None`` for generated splits), ``manifest`` is the ratio-mode manifest and ``out_dir`` the
    ratio-mode output folder. Counts and ids are taken after ``limit``.
    """

    train: list[Item]
    val: list[Item]
    test: list[Item]
    source_sha256: str
    dropped: dict[str, int] = field(default_factory=dict)
    files: dict[str, Path | None] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None
    out_dir: Path | None = None

    def get(self, name: str) -> list[Item]:
        """The split called ``name`` (any name :func:`resolve_split` accepts)."""
        split: list[Item] = getattr(self, resolve_split(name))
        return split

    def ids(self, name: str) -> list[str]:
        """The ids of split ``name`` in order."""
        return [item.id for item in self.get(name)]

    @property
    def counts(self) -> dict[str, int]:
        """Number of items per split."""
        return {name: len(getattr(self, name)) for name in SPLIT_NAMES}


@dataclass
class _Row:
    """One raw row and where it came from, for error messages."""

    data: dict[str, Any]
    split: str | None
    file: Path | str
    index: int  # 1-based

    @property
    def where(self) -> str:
        split = f"{self.split} split, " if self.split else ""
        line = getattr(self.data, "line", None)
        return f"{split}{self.file} " + (f"line {line}" if line else f"row {self.index}")


def default_split_output_dir(run_dir: Path | str, benchmark: str, split_ratio: str, split_seed: int) -> Path:
    """``<run_dir>/splits/<benchmark>_<ratio with ':' -> '-'>_seed<seed>``."""
    return Path(run_dir) / "splits" / f"{benchmark}_{split_ratio.replace(':', '-')}_seed{split_seed}"


def split_output_dir(spec: SplitSpec, *, run_dir: Path | str, benchmark: str) -> Path:
    """Where ratio mode writes: ``spec.split_output_dir`` if set, else :func:`default_split_output_dir`."""
    if spec.split_output_dir is not None:
        return spec.split_output_dir
    return default_split_output_dir(run_dir, benchmark, spec.split_ratio, spec.split_seed)


def load_splits(
    spec: SplitSpec,
    *,
    benchmark: str,
    reader: Reader = read_records,
    normalise: Normaliser = identity_normaliser,
    default_task_type: str = DEFAULT_TASK_TYPE,
    native_extensions: Sequence[str] = _RECORD_EXTENSIONS,
    generate: Generator | None = None,
    out_dir: Path | str | None = None,
    partition: Partitioner | None = None,
    manifest_extra: Mapping[str, Any] | None = None,
) -> Splits:
    """Load the train/val/test splits of ``benchmark`` as ``spec`` says.

    * ``reader(path)`` is the benchmark's raw reader, ``normalise(row)`` its normaliser. The
      normaliser runs on every row in every mode, so it must be idempotent. It must produce an
      ``id`` (sanitised with :func:`safe_id`; a changed id keeps the raw value as ``source_id``);
      a missing ``task_type`` becomes ``default_task_type``. It may raise :class:`DropRow` to drop
      a row under a drop rule (logged, counted in ``dropped``); a ``KeyError`` or ``ValueError`` it
      raises becomes a :class:`DataError` naming the file and row.
    * ``split_dir``: ``<split_dir>/{train,val,test}/`` must exist; each reads ``items.json`` when
      present (with :func:`read_records`), else the first sorted file ending in one of
      ``native_extensions`` (with ``reader``).
    * ``ratio``: ``reader(data_path)``, normalise, ``random.Random(split_seed).shuffle``, slice by
      :func:`largest_remainder_counts` (or by ``partition(items, spec)`` when a benchmark splits its
      own way), write ``<out>/{train,val,test}/items.json`` and ``<out>/split_manifest.json``
      atomically, then read them back through the split_dir path. ``<out>`` is ``out_dir``, else
      ``spec.split_output_dir`` (see :func:`split_output_dir` for the run-dir default). An existing
      ``<out>`` is reused when its manifest matches and is never overwritten when it does not.
      ``manifest_extra`` adds keys to the manifest (they take part in the match).
    * ``generated``: ``generate(split_seed)`` returns the three splits; reads no files. A benchmark
      without ``generate`` gets a :class:`ConfigError`.

    Ids are unique across the three splits; train and val are non-empty (an empty test split only
    warns); ``limit > 0`` keeps the first ``limit`` items of each split. Returns fresh objects.
    Raises :class:`ConfigError` for bad settings and :class:`DataError` for bad data, each naming
    the key, file, row or ids involved.
    """
    if spec.split_mode not in SPLIT_MODES:
        raise ConfigError(
            f"benchmark.split_mode must be one of {', '.join(SPLIT_MODES)}; got {spec.split_mode!r}"
        )
    if spec.limit < 0:
        raise ConfigError(f"benchmark.limit must be >= 0 (0 = all items); got {spec.limit}")
    if spec.split_mode == "split_dir":
        splits = _load_split_dir(spec, reader, normalise, default_task_type, native_extensions)
    elif spec.split_mode == "ratio":
        target = Path(out_dir) if out_dir is not None else spec.split_output_dir
        splits = _load_ratio(
            spec, benchmark, reader, normalise, default_task_type, target, partition, manifest_extra
        )
    else:
        splits = _load_generated(spec, benchmark, generate, normalise, default_task_type)
    return _apply_limit(splits, spec.limit)


def _apply_limit(splits: Splits, limit: int) -> Splits:
    if limit <= 0:
        return splits
    return Splits(
        train=splits.train[:limit],
        val=splits.val[:limit],
        test=splits.test[:limit],
        source_sha256=splits.source_sha256,
        dropped=splits.dropped,
        files=splits.files,
        manifest=splits.manifest,
        out_dir=splits.out_dir,
    )


def absent_field(row: Mapping[str, Any], name: Any) -> str:
    """Why the required field ``name`` holds no value in ``row``: null, empty, or not there at all."""
    if name not in row:
        return f"missing field {name!r}"
    value = row[name]
    if value is None:
        return f"field {name!r} is null; it needs a value"
    if isinstance(value, str):
        value = value.strip()
    if isinstance(value, str | list | tuple | dict) and not value:
        return f"field {name!r} is empty; it needs a value"
    return f"field {name!r} holds no usable value"


def _to_item(row: _Row, normalise: Normaliser, default_task_type: str) -> Item:
    """Normalise one row into an Item; DropRow passes through to the caller."""
    try:
        data = normalise(row.data)
    except KeyError as exc:
        raise DataError(f"{row.where}: {absent_field(row.data, exc.args[0])}") from exc
    except ValueError as exc:
        raise DataError(f"{row.where}: {exc}") from exc
    except (DropRow, SkillOptError):
        raise
    except Exception as exc:  # a bug in the normaliser: said with the row it failed on
        raise DataError(f"{row.where}: normalise_row raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(data, dict):
        raise DataError(f"{row.where}: the normaliser returned {type(data).__name__}, not a dict")
    item = Item(data)
    raw_id = item.get("id")
    if raw_id is None or raw_id == "":
        row_id = row.data.get("id")
        if row_id is not None and str(row_id).strip():
            raise DataError(f"{row.where}: normalise_row returned no 'id' (the row has id {row_id!r})")
        if "id" in row.data:
            raise DataError(f"{row.where}: {absent_field(row.data, 'id')}")
        raise DataError(f"{row.where}: missing field 'id' after normalising")
    try:
        clean = safe_id(raw_id)
    except DataError as exc:
        raise DataError(f"{row.where}: {exc}") from None
    if clean != str(raw_id):
        item["source_id"] = str(raw_id)
    item["id"] = clean
    if not item.get("task_type"):
        item["task_type"] = default_task_type
    return item


def _normalise_rows(
    rows: Iterable[_Row], normalise: Normaliser, default_task_type: str, dropped: Counter[str]
) -> list[tuple[Item, _Row]]:
    kept: list[tuple[Item, _Row]] = []
    for row in rows:
        try:
            kept.append((_to_item(row, normalise, default_task_type), row))
        except DropRow as drop:
            log.info("dropped %s: %s", row.where, drop.reason)
            dropped[drop.reason] += 1
    return kept


def _check_unique(pairs: Iterable[tuple[Item, _Row]]) -> None:
    """Raise DataError on the first id seen twice, naming both source ids and where they came from."""
    seen: dict[str, tuple[Item, _Row]] = {}
    for item, row in pairs:
        if item.id in seen:
            first_item, first_row = seen[item.id]
            raise DataError(
                f"duplicate item id {item.id!r}: source id {first_item.source_id!r} ({first_row.where}) "
                f"and source id {item.source_id!r} ({row.where}); ids must be unique across train, val "
                "and test"
            )
        seen[item.id] = (item, row)


def _check_not_empty(counts: Mapping[SplitName, int], where: str) -> None:
    if counts["train"] == 0 or counts["val"] == 0:
        raise DataError(
            f"{where}: train and val must be non-empty (the gate needs val); got "
            f"train={counts['train']}, val={counts['val']}, test={counts['test']}"
        )
    if counts["test"] == 0 and where not in _said_empty_test:
        # once per process: a command loads its splits more than once (checks, the run, the estimate)
        _said_empty_test.add(where)
        log.warning("%s: the test split is empty; final test evaluation will have no items", where)


_said_empty_test: set[str] = set()


def _split_file(split_path: Path, native_extensions: Sequence[str]) -> Path:
    items = split_path / ITEMS_FILE
    if items.is_file():
        return items
    suffixes = tuple(ext.lower() for ext in native_extensions)
    matches = [p for p in _visible_files(split_path) if p.name.lower().endswith(suffixes)]
    if not matches:
        raise DataError(f"{split_path}: no {ITEMS_FILE} and no file ending in {', '.join(native_extensions)}")
    return matches[0]


def _load_split_dir(
    spec: SplitSpec,
    reader: Reader,
    normalise: Normaliser,
    default_task_type: str,
    native_extensions: Sequence[str],
    *,
    check_sizes: bool = True,
) -> Splits:
    root = spec.split_dir
    if root is None:
        raise ConfigError(
            "split_dir mode needs benchmark.split_dir (a folder holding train/, val/ and test/)"
        )
    missing = [name for name in SPLIT_NAMES if not (root / name).is_dir()]
    if missing:
        raise DataError(
            f"{root}: split_dir mode needs train/, val/ and test/ folders; missing {', '.join(missing)}/"
        )
    dropped: Counter[str] = Counter()
    digest = hashlib.sha256()
    files: dict[str, Path | None] = {}
    per_split: dict[str, list[tuple[Item, _Row]]] = {}
    for name in SPLIT_NAMES:
        file = _split_file(root / name, native_extensions)
        files[name] = file
        digest.update(f"{name}/{file.name}\0".encode())
        digest.update(file.read_bytes())
        digest.update(b"\0")
        raw = read_records(file) if file.name == ITEMS_FILE else reader(file)
        rows = (_Row(data, name, file, index) for index, data in enumerate(raw, start=1))
        per_split[name] = _normalise_rows(rows, normalise, default_task_type, dropped)
    _check_unique(pair for name in SPLIT_NAMES for pair in per_split[name])
    items = {name: [item for item, _ in per_split[name]] for name in SPLIT_NAMES}
    if check_sizes:
        _check_not_empty({name: len(items[name]) for name in SPLIT_NAMES}, str(root))
    return Splits(
        train=items["train"],
        val=items["val"],
        test=items["test"],
        source_sha256=digest.hexdigest(),
        dropped=dict(sorted(dropped.items())),
        files=files,
    )


def _load_generated(
    spec: SplitSpec,
    benchmark: str,
    generate: Generator | None,
    normalise: Normaliser,
    default_task_type: str,
) -> Splits:
    if generate is None:
        raise ConfigError(
            f"benchmark.split_mode 'generated' is not supported by benchmark {benchmark!r}; "
            "use split_dir or ratio"
        )
    generated = generate(spec.split_seed)
    unknown = sorted(set(generated) - set(SPLIT_NAMES))
    if unknown:
        raise DataError(
            f"benchmark {benchmark!r} generated unknown splits {unknown}; expected train, val, test"
        )
    dropped: Counter[str] = Counter()
    per_split: dict[str, list[tuple[Item, _Row]]] = {}
    for name in SPLIT_NAMES:
        source = f"<{benchmark} generator, seed {spec.split_seed}>"
        rows = (
            _Row(copy.deepcopy(dict(data)), name, source, i)
            for i, data in enumerate(generated.get(name, []), start=1)
        )
        per_split[name] = _normalise_rows(rows, normalise, default_task_type, dropped)
    _check_unique(pair for name in SPLIT_NAMES for pair in per_split[name])
    items = {name: [item for item, _ in per_split[name]] for name in SPLIT_NAMES}
    _check_not_empty({name: len(items[name]) for name in SPLIT_NAMES}, f"generated {benchmark} splits")
    canonical = json.dumps(items, sort_keys=True, ensure_ascii=False, default=str)
    return Splits(
        train=items["train"],
        val=items["val"],
        test=items["test"],
        source_sha256=hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        dropped=dict(sorted(dropped.items())),
        files=dict.fromkeys(SPLIT_NAMES),
    )


# Manifest keys compared when deciding whether an existing output folder can be reused; the
# source path is informational, so moving the same data file elsewhere still reuses the split.
_MANIFEST_MATCH_EXCLUDES = frozenset({"source_data_path"})


def _load_ratio(
    spec: SplitSpec,
    benchmark: str,
    reader: Reader,
    normalise: Normaliser,
    default_task_type: str,
    out: Path | None,
    partition: Partitioner | None,
    manifest_extra: Mapping[str, Any] | None,
) -> Splits:
    if spec.data_path is None:
        raise ConfigError("ratio mode needs data_path (set benchmark.data_path or pass --data FILE)")
    if out is None:
        raise ConfigError(
            "ratio mode needs an output folder: set benchmark.split_output_dir or pass the run's "
            "default (skillopt.core.data.split_output_dir)"
        )
    parse_split_ratio(spec.split_ratio)  # a bad ratio fails before any I/O
    source = spec.data_path
    raw = reader(source)
    dropped: Counter[str] = Counter()
    pairs = _normalise_rows(
        (_Row(data, None, source, index) for index, data in enumerate(raw, start=1)),
        normalise,
        default_task_type,
        dropped,
    )
    _check_unique(pairs)
    items = [item for item, _ in pairs]
    random.Random(spec.split_seed).shuffle(items)
    if partition is None:
        n_train, n_val, n_test = largest_remainder_counts(len(items), spec.split_ratio)
        parts: dict[str, list[Item]] = {
            "train": items[:n_train],
            "val": items[n_train : n_train + n_val],
            "test": items[n_train + n_val :],
        }
    else:
        given = partition(items, spec)
        parts = {name: list(given.get(name, [])) for name in SPLIT_NAMES}
        if sum(len(part) for part in parts.values()) > len(items):
            raise DataError(f"benchmark {benchmark!r}: its partition returned more items than it was given")
    counts = {name: len(parts[name]) for name in SPLIT_NAMES}
    _check_not_empty(counts, f"{source} split {spec.split_ratio} over {len(items)} items")
    manifest: dict[str, Any] = {
        "source_data_path": str(source),
        "source_sha256": sha256_path(source),
        "split_mode": "ratio",
        "split_ratio": spec.split_ratio,
        "split_seed": spec.split_seed,
        "counts": counts,
        "dropped": dict(sorted(dropped.items())),
        "ids": {name: [item.id for item in parts[name]] for name in SPLIT_NAMES},
    }
    manifest.update(manifest_extra or {})
    manifest_path = out / MANIFEST_FILE
    if manifest_path.exists():
        _check_manifest_matches(manifest_path, manifest)
        log.info("reusing ratio splits in %s (manifest matches)", out)
    else:
        if out.exists() and any(out.iterdir()):
            raise DataError(
                f"{out}: the split output folder exists and is not empty but has no {MANIFEST_FILE}; "
                "it is not overwritten — remove it or set benchmark.split_output_dir to another folder"
            )
        for name in SPLIT_NAMES:
            _write_json_atomic(out / name / ITEMS_FILE, parts[name])
        _write_json_atomic(manifest_path, manifest)  # last: a manifest means the folder is complete
    read_back = _load_split_dir(
        SplitSpec(split_mode="split_dir", split_dir=out),
        reader,
        normalise,
        default_task_type,
        (ITEMS_FILE,),
        check_sizes=False,  # checked before writing
    )
    for name in SPLIT_NAMES:
        if [item.id for item in getattr(read_back, name)] != manifest["ids"][name]:
            raise DataError(
                f"{out / name / ITEMS_FILE}: ids do not match {manifest_path}; the split files were "
                "edited or the normaliser is not idempotent"
            )
    return Splits(
        train=read_back.train,
        val=read_back.val,
        test=read_back.test,
        source_sha256=manifest["source_sha256"],
        dropped=dict(manifest["dropped"]),
        files=read_back.files,
        manifest=manifest,
        out_dir=out,
    )


def _check_manifest_matches(manifest_path: Path, expected: dict[str, Any]) -> None:
    try:
        existing = json.loads(_read_text(manifest_path))
    except json.JSONDecodeError as exc:
        raise DataError(f"{manifest_path}: line {exc.lineno}: malformed JSON ({exc.msg})") from None
    if not isinstance(existing, dict):
        raise DataError(f"{manifest_path}: expected a JSON object")
    keys = sorted((set(existing) | set(expected)) - _MANIFEST_MATCH_EXCLUDES)
    differing = [key for key in keys if existing.get(key) != expected.get(key)]
    if differing:
        raise DataError(
            f"{manifest_path} does not match the split requested from {expected['source_data_path']} "
            f"(differs in: {', '.join(differing)}; existing source {existing.get('source_data_path')!r}, "
            f"sha256 {str(existing.get('source_sha256'))[:12]} vs {expected['source_sha256'][:12]}); "
            "it is not overwritten — remove the folder or set benchmark.split_output_dir to another one"
        )


def _write_json_atomic(path: Path, value: Any) -> None:
    """Write JSON (UTF-8, indent 2) via a temp file in the same folder and an atomic rename."""
    atomic_write_bytes(path, (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


# ---------------------------------------------------------------------------------- epoch planning


class BatchPlan(BaseModel):
    """One batch: its 0-based index in the epoch, its seed and the item ids in walk order."""

    model_config = ConfigDict(frozen=True)

    index: int
    seed: int
    item_ids: list[str]


class StepPlan(BaseModel):
    """One optimisation step: its 0-based index in the epoch and its ``accumulation`` batches."""

    model_config = ConfigDict(frozen=True)

    index: int
    batches: list[BatchPlan]

    @property
    def item_ids(self) -> list[str]:
        """Every item id the step rolls out, batch by batch (an id may repeat after a refill)."""
        return [item_id for batch in self.batches for item_id in batch.item_ids]


class EpochPlan(BaseModel):
    """The deterministic batch schedule of one epoch."""

    model_config = ConfigDict(frozen=True)

    epoch: int = Field(ge=1)
    seed: int
    batch_size: int = Field(ge=1)
    accumulation: int = Field(ge=1)
    train_size: int = Field(ge=1)
    steps: list[StepPlan]

    @property
    def batches(self) -> list[BatchPlan]:
        """All batches of the epoch in order."""
        return [batch for step in self.steps for batch in step.batches]


def _check_positive(value: int, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer; got {value!r}")


def steps_per_epoch(train_size: int, batch_size: int, accumulation: int) -> int:
    """``ceil(train_size / (batch_size * accumulation))``: one epoch is one pass over train."""
    _check_positive(batch_size, "train.batch_size")
    _check_positive(accumulation, "train.accumulation")
    if train_size < 0:
        raise ValueError(f"train_size must be >= 0, got {train_size}")
    return math.ceil(train_size / (batch_size * accumulation))


def plan_epoch(
    train_ids: Sequence[str], *, seed: int, epoch: int, batch_size: int, accumulation: int
) -> EpochPlan:
    """Plan the batches of epoch ``epoch`` (1-based) over ``train_ids`` (in split file order).

    A copy of ``train_ids`` is shuffled with ``random.Random(seed + 1000*epoch)`` and walked in
    consecutive batches of ``batch_size``; batch ``k`` (0-based in the epoch) has seed
    ``seed + 1000*epoch + k + 1``. The epoch has ``steps_per_epoch * accumulation`` batches. The
    last batch of a pass stays partial; if the pass is exhausted and batches are still needed
    (accumulation > 1), ``train_ids`` is reshuffled with that batch's seed and the walk continues
    in the new order. Step ``j`` holds batches ``j*accumulation … j*accumulation+accumulation-1``.
    Same inputs give an identical plan. Raises ConfigError for a bad batch size or accumulation and
    ValueError for a bad epoch, an empty train split or duplicate ids.
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise ValueError(f"epoch is 1-based; got {epoch!r}")
    ids = list(train_ids)
    if not ids:
        raise DataError("cannot plan an epoch over an empty train split")
    repeated = sorted(item_id for item_id, count in Counter(ids).items() if count > 1)
    if repeated:
        raise DataError(f"train ids repeat: {', '.join(repeated[:5])}")
    n_steps = steps_per_epoch(len(ids), batch_size, accumulation)
    epoch_seed = seed + 1000 * epoch
    order = list(ids)
    random.Random(epoch_seed).shuffle(order)
    position = 0
    batches: list[BatchPlan] = []
    for k in range(n_steps * accumulation):
        batch_seed = epoch_seed + k + 1
        if position >= len(order):
            order = list(ids)
            random.Random(batch_seed).shuffle(order)
            position = 0
        chunk = order[position : position + batch_size]
        position += len(chunk)
        batches.append(BatchPlan(index=k, seed=batch_seed, item_ids=chunk))
    steps = [
        StepPlan(index=j, batches=batches[j * accumulation : (j + 1) * accumulation]) for j in range(n_steps)
    ]
    return EpochPlan(
        epoch=epoch,
        seed=seed,
        batch_size=batch_size,
        accumulation=accumulation,
        train_size=len(ids),
        steps=steps,
    )


def small_split_warning(sizes: Mapping[str, int], *, min_items: int, split_mode: str,
                        split_ratio: str) -> str | None:
    """The warning for splits smaller than ``evaluation.min_split_items`` (``min_items``), or None.

    Scores on a handful of items say little (one item of a 2-item selection split is 50 points), so the
    run goes on but says so, with the sizes and the setting that changes them.
    """
    small = [f"{split} {size}" for split, size in sizes.items() if size < min_items]
    if not min_items or not small:
        return None
    fix = (f"set benchmark.split_ratio (now {split_ratio}, train:val:test) to give them more items, "
           "or add data"
           if split_mode == "ratio" else "add items to those splits")
    return (f"small splits: {', '.join(small)} item(s), fewer than evaluation.min_split_items ({min_items}); "
            f"scores on so few items are noisy: {fix}")


def check_train_size(configured: int, actual: int) -> int:
    """Return the train size to use: ``actual`` when ``configured`` is 0 (from data) or equal.

    A configured value that disagrees with the data raises :class:`ConfigError` naming
    ``train.train_size`` and both numbers.
    """
    if configured < 0:
        raise ConfigError(f"train.train_size must be >= 0 (0 = from data); got {configured}")
    if configured not in (0, actual):
        raise ConfigError(
            f"train.train_size is {configured} but the train split has {actual} items; "
            "set train.train_size to 0 (from data) or to the actual size"
        )
    return actual
