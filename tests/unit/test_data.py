"""Splits, ids and epoch planning (skillopt.core.data)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from skillopt.benchmarks.rows import required_text
from skillopt.benchmarks.searchqa import normalise_row as searchqa_row
from skillopt.core.data import (
    DropRow,
    EpochPlan,
    Item,
    SplitSpec,
    check_train_size,
    default_split_output_dir,
    largest_remainder_counts,
    load_splits,
    plan_epoch,
    read_records,
    resolve_split,
    safe_id,
    sha256_path,
    split_output_dir,
    steps_per_epoch,
)
from skillopt.core.errors import ConfigError, DataError

# ------------------------------------------------------------------------------------------ helpers


def rows(n: int, prefix: str = "q") -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{i}", "question": f"question {i}?", "answer": str(i)} for i in range(n)]


def write_json(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
    return path


def write_jsonl(path: Path, values: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(v) + "\n" for v in values), encoding="utf-8")
    return path


def make_split_dir(root: Path, train: int = 2, val: int = 1, test: int = 1) -> Path:
    write_json(root / "train" / "items.json", rows(train, "tr"))
    write_json(root / "val" / "items.json", rows(val, "va"))
    write_json(root / "test" / "items.json", rows(test, "te"))
    return root


def ratio_spec(data: Path, out: Path, **overrides: Any) -> SplitSpec:
    return SplitSpec(split_mode="ratio", data_path=data, split_output_dir=out, **overrides)


# --------------------------------------------------------------------------------------------- ids


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("train:0000", "train-0000"), ("a b/c", "a-b-c"), ("ok_id-1.2", "ok_id-1.2"), (7, "7"), ("é", "-")],
)
def test_safe_id_replaces_unsafe_characters(raw: Any, expected: str) -> None:
    assert safe_id(raw) == expected
    assert safe_id(safe_id(raw)) == expected


@pytest.mark.parametrize("raw", ["", ".hidden", "x" * 129, None, ["a"]])
def test_safe_id_rejects_empty_long_dotted_and_non_string_ids(raw: Any) -> None:
    with pytest.raises(DataError) as err:
        safe_id(raw)
    assert repr(raw)[:20] in str(err.value)


def test_item_is_a_json_serialisable_dict_with_typed_accessors() -> None:
    item = Item(id="train-0000", source_id="train:0000", task_type="pick", gamefile="g")
    assert (item.id, item.source_id, item.task_type) == ("train-0000", "train:0000", "pick")
    assert json.loads(json.dumps(item)) == dict(item)
    assert isinstance(item.copy(), Item) and item.copy() is not item
    assert Item(id="a", task_type="t").source_id == "a"

    class Holder(BaseModel):
        item: Item

    held = Holder.model_validate({"item": {"id": "a", "task_type": "t", "x": 1}})
    assert isinstance(held.item, Item) and held.item.id == "a"
    assert held.model_dump() == {"item": {"id": "a", "task_type": "t", "x": 1}}


# ------------------------------------------------------------------------------------- split names


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("train", "train"),
        ("val", "val"),
        ("selection", "val"),
        ("valid_seen", "val"),
        ("test", "test"),
        ("valid_unseen", "test"),
    ],
)
def test_resolve_split_accepts_aliases(name: str, split: str) -> None:
    assert resolve_split(name) == split


def test_resolve_split_rejects_unknown_names_listing_accepted_ones() -> None:
    with pytest.raises(ValueError) as err:
        resolve_split("dev")
    message = str(err.value)
    assert "'dev'" in message
    for accepted in ("train", "val", "selection", "valid_seen", "test", "valid_unseen"):
        assert accepted in message


# ----------------------------------------------------------------------------------------- reading


def test_read_records_accepts_every_default_shape(tmp_path: Path) -> None:
    data = rows(3)
    assert read_records(write_json(tmp_path / "array.json", data)) == data
    assert read_records(write_json(tmp_path / "wrapped.json", {"data": data})) == data
    assert read_records(write_json(tmp_path / "keyed.json", {r["id"]: r for r in data})) == data
    assert read_records(write_jsonl(tmp_path / "rows.jsonl", data)) == data
    # JSONL saved as .json is still read as JSONL
    assert read_records(write_jsonl(tmp_path / "rows_as.json", data)) == data
    folder = tmp_path / "folder"
    write_jsonl(folder / "only.jsonl", data)
    (folder / "README.md").write_text("not data", encoding="utf-8")
    assert read_records(folder) == data


def test_read_records_ignores_blank_lines_and_a_bom(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a"}\n\n{"id": "b"}\n')
    assert read_records(path) == [{"id": "a"}, {"id": "b"}]


def test_read_records_directory_with_split_folders_suggests_split_dir(tmp_path: Path) -> None:
    make_split_dir(tmp_path / "data")
    with pytest.raises(DataError, match="split_dir"):
        read_records(tmp_path / "data")


def test_read_records_directory_needs_exactly_one_data_file(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d" / "a.jsonl", rows(1))
    write_json(tmp_path / "d" / "b.json", rows(1))
    with pytest.raises(DataError, match=r"exactly one .*a\.jsonl, b\.json"):
        read_records(tmp_path / "d")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="found none"):
        read_records(tmp_path / "empty")


def test_read_records_non_utf8_names_file_and_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "caf\xe9"}\n')
    with pytest.raises(DataError) as err:
        read_records(path)
    assert str(path) in str(err.value) and "byte offset 11" in str(err.value)
    path.write_bytes(b"\xef\xbb\xbf" + b'{"id": "caf\xe9"}\n')  # offsets count the BOM too
    with pytest.raises(DataError, match="byte offset 14"):
        read_records(path)


def test_read_records_malformed_jsonl_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": \n', encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_records(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value)


def test_read_records_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"id": "a"},\n  {"id": }\n]\n', encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_records(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value)


def test_read_records_rejects_non_object_rows_and_other_shapes(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"row 2: expected a JSON object"):
        read_records(write_json(tmp_path / "mixed.json", [{"id": "a"}, "b"]))
    with pytest.raises(DataError, match="expected a JSON array"):
        read_records(write_json(tmp_path / "scalar.json", 3))
    with pytest.raises(DataError, match="does not exist"):
        read_records(tmp_path / "missing.json")


# ------------------------------------------------------------------------------------ ratio counts


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (10, (2, 1, 7)),
        (388, (77, 39, 272)),
        (400, (80, 40, 280)),
        (534, (107, 53, 374)),
        (2000, (400, 200, 1400)),
    ],
)
def test_largest_remainder_counts_at_2_1_7(n: int, expected: tuple[int, int, int]) -> None:
    assert largest_remainder_counts(n, "2:1:7") == expected


def test_largest_remainder_ties_go_to_larger_weight_then_earlier_split() -> None:
    assert largest_remainder_counts(1, "1:1:1") == (1, 0, 0)  # equal weights: earliest split
    assert largest_remainder_counts(2, "1:1:1") == (1, 1, 0)
    assert largest_remainder_counts(1, "1:1:2") == (0, 0, 1)  # remainders 1,1,2: largest remainder
    assert largest_remainder_counts(3, "1:1:1") == (1, 1, 1)


@given(
    n=st.integers(min_value=0, max_value=5000),
    weights=st.tuples(*(st.integers(min_value=0, max_value=20),) * 3).filter(lambda w: sum(w) > 0),
)
def test_largest_remainder_counts_sum_to_n_and_stay_within_one(n: int, weights: tuple[int, int, int]) -> None:
    counts = largest_remainder_counts(n, ":".join(map(str, weights)))
    assert sum(counts) == n
    total = sum(weights)
    for count, weight in zip(counts, weights, strict=True):
        assert abs(count - n * weight / total) < 1


@pytest.mark.parametrize("ratio", ["2:1", "2:1:7:1", "a:b:c", "0:0:0", "-1:1:1", "", "2.5:1:7"])
def test_bad_split_ratio_is_a_config_error_naming_the_key(ratio: str) -> None:
    with pytest.raises(ConfigError, match=r"benchmark\.split_ratio"):
        largest_remainder_counts(10, ratio)


# --------------------------------------------------------------------------------------- split_dir


def test_split_dir_loads_items_json_and_native_files(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_json(root / "train" / "items.json", rows(2, "tr"))
    write_json(root / "train" / "z_ignored.json", rows(1, "zz"))  # items.json wins
    write_jsonl(root / "val" / "b.jsonl", rows(1, "vb"))
    write_jsonl(root / "val" / "a.jsonl", rows(1, "va"))  # first sorted native file wins
    write_json(root / "test" / "items.json", rows(1, "te"))

    splits = load_splits(SplitSpec(split_dir=root), benchmark="qa", default_task_type="qa")

    assert splits.ids("train") == ["tr0", "tr1"]
    assert splits.ids("selection") == ["va0"]
    assert splits.ids("valid_unseen") == ["te0"]
    assert all(isinstance(item, Item) and item.task_type == "qa" for item in splits.train)
    assert splits.files["val"] == root / "val" / "a.jsonl"
    assert len(splits.source_sha256) == 64


def test_split_dir_uses_the_benchmark_reader_for_native_files(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    (root / "val" / "items.json").unlink()
    (root / "val" / "rows.csv").write_text("id,question\nv1,hi\n", encoding="utf-8")

    def csv_reader(path: Path) -> list[dict[str, Any]]:
        header, *lines = path.read_text(encoding="utf-8").splitlines()
        return [dict(zip(header.split(","), line.split(","), strict=True)) for line in lines]

    splits = load_splits(
        SplitSpec(split_dir=root), benchmark="b", reader=csv_reader, native_extensions=(".csv",)
    )
    assert splits.ids("val") == ["v1"]


def test_split_dir_missing_split_folders_are_named(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_json(root / "train" / "items.json", rows(1))
    with pytest.raises(DataError) as err:
        load_splits(SplitSpec(split_dir=root), benchmark="qa")
    assert "val/" in str(err.value) and "test/" in str(err.value) and str(root) in str(err.value)


def test_split_dir_runs_the_normaliser_and_sanitises_ids(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_json(root / "train" / "items.json", [{"id": "train:0000", "gamefile": "a"}])
    write_json(root / "val" / "items.json", [{"id": "valid_seen:0000", "gamefile": "b"}])
    write_json(root / "test" / "items.json", [{"id": "valid_unseen:0000", "gamefile": "c"}])

    def normalise(row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "task_type": row.get("task_type") or "pick"}

    splits = load_splits(SplitSpec(split_dir=root), benchmark="alfworld", normalise=normalise)
    item = splits.train[0]
    assert item == {"id": "train-0000", "source_id": "train:0000", "gamefile": "a", "task_type": "pick"}


def test_split_dir_row_without_id_names_file_and_row(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    write_json(root / "val" / "items.json", [{"id": "v0"}, {"question": "no id"}])
    with pytest.raises(DataError) as err:
        load_splits(SplitSpec(split_dir=root), benchmark="qa")
    message = str(err.value)
    assert str(root / "val" / "items.json") in message and "row 2" in message and "'id'" in message


def test_normaliser_missing_field_names_file_row_and_field(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")

    def normalise(row: dict[str, Any]) -> dict[str, Any]:
        return {"id": row["id"], "answers": [row["gold"]]}

    with pytest.raises(DataError) as err:
        load_splits(SplitSpec(split_dir=root), benchmark="qa", normalise=normalise)
    message = str(err.value)
    assert str(root / "train" / "items.json") in message and "row 1" in message and "'gold'" in message


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (None, "field 'question' is null"),
        ("  ", "field 'question' is empty"),
        (..., "missing field 'question'"),
    ],
)
def test_a_null_field_is_named_as_null_not_missing(tmp_path: Path, value: Any, said: str) -> None:
    root = make_split_dir(tmp_path / "data")
    row = {"id": "t0", "context": "c", "answers": ["a"]}
    if value is not ...:
        row["question"] = value
    write_json(root / "train" / "items.json", [row])
    with pytest.raises(DataError) as err:
        load_splits(SplitSpec(split_dir=root), benchmark="searchqa", normalise=searchqa_row)
    message = str(err.value)
    assert "row 1" in message and said in message
    assert value is ... or "missing" not in message


def test_a_null_alias_is_named_by_required_text(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    write_json(root / "train" / "items.json", [{"id": "t0", "query": None}])

    def normalise(row: dict[str, Any]) -> dict[str, Any]:
        return {"id": row["id"], "question": required_text(row, "question", "query")}

    with pytest.raises(DataError, match="field 'query' is null"):
        load_splits(SplitSpec(split_dir=root), benchmark="qa", normalise=normalise)


def test_a_null_id_is_named_as_null(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    write_json(root / "val" / "items.json", [{"id": None, "question": "q"}])
    with pytest.raises(DataError) as err:
        load_splits(SplitSpec(split_dir=root), benchmark="qa")
    assert "row 1" in str(err.value) and "field 'id' is null" in str(err.value)


def test_duplicate_ids_across_splits_name_both_sources(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    write_json(root / "test" / "items.json", [{"id": "tr1"}])
    with pytest.raises(DataError) as err:
        load_splits(SplitSpec(split_dir=root), benchmark="qa")
    message = str(err.value)
    assert "train split" in message and "test split" in message
    assert str(root / "train" / "items.json") in message and str(root / "test" / "items.json") in message


def test_duplicate_created_by_sanitising_names_both_source_ids(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    write_json(root / "train" / "items.json", [{"id": "a:b"}, {"id": "x"}])
    write_json(root / "val" / "items.json", [{"id": "a/b"}])
    with pytest.raises(DataError) as err:
        load_splits(SplitSpec(split_dir=root), benchmark="qa")
    message = str(err.value)
    assert "'a-b'" in message and "'a:b'" in message and "'a/b'" in message


def test_bad_raw_id_names_the_row(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    write_json(root / "val" / "items.json", [{"id": ".secret"}])
    with pytest.raises(DataError, match=r"val split, .*row 1: item id '\.secret'"):
        load_splits(SplitSpec(split_dir=root), benchmark="qa")


def test_empty_train_or_val_is_an_error_giving_the_counts(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    write_json(root / "val" / "items.json", [])
    with pytest.raises(DataError, match="train=2, val=0, test=1"):
        load_splits(SplitSpec(split_dir=root), benchmark="qa")
    make_split_dir(root)
    write_json(root / "train" / "items.json", [])
    with pytest.raises(DataError, match="train=0, val=1, test=1"):
        load_splits(SplitSpec(split_dir=root), benchmark="qa")


def test_empty_test_split_only_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = make_split_dir(tmp_path / "data")
    write_json(root / "test" / "items.json", [])
    with caplog.at_level(logging.WARNING, logger="skillopt.core.data"):
        splits = load_splits(SplitSpec(split_dir=root), benchmark="qa")
        load_splits(SplitSpec(split_dir=root), benchmark="qa")  # a command loads its splits more than once
    assert splits.test == [] and caplog.text.count("test split is empty") == 1


def test_limit_keeps_the_first_items_of_each_split(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data", train=5, val=3, test=1)
    splits = load_splits(SplitSpec(split_dir=root, limit=2), benchmark="qa")
    assert splits.counts == {"train": 2, "val": 2, "test": 1}
    assert splits.ids("train") == ["tr0", "tr1"]
    with pytest.raises(ConfigError, match=r"benchmark\.limit"):
        load_splits(SplitSpec(split_dir=root, limit=-1), benchmark="qa")


def test_loaders_return_fresh_objects(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    first = load_splits(SplitSpec(split_dir=root), benchmark="qa")
    first.train[0]["question"] = "mutated"
    second = load_splits(SplitSpec(split_dir=root), benchmark="qa")
    assert second.train[0]["question"] == "question 0?"


def test_drops_are_counted_by_reason(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data", train=4)

    def normalise(row: dict[str, Any]) -> dict[str, Any]:
        if row["id"] in ("tr1", "tr3"):
            raise DropRow("missing_image")
        return row

    splits = load_splits(SplitSpec(split_dir=root), benchmark="b", normalise=normalise)
    assert splits.ids("train") == ["tr0", "tr2"]
    assert splits.dropped == {"missing_image": 2}


def test_unknown_split_mode_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"benchmark\.split_mode.*'random'"):
        load_splits(SplitSpec(split_mode="random", split_dir=tmp_path), benchmark="qa")


# ------------------------------------------------------------------------------------------- ratio


def test_ratio_writes_splits_and_manifest_that_read_back_identically(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "items.jsonl", [{**r, "id": f"item:{i}"} for i, r in enumerate(rows(10))])
    out = tmp_path / "out"

    splits = load_splits(ratio_spec(data, out), benchmark="qa", default_task_type="qa")

    assert splits.counts == {"train": 2, "val": 1, "test": 7}
    manifest = json.loads((out / "split_manifest.json").read_text(encoding="utf-8"))
    assert manifest == {
        "source_data_path": str(data),
        "source_sha256": sha256_path(data),
        "split_mode": "ratio",
        "split_ratio": "2:1:7",
        "split_seed": 42,
        "counts": {"train": 2, "val": 1, "test": 7},
        "dropped": {},
        "ids": {"train": splits.ids("train"), "val": splits.ids("val"), "test": splits.ids("test")},
    }
    assert splits.manifest == manifest and splits.source_sha256 == sha256_path(data)
    written = json.loads((out / "train" / "items.json").read_text(encoding="utf-8"))
    assert written == [dict(item) for item in splits.train]
    assert written[0]["source_id"].startswith("item:") and written[0]["task_type"] == "qa"
    # the written folder is itself split_dir input that loads the same items
    again = load_splits(SplitSpec(split_dir=out), benchmark="qa", default_task_type="qa")
    assert [again.ids(n) for n in ("train", "val", "test")] == [
        splits.ids(n) for n in ("train", "val", "test")
    ]
    assert again.train == splits.train
    assert not list(out.rglob(".*.tmp"))


def test_ratio_shuffles_in_file_order_with_the_split_seed(tmp_path: Path) -> None:
    data = write_json(tmp_path / "items.json", rows(20))
    expected = [r["id"] for r in rows(20)]
    random.Random(7).shuffle(expected)
    splits = load_splits(
        ratio_spec(data, tmp_path / "out", split_seed=7, split_ratio="1:1:2"), benchmark="qa"
    )
    assert splits.ids("train") + splits.ids("val") + splits.ids("test") == expected
    assert splits.counts == {"train": 5, "val": 5, "test": 10}


def test_ratio_output_keeps_non_ascii_text_readable(tmp_path: Path) -> None:
    data = write_json(tmp_path / "items.json", [{"id": f"r{i}", "question": "Größe?"} for i in range(3)])
    load_splits(ratio_spec(data, tmp_path / "out", split_ratio="1:1:1"), benchmark="qa")
    text = (tmp_path / "out" / "train" / "items.json").read_text(encoding="utf-8")
    assert "Größe?" in text and text.startswith('[\n  {\n    "id"')


def test_ratio_reuses_an_existing_matching_output(tmp_path: Path) -> None:
    data = write_json(tmp_path / "items.json", rows(10))
    out = tmp_path / "out"
    first = load_splits(ratio_spec(data, out), benchmark="qa")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*.json")}
    moved = write_json(tmp_path / "elsewhere" / "items.json", rows(10))  # same content, new path
    second = load_splits(ratio_spec(moved, out, limit=1), benchmark="qa")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.json")} == before
    assert second.ids("train") == first.ids("train")[:1]


def test_ratio_mismatching_manifest_is_an_error_and_nothing_is_overwritten(tmp_path: Path) -> None:
    data = write_json(tmp_path / "items.json", rows(10))
    out = tmp_path / "out"
    load_splits(ratio_spec(data, out), benchmark="qa")
    snapshot = {p: p.read_bytes() for p in out.rglob("*.json")}

    with pytest.raises(DataError) as err:
        load_splits(ratio_spec(data, out, split_seed=43), benchmark="qa")
    message = str(err.value)
    assert str(out / "split_manifest.json") in message and str(data) in message and "split_seed" in message

    write_json(data, rows(11))
    with pytest.raises(DataError, match="source_sha256"):
        load_splits(ratio_spec(data, out), benchmark="qa")
    assert {p: p.read_bytes() for p in out.rglob("*.json")} == snapshot


def test_ratio_refuses_a_non_empty_output_without_manifest(tmp_path: Path) -> None:
    data = write_json(tmp_path / "items.json", rows(10))
    out = tmp_path / "out"
    keep = write_json(out / "notes.json", {"mine": True})
    with pytest.raises(DataError, match="not overwritten"):
        load_splits(ratio_spec(data, out), benchmark="qa")
    assert json.loads(keep.read_text(encoding="utf-8")) == {"mine": True}


def test_ratio_detects_edited_split_files(tmp_path: Path) -> None:
    data = write_json(tmp_path / "items.json", rows(10))
    out = tmp_path / "out"
    load_splits(ratio_spec(data, out), benchmark="qa")
    items = json.loads((out / "test" / "items.json").read_text(encoding="utf-8"))
    write_json(out / "test" / "items.json", items[1:])
    with pytest.raises(DataError, match="ids do not match"):
        load_splits(ratio_spec(data, out), benchmark="qa")


def test_ratio_counts_drops_in_the_manifest(tmp_path: Path) -> None:
    data = write_json(tmp_path / "items.json", [*rows(10), {"id": "bad1"}, {"id": "bad2"}])

    def normalise(row: dict[str, Any]) -> dict[str, Any]:
        if "question" not in row:
            raise DropRow("no_question")
        return row

    splits = load_splits(ratio_spec(data, tmp_path / "out"), benchmark="b", normalise=normalise)
    assert splits.counts == {"train": 2, "val": 1, "test": 7}
    assert splits.dropped == {"no_question": 2} and splits.manifest is not None
    assert splits.manifest["dropped"] == {"no_question": 2}


def test_ratio_duplicate_ids_name_both_rows(tmp_path: Path) -> None:
    data = write_json(tmp_path / "items.json", [*rows(9), {"id": "q 3"}, {"id": "q-3"}])
    with pytest.raises(DataError) as err:
        load_splits(ratio_spec(data, tmp_path / "out"), benchmark="qa")
    message = str(err.value)
    assert "'q 3'" in message and "'q-3'" in message and "row 10" in message and "row 11" in message
    assert not (tmp_path / "out").exists()


def test_ratio_too_few_items_for_val_is_an_error_before_writing(tmp_path: Path) -> None:
    data = write_json(tmp_path / "items.json", rows(4))
    with pytest.raises(DataError, match="train=1, val=0, test=3"):
        load_splits(ratio_spec(data, tmp_path / "out"), benchmark="qa")
    assert not (tmp_path / "out").exists()


def test_ratio_needs_data_path_and_a_valid_ratio(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ratio mode needs data_path"):
        load_splits(SplitSpec(split_mode="ratio", data_path="", split_output_dir=tmp_path), benchmark="qa")
    data = write_json(tmp_path / "items.json", rows(10))
    with pytest.raises(ConfigError, match=r"benchmark\.split_ratio"):
        load_splits(ratio_spec(data, tmp_path / "out", split_ratio="2-1-7"), benchmark="qa")


def test_ratio_on_a_split_dir_suggests_split_dir_mode(tmp_path: Path) -> None:
    root = make_split_dir(tmp_path / "data")
    with pytest.raises(DataError, match="split_dir"):
        load_splits(ratio_spec(root, tmp_path / "out"), benchmark="qa")


def test_ratio_accepts_a_benchmark_partition_and_manifest_extras(tmp_path: Path) -> None:
    data = write_json(
        tmp_path / "items.json", [{**r, "repo": "a" if i < 3 else "b"} for i, r in enumerate(rows(6))]
    )

    def by_repo(items: list[Item], spec: SplitSpec) -> dict[str, list[Item]]:
        return {
            "train": [i for i in items if i["repo"] == "a"],
            "val": [i for i in items if i["repo"] == "b"],
        }

    splits = load_splits(
        ratio_spec(data, tmp_path / "out"),
        benchmark="swebench",
        partition=by_repo,
        manifest_extra={"strategy": "stratified_by_repo"},
    )
    assert splits.counts == {"train": 3, "val": 3, "test": 0}
    assert splits.manifest is not None and splits.manifest["strategy"] == "stratified_by_repo"


def test_default_output_dir_is_under_the_run_dir(tmp_path: Path) -> None:
    spec = SplitSpec(split_mode="ratio", data_path="x.jsonl", split_ratio="2:1:7", split_seed=5)
    expected = tmp_path / "run" / "splits" / "qa_2-1-7_seed5"
    assert default_split_output_dir(tmp_path / "run", "qa", "2:1:7", 5) == expected
    assert split_output_dir(spec, run_dir=tmp_path / "run", benchmark="qa") == expected
    own = spec.model_copy(update={"split_output_dir": tmp_path / "mine"})
    assert split_output_dir(own, run_dir=tmp_path / "run", benchmark="qa") == tmp_path / "mine"

    data = write_json(tmp_path / "x.json", rows(10))
    splits = load_splits(spec.model_copy(update={"data_path": data}), benchmark="qa", out_dir=expected)
    assert splits.out_dir == expected and (expected / "split_manifest.json").is_file()


def test_split_spec_reads_a_benchmark_config_section() -> None:
    spec = SplitSpec.model_validate(
        {"name": "qa", "split_mode": "ratio", "data_path": "d.jsonl", "workers": 4}
    )
    assert spec.data_path == Path("d.jsonl") and spec.split_dir is None and spec.split_seed == 42
    unset = SplitSpec.from_benchmark_config({"split_mode": None, "split_dir": ""}, default_split_mode="ratio")
    assert unset.split_mode == "ratio" and unset.split_dir is None
    chosen = SplitSpec.from_benchmark_config({"split_mode": "split_dir"}, default_split_mode="ratio")
    assert chosen.split_mode == "split_dir"


# --------------------------------------------------------------------------------------- generated


def test_generated_mode_builds_the_same_splits_for_the_same_seed() -> None:
    calls: list[int] = []

    def generate(seed: int) -> dict[str, list[dict[str, Any]]]:
        calls.append(seed)
        return {
            name: [{"id": f"{name}:{seed}:{i}", "x": i} for i in range(2)]
            for name in ("train", "val", "test")
        }

    spec = SplitSpec(split_mode="generated", split_seed=3)
    first = load_splits(spec, benchmark="demo", generate=generate, default_task_type="arith")
    second = load_splits(spec, benchmark="demo", generate=generate, default_task_type="arith")
    assert calls == [3, 3]
    assert first.train == second.train and first.source_sha256 == second.source_sha256
    assert first.ids("train") == ["train-3-0", "train-3-1"] and first.train[0].task_type == "arith"
    assert set(first.files.values()) == {None}


def test_generated_mode_is_a_config_error_for_other_benchmarks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'qa'"):
        load_splits(SplitSpec(split_mode="generated"), benchmark="qa")


# ---------------------------------------------------------------------------------- epoch planning


def test_steps_per_epoch_rounds_up() -> None:
    assert steps_per_epoch(10, 4, 1) == 3
    assert steps_per_epoch(10, 4, 2) == 2
    assert steps_per_epoch(8, 4, 2) == 1
    with pytest.raises(ConfigError, match=r"train\.batch_size"):
        steps_per_epoch(10, 0, 1)
    with pytest.raises(ConfigError, match=r"train\.accumulation"):
        steps_per_epoch(10, 4, 0)


def test_plan_epoch_shuffles_with_the_epoch_seed_and_walks_consecutive_batches() -> None:
    ids = [f"i{n}" for n in range(10)]
    plan = plan_epoch(ids, seed=42, epoch=2, batch_size=4, accumulation=1)

    order = list(ids)
    random.Random(42 + 2000).shuffle(order)
    assert [b.item_ids for b in plan.batches] == [order[0:4], order[4:8], order[8:10]]  # last stays partial
    assert [b.seed for b in plan.batches] == [2043, 2044, 2045]
    assert [b.index for b in plan.batches] == [0, 1, 2]
    assert [len(s.batches) for s in plan.steps] == [1, 1, 1]


def test_plan_epoch_is_deterministic_and_differs_between_epochs() -> None:
    ids = [f"i{n}" for n in range(30)]
    a = plan_epoch(ids, seed=1, epoch=1, batch_size=4, accumulation=3)
    b = plan_epoch(list(ids), seed=1, epoch=1, batch_size=4, accumulation=3)
    c = plan_epoch(ids, seed=1, epoch=2, batch_size=4, accumulation=3)
    assert a == b and a.model_dump_json() == b.model_dump_json()
    assert a.batches[0].item_ids != c.batches[0].item_ids
    assert EpochPlan.model_validate_json(a.model_dump_json()) == a


def test_plan_epoch_groups_accumulation_batches_into_steps() -> None:
    ids = [f"i{n}" for n in range(24)]
    plan = plan_epoch(ids, seed=0, epoch=1, batch_size=4, accumulation=3)
    assert len(plan.steps) == steps_per_epoch(24, 4, 3) == 2
    for j, step in enumerate(plan.steps):
        assert step.index == j
        assert [b.index for b in step.batches] == [j * 3, j * 3 + 1, j * 3 + 2]
    assert sorted(plan.steps[0].item_ids + plan.steps[1].item_ids) == sorted(ids)  # one exact pass


def test_plan_epoch_refills_from_a_reshuffle_with_the_batch_seed() -> None:
    ids = [f"i{n}" for n in range(10)]
    plan = plan_epoch(ids, seed=5, epoch=1, batch_size=4, accumulation=2)
    # ceil(10 / 8) = 2 steps × 2 batches; the first pass gives 4, 4, 2 and batch 3 refills
    assert [len(b.item_ids) for b in plan.batches] == [4, 4, 2, 4]
    first_pass = [i for b in plan.batches[:3] for i in b.item_ids]
    assert sorted(first_pass) == sorted(ids)
    refill = list(ids)
    random.Random(5 + 1000 + 3 + 1).shuffle(refill)
    assert plan.batches[3].seed == 1009 and plan.batches[3].item_ids == refill[:4]
    assert [b.item_ids for b in plan.steps[1].batches] == [plan.batches[2].item_ids, refill[:4]]


@given(
    n=st.integers(min_value=1, max_value=60),
    batch_size=st.integers(min_value=1, max_value=12),
    accumulation=st.integers(min_value=1, max_value=4),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_plan_epoch_covers_every_train_item_exactly_once_before_any_refill(
    n: int, batch_size: int, accumulation: int, seed: int
) -> None:
    ids = [f"i{k}" for k in range(n)]
    plan = plan_epoch(ids, seed=seed, epoch=1, batch_size=batch_size, accumulation=accumulation)
    walked = [i for b in plan.batches for i in b.item_ids]
    assert sorted(walked[:n]) == sorted(ids)
    assert len(plan.batches) == steps_per_epoch(n, batch_size, accumulation) * accumulation
    assert [b.seed for b in plan.batches] == [seed + 1000 + k + 1 for k in range(len(plan.batches))]


def test_plan_epoch_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="1-based"):
        plan_epoch(["a"], seed=0, epoch=0, batch_size=1, accumulation=1)
    with pytest.raises(DataError, match="empty"):
        plan_epoch([], seed=0, epoch=1, batch_size=1, accumulation=1)
    with pytest.raises(DataError, match="repeat"):
        plan_epoch(["a", "a"], seed=0, epoch=1, batch_size=1, accumulation=1)


def test_check_train_size() -> None:
    assert check_train_size(0, 37) == 37
    assert check_train_size(37, 37) == 37
    with pytest.raises(ConfigError) as err:
        check_train_size(40, 37)
    assert "train.train_size" in str(err.value) and "40" in str(err.value) and "37" in str(err.value)


def test_small_splits_are_named_with_their_sizes_and_the_ratio_to_set():
    from skillopt.core.data import small_split_warning

    warning = small_split_warning({"train": 2, "val": 1, "test": 9}, min_items=10, split_mode="ratio",
                                  split_ratio="2:1:7")
    assert warning == ("small splits: train 2, val 1, test 9 item(s), fewer than evaluation.min_split_items "
                       "(10); scores on so few items are noisy: set benchmark.split_ratio (now 2:1:7, "
                       "train:val:test) to give them more items, or add data")
    folders = small_split_warning({"train": 30, "val": 3, "test": 30}, min_items=10, split_mode="split_dir",
                                  split_ratio="2:1:7")
    assert "add items to those splits" in folders
    assert small_split_warning({"train": 10, "val": 10, "test": 10}, min_items=10, split_mode="ratio",
                               split_ratio="2:1:7") is None
    assert small_split_warning({"train": 1, "val": 1, "test": 1}, min_items=0, split_mode="ratio",
                               split_ratio="2:1:7") is None


def test_data_of_split_folders_names_the_missing_one(tmp_path: Path) -> None:
    from skillopt.core.data import data_overrides

    for split in ("train", "val"):
        (tmp_path / split).mkdir()
    with pytest.raises(ConfigError, match=r"split folders needs train/, val/ and test/; missing test/$"):
        data_overrides(tmp_path)
    (tmp_path / "test").mkdir()
    assert "benchmark.split_mode=split_dir" in data_overrides(tmp_path)


def test_a_json_message_ending_in_at_is_not_given_a_second_at(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"malformed JSON \(Unterminated string starting at column 29\)$"):
        read_records(bad)
