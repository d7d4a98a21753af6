"""Paths taken from data stay inside the benchmark's data root, and items have a size limit.

Each test copies a fixture folder, plants a hostile row the way a user's data could hold it, and
loads it through the real plug-in as ``skillopt train <id> --data <copy>`` would: the load stops
with an error naming the file, the row and the field, before any byte of the named file is read.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from skillopt.benchmarks.base import load_benchmark
from skillopt.benchmarks.rows import confined_path
from skillopt.core.errors import DataError
from tests.fakes.benchmark_target import FIXTURES_ROOT, fixture_config_of

SPLITS = ("train", "val", "test")


def copy_fixtures(name: str, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(FIXTURES_ROOT / name, data)
    return data


def load_all(name: str, data: Path, run_dir: Path, overrides: tuple[str, ...] = ()) -> None:
    plugin = load_benchmark(name)
    config = fixture_config_of(plugin, overrides, data=data)
    for split in SPLITS:
        plugin.load_split(config, split, run_dir=run_dir)


def rewrite_csv_cell(path: Path, column: str, value: str) -> None:
    import csv

    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[0][column] = value
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("hostile", ["/etc/passwd", "ABSOLUTE_KEY", "../../x.png", "SYMLINK"])
def test_a_docvqa_image_path_leaving_the_data_root_is_rejected_naming_file_row_and_field(hostile, tmp_path):
    data = copy_fixtures("docvqa", tmp_path)
    outside = tmp_path / "secret" / "id_rsa"
    outside.parent.mkdir()
    outside.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    if hostile == "ABSOLUTE_KEY":
        hostile = str(outside)
    if hostile == "SYMLINK":
        (data / "images" / "innocent.png").symlink_to(outside)
        hostile = "images/innocent.png"
    csv_file = data / "train" / "q.csv"
    rewrite_csv_cell(csv_file, "image_path", hostile)
    with pytest.raises(DataError) as caught:
        load_all("docvqa", data, tmp_path / "run")
    message = str(caught.value)
    assert str(csv_file) in message and "row 1" in message and "'image_path'" in message
    assert "outside the benchmark's data root" in message


def test_no_byte_of_an_outside_file_is_read(tmp_path):
    """The outside "image" is a FIFO with no writer: opening it for reading would block, so a load
    that returns (with the error) read nothing from it."""
    data = copy_fixtures("docvqa", tmp_path)
    fifo = tmp_path / "outside.png"
    os.mkfifo(fifo)
    rewrite_csv_cell(data / "train" / "q.csv", "image_path", str(fifo))
    outcome: dict[str, BaseException] = {}

    def load() -> None:
        try:
            load_all("docvqa", data, tmp_path / "run")
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = error

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():  # unblock the reader so the thread can end, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("loading opened the FIFO outside the data root")
    assert isinstance(outcome.get("error"), DataError)
    assert "outside the benchmark's data root" in str(outcome["error"])


def test_mmrb_babyvision_and_mathverse_reject_a_symlinked_image_leaving_the_root(tmp_path):
    outside = tmp_path / "outside.png"
    shutil.copy(FIXTURES_ROOT / "docvqa" / "images" / "q90001_d7001.png", outside)
    for name, image in (("mmrb", "s0_1.png"), ("babyvision", "101.png"), ("mathverse", None)):
        data = copy_fixtures(name, tmp_path / name)
        target = image or sorted(p.name for p in (data / "images").iterdir())[0]
        (data / "images" / target).unlink()
        (data / "images" / target).symlink_to(outside)
        with pytest.raises(DataError, match="outside the benchmark's data root"):
            load_all(name, data, tmp_path / name / "run")


def test_spreadsheetbench_and_alfworld_reject_paths_leaving_the_root(tmp_path):
    data = copy_fixtures("spreadsheetbench", tmp_path / "sheets")
    items = json.loads((data / "train" / "items.json").read_text())
    items[0]["spreadsheet_path"] = "/etc"
    (data / "train" / "items.json").write_text(json.dumps(items))
    with pytest.raises(DataError, match=r"row 1: field 'spreadsheet_path': '/etc'"):
        load_all("spreadsheetbench", data, tmp_path / "sheets" / "run")

    data = copy_fixtures("alfworld", tmp_path / "games")
    items = json.loads((data / "train" / "items.json").read_text())
    items[0]["gamefile"] = "../../" + items[0]["gamefile"]
    (data / "train" / "items.json").write_text(json.dumps(items))
    with pytest.raises(DataError, match=r"row 1: field 'gamefile'.*outside the benchmark's data root"):
        load_all("alfworld", data, tmp_path / "games" / "run", ("benchmark.env_manager=fake",))


def test_swebench_rejects_a_repository_name_that_is_a_path(tmp_path):
    data = copy_fixtures("swebench", tmp_path)
    items = json.loads((data / "train" / "items.json").read_text())
    items[0]["repo"] = "../../etc"
    (data / "train" / "items.json").write_text(json.dumps(items))
    with pytest.raises(DataError, match=r"row 1: field 'repo' must be 'owner/name'"):
        load_all("swebench", data, tmp_path / "run",
                 ("benchmark.harness=fake", "benchmark.agent_runner=fake"))


def test_confined_path_keeps_paths_inside_the_roots_and_follows_symlinks(tmp_path):
    root = tmp_path / "root"
    (root / "images").mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(b"png")
    (root / "link.png").symlink_to(root / "images" / "a.png")  # a link that stays inside is fine
    real = (root / "images" / "a.png").resolve()
    assert confined_path("images/a.png", [root], field="image") == real
    assert confined_path(str(real), [root], field="image") == real
    assert confined_path("link.png", [root], field="image") == real
    assert confined_path("images/../images/a.png", [root], field="image") == real
    assert confined_path("images/missing.png", [root], field="image") is None
    for hostile in ("/etc/passwd", "../outside.png", "images/../../outside.png"):
        with pytest.raises(ValueError, match="field 'image'"):
            confined_path(hostile, [root], field="image")
    with pytest.raises(ValueError, match="none given"):
        confined_path(str(real), [], field="image")


def test_an_item_over_max_item_chars_is_a_load_error_and_the_limit_is_a_setting(tmp_path):
    data = tmp_path / "qa"
    for split in SPLITS:
        (data / split).mkdir(parents=True)
        rows = [{"id": f"{split}-1", "question": "Q?", "answer": "A"}]
        (data / split / "items.json").write_text(json.dumps(rows))
    huge = [{"id": "big", "question": "x" * 250_000, "answer": "A"}]
    (data / "train" / "items.json").write_text(json.dumps(huge))
    with pytest.raises(DataError) as caught:
        load_all("qa", data, tmp_path / "run")
    message = str(caught.value)
    assert "row 1" in message and "items.json" in message and "max_item_chars (200000)" in message
    load_all("qa", data, tmp_path / "run2", ("benchmark.max_item_chars=300000",))
