"""The data scripts in scripts/: invented Hugging Face rows go through their
pure conversion functions, and the folders they write load through the real ``searchqa`` and
``babyvision`` plug-ins. The download functions need the network and are never called with it here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from skillopt.benchmarks.base import load_benchmark
from tests.fakes.benchmark_target import FIXTURES_ROOT, fixture_config_of, items_by_id

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
PNG = (FIXTURES_ROOT / "babyvision" / "images" / "101.png").read_bytes()
KEYS = [f"{n:x}" * 32 for n in range(1, 6)]  # 32 hex characters, like the HF ``key``


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (the scripts are not part of the installed package)."""
    module_name = f"skillopt_scripts_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, SCRIPTS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules[module_name]


@pytest.fixture(scope="module")
def searchqa_script() -> ModuleType:
    return load_script("materialize_searchqa")


@pytest.fixture(scope="module")
def babyvision_script() -> ModuleType:
    return load_script("download_babyvision")


# ------------------------------------------------------------------------------------------ searchqa


def hf_searchqa_row(key: str, n: int) -> dict[str, Any]:
    """A row shaped like ``lucadiliello/searchqa``: context, question, answers, key, labels."""
    return {
        "context": f"[DOC] [TLE] Title {n} [PAR] Snippet number {n}. [DOC] [TLE] Other [PAR] More text.",
        "question": f"Clue number {n}",
        "answers": [f"answer {n}", ""],
        "key": key,
        "labels": [{"start": [0], "end": [3]}],
    }


def test_searchqa_manifest_rows_become_split_folders_the_plugin_loads_in_manifest_order(
    searchqa_script, tmp_path
):
    manifest_file = tmp_path / "ids.json"
    manifest_file.write_text(json.dumps({"train": [KEYS[2], KEYS[0]], "val": [KEYS[3]], "test": [KEYS[1]]}))
    rows = [hf_searchqa_row(key, n) for n, key in enumerate(KEYS)]  # KEYS[4] is not in the manifest
    progress: list[str] = []
    splits = searchqa_script.materialize(searchqa_script.read_manifest(manifest_file), iter(rows),
                                         progress=progress.append)
    out = tmp_path / "searchqa_split"
    searchqa_script.write_splits(splits, out, progress=progress.append)

    assert progress[0] == "read 5 HF rows, matched 4/4 ids" and "wrote 2 items" in progress[1]
    written = json.loads((out / "train" / "items.json").read_text(encoding="utf-8"))
    assert written == [
        {"id": KEYS[2], "question": "Clue number 2", "context": rows[2]["context"], "answers": ["answer 2"]},
        {"id": KEYS[0], "question": "Clue number 0", "context": rows[0]["context"], "answers": ["answer 0"]},
    ]
    plugin = load_benchmark("searchqa")
    config = fixture_config_of(plugin, data=out)
    plugin.preflight(config)
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert {split: [item.id for item in items] for split, items in loaded.items()} == {
        "train": [KEYS[2], KEYS[0]], "val": [KEYS[3]], "test": [KEYS[1]],
    }
    item = loaded["val"][0]
    assert (item.task_type, item["answers"], item["question"]) == ("qa", ["answer 3"], "Clue number 3")
    assert plugin.score(item, "<answer>Answer 3</answer>", None).hard == 1.0


def test_searchqa_accepts_the_ids_of_a_ratio_split_manifest(searchqa_script):
    manifest = searchqa_script.parse_manifest(
        {"split_mode": "ratio", "ids": {"train": [KEYS[0]], "val": [KEYS[1]], "test": []}}
    )
    assert manifest == {"train": [KEYS[0]], "val": [KEYS[1]], "test": []}


def test_searchqa_rejects_a_manifest_id_listed_twice_naming_the_id_and_its_splits(searchqa_script):
    with pytest.raises(searchqa_script.MaterializeError, match=rf"1 id\(s\) listed more than once: {KEYS[1]} "
                                                               r"\(train and test\)"):
        searchqa_script.parse_manifest({"train": [KEYS[0], KEYS[1]], "val": [KEYS[2]], "test": [KEYS[1]]})
    with pytest.raises(searchqa_script.MaterializeError, match="no id list for split.*test"):
        searchqa_script.parse_manifest({"train": [KEYS[0]], "val": [KEYS[1]]})


def test_searchqa_rejects_ids_no_hf_row_has_and_ids_two_rows_share(searchqa_script, tmp_path):
    manifest = {"train": [KEYS[0], KEYS[3]], "val": [KEYS[1]], "test": [KEYS[4]]}
    rows = [hf_searchqa_row(KEYS[n], n) for n in (0, 1)]
    with pytest.raises(searchqa_script.MaterializeError,
                       match=rf"2 manifest id\(s\) are in no HF row: {KEYS[3]}, {KEYS[4]}$"):
        searchqa_script.materialize(manifest, rows)
    rows += [hf_searchqa_row(KEYS[n], n) for n in (3, 4, 1)]
    with pytest.raises(searchqa_script.MaterializeError, match=rf"match more than one HF row: {KEYS[1]}$"):
        searchqa_script.materialize(manifest, rows)
    bad = [rows[0], {**rows[1], "answers": [" "]}, *rows[2:4]]  # rows 0-3: keys 0, 1, 3 and 4 once each
    with pytest.raises(searchqa_script.MaterializeError, match=rf"HF row {KEYS[1]}: .*no non-empty answer"):
        searchqa_script.materialize(manifest, bad)


def test_searchqa_cli_help_and_a_bad_manifest_exit_cleanly_without_the_network(
    searchqa_script, tmp_path, capsys
):
    with pytest.raises(SystemExit) as help_exit:
        searchqa_script.main(["--help"])
    assert help_exit.value.code == 0 and "--manifest" in capsys.readouterr().out
    manifest_file = tmp_path / "ids.json"
    manifest_file.write_text('{"train": ["a", "a"], "val": ["b"], "test": ["c"]}')
    assert searchqa_script.main(["--manifest", str(manifest_file), "--out_dir", str(tmp_path / "out")]) == 1
    assert "listed more than once: a (train and train)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_searchqa_download_without_datasets_names_the_package_to_install(searchqa_script, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets now raises ImportError
    with pytest.raises(searchqa_script.MaterializeError, match="pip install datasets"):
        next(searchqa_script.download_rows())


# ---------------------------------------------------------------------------------------- babyvision


class FakeImage:
    """What ``datasets`` gives for an Image feature, as far as the script uses it: ``save(fp, format)``."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.formats: list[str | None] = []

    def save(self, fp: Any, format: str | None = None) -> None:
        self.formats.append(format)
        if isinstance(fp, str | Path):
            Path(fp).write_bytes(self.data)
        else:
            fp.write(self.data)


def hf_babyvision_rows() -> list[dict[str, Any]]:
    """Rows shaped like ``UnipatAI/BabyVision``: a decoded image, PNG bytes, an undecoded image, none."""
    common = {"type": "Visual Tracking", "coT": "Trace it."}
    return [
        {"taskId": 7, "question": "Which exit?", "image": FakeImage(PNG), "ansType": "choice",
         "options": ["left", "right"], "choiceAns": 1, "blankAns": None, "subtype": "Maze", **common},
        {"taskId": 8, "question": "How many dots?", "image": PNG, "ansType": "blank", "options": [],
         "choiceAns": None, "blankAns": "5", "subtype": "Count", **common},
        {"taskId": 9, "question": "Odd one out?", "image": None, "ansType": "choice", "options": ["a", "b"],
         "choiceAns": 0, "blankAns": None, "subtype": "Find the different", **common},
        {"taskId": 10, "question": "Which line?", "image": {"bytes": PNG, "path": None}, "ansType": "choice",
         "options": ["A", "B", "C"], "choiceAns": "C", "blankAns": None, "subtype": "Maze", **common},
    ]


def test_babyvision_rows_become_images_and_meta_data_the_plugin_reads_in_ratio_mode(
    babyvision_script, tmp_path
):
    rows = hf_babyvision_rows()
    out = tmp_path / "babyvision"
    progress: list[str] = []
    summary = babyvision_script.write_babyvision(rows, out, progress=progress.append)

    assert (summary.written, summary.skipped_without_image) == (3, 1)
    assert "skipped 1 row(s) without an image" in progress[-1] and rows[0]["image"].formats == ["PNG"]
    assert sorted(p.name for p in (out / "images").iterdir()) == ["10.png", "7.png", "8.png"]
    meta = [json.loads(line) for line in (out / "meta_data.jsonl").read_text(encoding="utf-8").splitlines()]
    assert meta[1] == {**rows[1], "image": "8.png"}  # every field kept, image replaced by the file name
    assert [row["image"] for row in meta] == ["7.png", "8.png", "10.png"]

    plugin = load_benchmark("babyvision")
    config = fixture_config_of(plugin, ["benchmark.split_ratio=1:1:1"], data=out)
    assert config.split_mode == "ratio"
    plugin.preflight(config)
    items = items_by_id(plugin, config, tmp_path / "run")
    assert sorted(items) == ["10", "7", "8"]
    assert items["7"]["correct_choice"] == {"label": "B", "text": "right"}
    assert items["8"]["blank_answers"] == ["5"] and items["10"]["correct_choice"]["label"] == "C"
    for task_id, item in items.items():
        assert Path(item["image_path"]) == (out / "images" / f"{task_id}.png").resolve()
        assert Path(item["image_path"]).read_bytes() == PNG
    _, user = plugin.build_messages(items["7"], "", config)
    assert user.content[-1].type == "image" and user.content[-1].name == "7.png"


def test_babyvision_rejects_a_repeated_task_id_and_rows_that_are_all_without_images(
    babyvision_script, tmp_path
):
    rows = hf_babyvision_rows()
    with pytest.raises(
        babyvision_script.DownloadError, match=r"row 3 \(taskId 7\): taskId 7 is also row 1's"
    ):
        babyvision_script.write_babyvision([rows[0], rows[1], {**rows[1], "taskId": 7}], tmp_path / "dup")
    with pytest.raises(babyvision_script.DownloadError, match="none of the 1 rows has an image"):
        babyvision_script.write_babyvision([rows[2]], tmp_path / "empty")
    with pytest.raises(babyvision_script.DownloadError, match="row 1: no taskId"):
        babyvision_script.write_babyvision(
            [{k: v for k, v in rows[0].items() if k != "taskId"}], tmp_path / "x"
        )
    assert not (tmp_path / "dup" / "meta_data.jsonl").exists()


def test_babyvision_image_values_it_cannot_save_are_clear_errors(babyvision_script, monkeypatch):
    with pytest.raises(babyvision_script.DownloadError, match=r"row 2: field 'image' is a int"):
        babyvision_script.png_bytes(42, where="row 2")
    monkeypatch.setitem(sys.modules, "PIL", None)  # JPEG bytes need Pillow to become a PNG
    with pytest.raises(
        babyvision_script.DownloadError, match="row 3: the image is not a PNG.*pip install pillow"
    ):
        babyvision_script.png_bytes(b"\xff\xd8\xff\xe0 jpeg", where="row 3")


def test_babyvision_cli_help_and_missing_packages_without_the_network(babyvision_script, monkeypatch, capsys,
                                                                      tmp_path):
    with pytest.raises(SystemExit) as help_exit:
        babyvision_script.main(["--help"])
    assert help_exit.value.code == 0 and "--out_dir" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "datasets", None)
    monkeypatch.setitem(sys.modules, "PIL", None)
    assert babyvision_script.main(["--out_dir", str(tmp_path / "bv")]) == 1
    assert "needs datasets and pillow: pip install datasets pillow" in capsys.readouterr().err
    assert not (tmp_path / "bv").exists()
