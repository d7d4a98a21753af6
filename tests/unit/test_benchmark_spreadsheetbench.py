"""The ``spreadsheetbench`` benchmark.

Items and workbooks come from tests/fixtures/spreadsheetbench (written by its ``make_fixtures.py``);
the target is the real ``scripted`` backend answering from the fixture folder's ``scripted_rules.yaml``; every
script runs through the real sandbox.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from openpyxl import load_workbook

from skillopt.benchmarks.base import (
    Benchmark,
    BenchmarkSetupError,
    EpisodeContext,
    RolloutInfrastructureError,
    benchmark_config,
)
from skillopt.benchmarks.runner import check_infrastructure, error_row, run_item
from skillopt.benchmarks.spreadsheetbench import (
    SpreadsheetBenchConfig,
    execute,
    extract_code,
    normalise_row,
    plugin,
    prepare_script,
)
from skillopt.benchmarks.spreadsheetbench.cells import cells_equal, find_test_cases, split_ranges
from skillopt.core.config import load_config
from skillopt.core.data import Item
from skillopt.llm.errors import ServerError
from skillopt.llm.scripted import parse_rules
from skillopt.optimizer.trajectory import format_trajectory
from skillopt.sandbox import process_group
from tests.fakes.benchmark_target import PluginScriptedTarget, fixture_config_of, fixture_rules, items_by_id
from tests.processes import exit_while_making

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "spreadsheetbench"
ORDERS, SORT, COUNT = "59001", "59002", "59003-1"


def fixture_config(**overrides: Any) -> SpreadsheetBenchConfig:
    """The config of ``skillopt train spreadsheetbench --data tests/fixtures/spreadsheetbench -o
    benchmark.<k>=<v>``."""
    config = fixture_config_of(plugin, [f"benchmark.{key}={value}" for key, value in overrides.items()])
    assert isinstance(config, SpreadsheetBenchConfig)
    return config


def fixture_items(tmp_path: Path, **overrides: Any) -> dict[str, Item]:
    config = fixture_config(**overrides)
    return items_by_id(plugin, config, tmp_path)


class ScriptedTarget(PluginScriptedTarget):
    """The ``target`` role as the runner uses it: the real scripted backend with this plug-in's rules."""

    def __init__(self, rules: Any = None) -> None:
        super().__init__(plugin, rules)


def script(code: str) -> str:
    return f"Here is the script.\n```python\n{code}\n```\nDone."


def reply_rules(code: str) -> list[dict[str, Any]]:
    return [{"stage": "rollout", "text": script(code)}]


def golden_changes(item: Item) -> list[tuple[str, Any]]:
    """The values a golden workbook holds where case 1's input differs: what the target must produce."""
    case = find_test_cases(Path(item["task_dir"]))[0]
    given, gold = load_workbook(case.input_path), load_workbook(case.golden_path)
    changed = []
    for sheet in gold.worksheets:
        for row in sheet.iter_rows():
            for cell in row:
                if cell.value is not None and given[sheet.title][cell.coordinate].value != cell.value:
                    changed.append((cell.coordinate, cell.value))
    return changed


def episode(item: Item, target: ScriptedTarget, config: SpreadsheetBenchConfig, *, training: bool):
    events: list[dict[str, Any]] = []
    ctx = EpisodeContext(target=target, messages=plugin.build_messages(item, "", config), cfg=config,
                         record=events.append, deadline=time.monotonic() + 120,
                         tags={"item_id": item.id, "training": training})
    return plugin.run_episode(item, "", ctx), events


LOOP = """import openpyxl
wb = openpyxl.load_workbook(INPUT_PATH)
ws = wb.active
for r in range(2, ws.max_row + 1):
    ws.cell(row=r, column=4).value = ws.cell(row=r, column=2).value * ws.cell(row=r, column=3).value
wb.save(OUTPUT_PATH)"""
FORMULA = """import openpyxl
wb = openpyxl.load_workbook(INPUT_PATH)
ws = wb.active
for r in range(2, ws.max_row + 1):
    ws.cell(row=r, column=4).value = f"=B{r}*C{r}"
wb.save(OUTPUT_PATH)"""
HARD_CODED = """import openpyxl
wb = openpyxl.load_workbook(INPUT_PATH)
ws = wb.active
ws["D2"], ws["D3"], ws["D4"] = 9, 10.5, 36
wb.save(OUTPUT_PATH)"""
WRONG_COLUMN = """import openpyxl
wb = openpyxl.load_workbook(INPUT_PATH)
ws = wb.active
for r in range(2, ws.max_row + 1):
    ws.cell(row=r, column=4).value = ws.cell(row=r, column=2).value + ws.cell(row=r, column=3).value
wb.save(OUTPUT_PATH)"""


# ------------------------------------------------------------------------------------ config, loading


def test_the_default_config_with_data_loads_and_passes_preflight(tmp_path):
    assert isinstance(plugin, Benchmark)
    config = fixture_config()
    assert (config.split_dir, config.data_root) == (str(FIXTURES), str(FIXTURES))
    assert (config.mode, config.max_turns, config.exec_timeout, config.code_timeout) == (
        "multi",
        30,
        600,
        120,
    )
    assert (config.sandbox_mem_mb, config.max_tokens, config.workers) == (2048, 16384, 24)
    plugin.preflight(config)
    items = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [[item.id for item in rows] for rows in items.values()] == [[ORDERS], [SORT], [COUNT]]
    assert [rows[0].task_type for rows in items.values()] == ["cell_level", "sheet_level", "cell_level"]
    assert plugin.task_types([]) == ["cell_level", "sheet_level"]
    assert Path(items["train"][0]["task_dir"]) == (FIXTURES / "spreadsheet" / ORDERS).resolve()


def test_the_shipped_config_keys_are_all_valid_for_the_plugin_config():
    config = benchmark_config(plugin, load_config("spreadsheetbench", env={}).config.benchmark)
    assert isinstance(config, SpreadsheetBenchConfig)
    assert (config.split_dir, config.data_root) == (
        "data/spreadsheetbench_split",
        "data/spreadsheetbench_verified_400",
    )


def test_missing_folders_fail_preflight_with_a_fix_it_message(tmp_path):
    with pytest.raises(BenchmarkSetupError, match="pass --data DIR"):
        plugin.preflight(SpreadsheetBenchConfig(split_dir=str(tmp_path / "nowhere")))
    with pytest.raises(BenchmarkSetupError, match="no data root"):
        plugin.preflight(SpreadsheetBenchConfig(split_dir=str(FIXTURES), data_root=str(tmp_path / "nowhere")))


def test_an_unknown_split_name_raises_listing_the_accepted_names(tmp_path):
    with pytest.raises(ValueError, match="accepted names: train, val, selection"):
        plugin.load_split(fixture_config(), "dev", run_dir=tmp_path)


def test_normalising_is_idempotent_and_defaults_the_spreadsheet_path():
    row = {"id": 7, "instruction": "Do it.", "answer_position": "A1", "instruction_type": "odd"}
    item = normalise_row(row)
    assert item["id"] == "7" and item["spreadsheet_path"] == "spreadsheet/7" and item["task_type"] == "other"
    assert normalise_row(item) == item
    with pytest.raises(KeyError):
        normalise_row({"id": "x", "instruction": "Do it."})


def test_ratio_output_round_trips_through_its_own_reader(tmp_path):
    out = tmp_path / "splits"
    config = SpreadsheetBenchConfig(split_mode="ratio", data_path=str(FIXTURES / "raw" / "items.json"),
                                    split_ratio="1:1:1", split_output_dir=str(out), data_root=str(FIXTURES))
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [len(rows) for rows in loaded.values()] == [1, 1, 1]
    again = SpreadsheetBenchConfig(split_mode="split_dir", split_dir=str(out), data_root=str(FIXTURES))
    for split, rows in loaded.items():
        written = json.loads((out / split / "items.json").read_text(encoding="utf-8"))
        assert all("task_dir" not in row for row in written)
        reread = plugin.load_split(again, split, run_dir=tmp_path)
        assert [{k: v for k, v in i.items() if k != "deny_read"} for i in reread] == \
               [{k: v for k, v in i.items() if k != "deny_read"} for i in rows]


# --------------------------------------------------------------------------- ranges and test cases


@pytest.mark.parametrize(
    ("position", "sheet", "expected"),
    [
        ("D2:D4", "Sheet1", [("Sheet1", "D2:D4")]),
        ("'Data'!A1:C6", None, [("Data", "A1:C6")]),
        ("B10", None, [(None, "B10")]),
        ("'My, sheet'!A1:B2,C3", "S", [("My, sheet", "A1:B2"), ("S", "C3")]),
        ("Sheet2!$A$1, B2:B3", "Sheet1", [("Sheet2", "A1"), ("Sheet1", "B2:B3")]),
    ],
)
def test_answer_positions_split_on_commas_outside_quotes(position, sheet, expected):
    assert split_ranges(position, sheet) == expected


def test_test_cases_are_found_in_all_three_naming_schemes(tmp_path):
    assert [c.number for c in find_test_cases(FIXTURES / "spreadsheet" / ORDERS)] == [1, 2]
    for names in (("1_x_input.xlsx", "1_x_answer.xlsx"), ("1_x_init.xlsx", "1_x_golden.xlsx"),
                  ("initial.xlsx", "golden.xlsx")):
        folder = tmp_path / names[0]
        folder.mkdir()
        for name in names:
            (folder / name).write_bytes(b"")
        [case] = find_test_cases(folder)
        assert (case.input_path.name, case.golden_path.name) == names
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "1_x_input.xlsx").write_bytes(b"")
    assert find_test_cases(lone) == []


def test_an_item_without_test_cases_is_an_error_row(tmp_path):
    item = Item({**fixture_items(tmp_path)[ORDERS], "task_dir": str(tmp_path)})
    result = plugin.score(item, script(LOOP), None)
    assert (result.hard, result.soft, result.fail_reason) == (0.0, 0.0, "error: no test cases")


# ------------------------------------------------------------------------------------ cell compare


@pytest.mark.parametrize(
    ("got", "expected", "equal"),
    [
        (10.5, 10.5, True),
        (1, 1.004, True),  # both round to 1.0
        (1, 1.01, False),
        ("12", 12, True),  # numeric strings compare as numbers
        ("12.0", 12, True),
        ("01", 1, True),
        ("twelve", 12, False),
        (True, 1, True),  # bools are numbers in the official transform
        ("", None, True),  # empty string equals an empty cell
        (None, "", True),
        (None, 0, False),
        ("", 0, False),
        ("abc", "abc", True),
        ("abc", "ABC", False),
        (dt.datetime(2024, 1, 1, 9, 0), dt.datetime(2024, 1, 1), True),  # serials rounded to 0 decimals
        (dt.datetime(2024, 1, 1), 45292, True),  # a datetime becomes its Excel serial, as officially
        (dt.datetime(2024, 1, 2), dt.datetime(2024, 1, 1), False),
        (dt.date(2024, 1, 1), dt.datetime(2024, 1, 1), True),
        ("2024-01-01", dt.datetime(2024, 1, 1), False),  # a date written as text is wrong
        (dt.time(12, 30), "12:30", True),
        (dt.time(12, 30), dt.time(12, 31), False),
    ],
)
def test_cell_comparison_mirrors_the_official_rules(got, expected, equal):
    assert cells_equal(got, expected) is equal


# ------------------------------------------------------------------------------------------ prompts


def test_the_prompt_has_the_preview_and_the_skill_at_the_end_of_the_system_message(tmp_path):
    items = fixture_items(tmp_path)
    system, user = plugin.build_messages(items[SORT], "  Explore first.  ", fixture_config())
    assert system.text().endswith("## Skill\nExplore first.")
    assert (
        "INPUT_PATH" in system.text()
        and "OUTPUT_PATH" in system.text()
        and "openpyxl and pandas" in system.text()
    )
    text = user.text()
    order = [
        "# Instruction\nSort the table",
        "Sheet-Level Manipulation",
        "Expected answer position: 'Data'!A1:C6",
        "# Input spreadsheet preview",
        "## Sheet: Notes",
        "## Sheet: Data",
        "A2=Ann | B2=72 | C2=red",
        "... (1 more rows)",
        "# Task",
    ]
    assert [text.index(part) for part in order] == sorted(text.index(part) for part in order)
    assert "A6=" not in text  # only the first 5 rows
    assert "## Skill" not in plugin.build_messages(items[SORT], " \n", fixture_config())[0].text()


def test_no_prompt_names_a_golden_workbook_or_contains_a_new_gold_value(tmp_path):
    for item in fixture_items(tmp_path).values():
        text = "\n".join(m.text() for m in plugin.build_messages(item, "skill", fixture_config()))
        assert "golden" not in text.lower() and item["task_dir"] not in text
        for coordinate, value in golden_changes(item):
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            assert f"{coordinate}={shown}" not in text, (item.id, coordinate, value)


# ------------------------------------------------------------------------------------ execution


def test_the_harness_defines_the_paths_and_removes_the_targets_own_assignments():
    prepared = prepare_script("INPUT_PATH = '/home/me/in.xlsx'\nOUTPUT_PATH: str = (\n  'out.xlsx')\nx = 1\n")
    assert prepared.startswith("INPUT_PATH = 'input.xlsx'\nOUTPUT_PATH = 'output.xlsx'\n")
    assert "/home/me" not in prepared and "x = 1" in prepared
    assert prepare_script("def f(:\n") .endswith("def f(:\n")  # unparseable code is left to fail when run


def test_the_code_is_the_first_fenced_block_else_the_whole_reply():
    assert extract_code("a\n```python\nprint(1)\n```\n```python\nprint(2)\n```") == "print(1)"
    assert extract_code("```\nprint(3)\n```") == "print(3)"
    assert extract_code("print(4)\n") == "print(4)"


def test_the_workspace_holds_only_the_case_input_and_golden_files_are_unreachable(tmp_path):
    item = fixture_items(tmp_path)[ORDERS]
    case = find_test_cases(Path(item["task_dir"]))[0]
    listing = execute("import os; print(sorted(os.listdir('.')))", case.input_path, timeout_s=30, mem_mb=1024,
                      deny_read=item["deny_read"])
    assert listing.stdout.strip() == "['input.xlsx', 'solution.py']"
    peek = execute(f"print(open({str(case.golden_path)!r}, 'rb').read()[:4])", case.input_path, timeout_s=30,
                   mem_mb=1024, deny_read=item["deny_read"])
    assert not peek.ok and "sandbox refused reading" in peek.reason
    climb = execute("import os; print(os.listdir(os.path.dirname(os.path.realpath(INPUT_PATH)) + '/..'))",
                    case.input_path, timeout_s=30, mem_mb=1024, deny_read=item["deny_read"])
    assert "golden" not in climb.stdout


def test_an_exit_while_the_code_is_about_to_run_leaves_no_folder(tmp_path, monkeypatch):
    """Skillopt exits (Ctrl-C, SIGTERM, an error) while a rollout's workbook copy is made and the sandbox's
    own folder is being made: the clean-up at exit removes both, and a forced exit (``os._exit`` the moment
    that clean-up returns) leaves neither behind. The rollout stops without failing its item."""
    monkeypatch.setattr(process_group, "_exiting", False)  # restored after the test
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    item = fixture_items(tmp_path)[ORDERS]
    case = find_test_cases(Path(item["task_dir"]))[0]

    def run() -> None:
        execute("print('ran')", case.input_path, timeout_s=30, mem_mb=1024, deny_read=item["deny_read"])

    def folders() -> list[Path]:
        return sorted(temp.glob("skillopt-*"))

    left, raised = exit_while_making(monkeypatch, "skillopt-sandbox-", run, folders)
    assert left == [] and folders() == []
    assert len(raised) == 1 and isinstance(raised[0], process_group.Exiting), raised


# -------------------------------------------------------------------------------------- scoring


def test_a_script_that_loops_over_the_real_rows_passes_every_case(tmp_path):
    result = plugin.score(fixture_items(tmp_path)[ORDERS], script(LOOP), None)
    assert (result.hard, result.soft, result.fail_reason) == (1.0, 1.0, "")
    assert result.extras["cases"] == 2 and result.extras["passed"] == 2
    assert "Case 2: passed" in result.detail and "✓ Sheet1!D4" in result.detail


def test_formulas_read_back_as_none_and_the_verification_warns(tmp_path):
    result = plugin.score(fixture_items(tmp_path)[ORDERS], script(FORMULA), None)
    assert (result.hard, result.soft) == (0.0, 0.0)
    assert result.fail_reason == "wrong: value@Sheet1!D2 gt=9 pred=None"
    assert "⚠ formula =B2*C2 has no cached value" in result.detail


def test_hard_coding_case_one_values_passes_only_half_the_cases(tmp_path):
    result = plugin.score(fixture_items(tmp_path)[ORDERS], script(HARD_CODED), None)
    assert (result.hard, result.soft) == (0.0, 0.5)
    assert result.fail_reason.startswith("wrong: value@Sheet1!D2 gt=11.25 pred=9")


def test_a_socket_open_is_an_exec_error_row(tmp_path):
    code = "import socket\nsocket.create_connection(('example.com', 80), timeout=5)"
    result = plugin.score(fixture_items(tmp_path)[ORDERS], script(code), None)
    assert result.hard == 0.0 and result.fail_reason.startswith("error: exec sandbox refused socket.")


def test_a_sleep_past_code_timeout_is_an_exec_error_row_not_a_hang(tmp_path):
    item = fixture_items(tmp_path, code_timeout=1)[ORDERS]
    started = time.monotonic()
    result = plugin.score(item, script("import time\ntime.sleep(60)"), None)
    assert time.monotonic() - started < 20
    assert result.hard == 0.0
    assert result.fail_reason.startswith("error: exec time limit: the 1 s wall-clock limit")


def test_a_script_that_writes_no_output_is_output_not_found(tmp_path):
    result = plugin.score(fixture_items(tmp_path)[ORDERS], script("print('forgot to save')"), None)
    assert result.fail_reason == "error: output not found"


def test_a_missing_answer_sheet_fails_the_case(tmp_path):
    code = "import openpyxl\nwb = openpyxl.load_workbook(INPUT_PATH)\ndel wb['Data']\nwb.save(OUTPUT_PATH)"
    result = plugin.score(fixture_items(tmp_path)[SORT], script(code), None)
    assert result.hard == 0.0 and result.fail_reason == "wrong: sheet 'Data' missing from the output"


def test_an_empty_reply_is_a_no_answer_row(tmp_path):
    assert plugin.score(fixture_items(tmp_path)[ORDERS], "   ", None).fail_reason.startswith("no-answer:")


# ----------------------------------------------------------------------------------- multi mode


def test_multi_mode_feedback_lists_own_values_and_never_an_expected_one(tmp_path):
    item = fixture_items(tmp_path)[ORDERS]
    target = ScriptedTarget(reply_rules(WRONG_COLUMN))
    result, events = episode(item, target, fixture_config(max_turns=3), training=True)
    feedback = [e["content"] for e in events if e["type"] == "feedback"]
    # Round 2 repeats the same script, so the loop stops there instead of spending the budget.
    assert len(feedback) == 1 and result.n_turns == 2
    assert "Sheet1!D2: your value 6.25" in feedback[0]
    for _, value in golden_changes(item):
        assert f"{value:g}" not in feedback[0]
    assert "gt=" not in feedback[0] and "expected" not in feedback[0].lower()


def test_multi_mode_feeds_back_exec_errors_and_asks_again_without_code(tmp_path):
    item = fixture_items(tmp_path)[ORDERS]
    rules = [
        {"stage": "rollout", "user": "Your script failed", "text": script(LOOP)},
        {"stage": "rollout", "user": "had no Python code", "text": script("raise RuntimeError('boom')")},
        {"stage": "rollout", "text": ""},
    ]
    result, events = episode(item, ScriptedTarget(rules), fixture_config(max_turns=5), training=False)
    feedback = [e["content"] for e in events if e["type"] == "feedback"]
    assert feedback[0].startswith("Your reply had no Python code")
    assert "RuntimeError: boom" in feedback[1]
    assert len(feedback) == 2 and result.n_turns == 3  # a clean run on a val/test rollout stops the loop
    assert plugin.score(item, result.response_text, None).hard == 1.0


def test_single_mode_makes_one_call(tmp_path):
    item = fixture_items(tmp_path)[ORDERS]
    target = ScriptedTarget(reply_rules(WRONG_COLUMN))
    result, events = episode(item, target, fixture_config(mode="single"), training=True)
    assert result.n_turns == 1 and len(target.requests) == 1 and events[-1]["type"] == "message"


# ------------------------------------------------------------------------------- runner, scripted


def test_scripted_rules_solve_two_items_and_miss_the_formula_one_through_the_runner(tmp_path):
    target = ScriptedTarget()
    rows = {item_id: run_item(plugin, item, "", fixture_config(), target=target, judge=None,
                              tags={"training": item_id == ORDERS})
            for item_id, item in fixture_items(tmp_path).items()}
    assert {i: (r.hard, r.soft) for i, r in rows.items()} == {
        ORDERS: (1.0, 1.0),
        SORT: (1.0, 1.0),
        COUNT: (0.0, 0.0),
    }
    missed = rows[COUNT]
    assert missed.fail_reason == "wrong: value@Sheet1!B10 gt=4 pred=None" and missed.task_type == "cell_level"
    assert missed.trajectory[-1]["type"] == "evaluation" and "⚠ formula" in missed.trajectory[-1]["content"]
    assert all(r.n_turns == 1 and r.answered and r.phase == "done" for r in rows.values())
    assert "COUNTIF" in missed.predicted_answer


def test_a_target_that_always_raises_is_an_infrastructure_error(tmp_path):
    failing = ScriptedTarget(rules=[{"stage": "rollout", "error": "ServerError"}])
    rows = []
    for item in fixture_items(tmp_path).values():
        with pytest.raises(ServerError) as caught:
            run_item(plugin, item, "", fixture_config(), target=failing, judge=None)
        rows.append(error_row(item, caught.value))
    with pytest.raises(RolloutInfrastructureError, match="none of 3 items got a model answer"):
        check_infrastructure(rows, role_label="scripted/scripted")


def test_scripted_rules_are_valid_and_the_prompts_ship():
    assert len(parse_rules(list(fixture_rules(plugin)), where="spreadsheetbench")) == len(
        fixture_rules(plugin)
    )
    names = {path.name for path in plugin.prompts_dir.iterdir()}
    assert {"initial_skill.md", "analyst_error.md", "analyst_success.md"} <= names
    seed = (plugin.prompts_dir / "initial_skill.md").read_text(encoding="utf-8")
    assert "INPUT_PATH" in seed and "```python" in seed and "<answer>" not in seed and "\\boxed" not in seed
    taxonomy = (plugin.prompts_dir / "analyst_error.md").read_text(encoding="utf-8")
    for label in ("rule_missing", "rule_wrong", "rule_ignored", "data_exploration", "code_error", "other"):
        assert f"`{label}`" in taxonomy


def test_importing_the_plugin_imports_neither_openpyxl_nor_pandas():
    import subprocess
    import sys

    code = ("import sys, skillopt.benchmarks.spreadsheetbench; "
            "print('openpyxl' in sys.modules or 'pandas' in sys.modules)")
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )


# --------------------------------------------------------------------------- resource kills


EIGHT_GB = """import ctypes
import openpyxl
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
size = 8 * 1024 ** 3
ctypes.memset(libc.malloc(size), 1, size)  # no check for NULL: C code that trusts malloc
openpyxl.load_workbook(INPUT_PATH).save(OUTPUT_PATH)"""


def test_an_8_gb_allocation_is_a_memory_kill_in_the_row_and_in_what_the_optimizer_reads(tmp_path):
    item = fixture_items(tmp_path, sandbox_mem_mb=1024, max_turns=2)[ORDERS]
    target = ScriptedTarget(reply_rules(EIGHT_GB))
    row = run_item(plugin, item, "", fixture_config(sandbox_mem_mb=1024, max_turns=2), target=target,
                   judge=None, tags={"training": True})
    # The item's result: every case was an out-of-memory kill, said as such (not "exit code 139").
    assert row.fail_reason.startswith("error: exec out of memory: the code asked for one block of memory "
                                      "larger than the whole 1024 MiB limit"), row.fail_reason
    assert row.extras["kills"] == {"memory": 2}
    assert all(r.startswith("error: exec out of memory") for r in row.extras["case_results"])
    # What the target was told between rounds, and what the optimizer's analyst reads of the item.
    feedback = [e["content"] for e in row.trajectory if e["type"] == "feedback"]
    assert feedback and "out of memory" in feedback[0]
    shown = format_trajectory(row, index=1)
    assert "out of memory" in shown and "exit code 139" not in shown
