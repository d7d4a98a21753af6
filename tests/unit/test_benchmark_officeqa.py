"""The ``officeqa`` benchmark.

Items come from tests/fixtures/officeqa (split_dir form, one native CSV per split, the corpus in
its ``transformed/`` folder) or its raw copy (ratio form). The target is the real ``scripted``
backend answering from the fixture folder's ``scripted_rules.yaml``, which follow the tool protocol, so
the runner's episodes exercise the local tool loop.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from skillopt.benchmarks.base import (
    Benchmark,
    BenchmarkSetupError,
    EpisodeContext,
    RolloutInfrastructureError,
    benchmark_config,
)
from skillopt.benchmarks.officeqa import (
    DOCUMENTS_KEY,
    OfficeQABenchmark,
    OfficeQAConfig,
    normalise_answer,
    normalise_row,
    parse_source_docs,
    parse_source_files,
    plugin,
)
from skillopt.benchmarks.officeqa.documents import (
    PAGE_CHARS,
    Corpus,
    docs_roots,
    html_to_markdown,
    page_number,
    page_pairs,
)
from skillopt.benchmarks.officeqa.tools import (
    GREP_MAX_HITS,
    NOT_ALLOWED,
    READ_MAX_CHARS,
    DocumentTools,
    parse_tool_call,
)
from skillopt.benchmarks.runner import check_infrastructure, error_row, run_item
from skillopt.core.config import load_config
from skillopt.core.data import Item
from skillopt.core.errors import DataError
from skillopt.llm.errors import ServerError
from skillopt.llm.scripted import parse_rules
from tests.fakes.benchmark_target import PluginScriptedTarget, fixture_config_of, fixture_rules, items_by_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "officeqa"
CORPUS = FIXTURES / "transformed"
DEBT, RECEIPTS, BONDS = "UID9001", "UID9002", "UID9003"
DEBT_FILE = CORPUS / "treasury_bulletin_1950_03.txt"
BONDS_FILE = CORPUS / "treasury_bulletin_1961_06.txt"
SENTINEL = "GOLD-SENTINEL-7731"


# ------------------------------------------------------------------------------------------ helpers


def fixture_config(**overrides: Any) -> OfficeQAConfig:
    """The config a user gets from ``skillopt train officeqa --data tests/fixtures/officeqa -o
    benchmark.<k>=<v>``."""
    config = fixture_config_of(plugin, [f"benchmark.{key}={value}" for key, value in overrides.items()])
    assert isinstance(config, OfficeQAConfig)
    return config


def fixture_items(
    tmp_path: Path, bench: OfficeQABenchmark | None = None, **overrides: Any
) -> dict[str, Item]:
    bench = bench or OfficeQABenchmark(env={})
    config = fixture_config(**overrides)
    return items_by_id(bench, config, tmp_path)


class ScriptedTarget(PluginScriptedTarget):
    """The ``target`` role as the runner uses it: the real scripted backend with this plug-in's rules."""

    def __init__(self, rules: Any = None) -> None:
        super().__init__(plugin, rules)


def exploding_judge(item: Item, prediction: str) -> tuple[bool, str]:
    raise AssertionError("officeqa never calls the judge")


def episode(item: Item, target: ScriptedTarget, config: OfficeQAConfig, *, deadline: float = 60):
    """Run ``plugin.run_episode`` as the runner does: the built prompt, a recorder, a deadline."""
    events: list[dict[str, Any]] = []
    ctx = EpisodeContext(
        target=target, messages=plugin.build_messages(item, "", config), cfg=config, record=events.append,
        deadline=time.monotonic() + deadline, tags={"item_id": item.id},
    )
    return plugin.run_episode(item, "", ctx), events


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def observations(events: list[dict[str, Any]]) -> list[str]:
    return [event["observation"] for event in events if event["type"] == "tool_call"]


def score(item: Item, reply: str) -> tuple[float, float, str]:
    result = plugin.score(item, reply, exploding_judge)
    return result.hard, round(result.soft, 2), result.fail_reason


# ------------------------------------------------------------------------------------ config, loading


def test_the_default_config_with_data_loads_passes_preflight_and_finds_the_corpus(tmp_path):
    assert isinstance(plugin, Benchmark)
    config = fixture_config()
    assert (config.split_mode, config.split_dir, config.data_root) == (
        "split_dir",
        str(FIXTURES),
        str(FIXTURES),
    )
    assert (config.max_tool_turns, config.max_tokens, config.workers) == (24, 10000, 4)
    assert config.use_local_tools and config.include_oracle_pages
    OfficeQABenchmark(env={}).preflight(config)
    items = fixture_items(tmp_path)
    assert list(items) == [DEBT, RECEIPTS, BONDS]
    assert plugin.task_types(list(items.values())) == ["easy", "hard"]
    # The --data folder's transformed/ subfolder is the root; the shipped docs_dirs entry does not exist here.
    assert items[DEBT][DOCUMENTS_KEY]["roots"] == [str(CORPUS.resolve())]
    assert items[DEBT][DOCUMENTS_KEY]["candidate_files"] == [str(DEBT_FILE.resolve())]
    assert plugin.needs_judge(config) is False


def test_the_shipped_config_keys_are_all_valid_for_the_plugin_config():
    config = benchmark_config(plugin, load_config("officeqa", env={}).config.benchmark)
    assert isinstance(config, OfficeQAConfig)
    assert (config.split_dir, config.docs_dirs) == ("data/officeqa_split", ["data/officeqa_docs_official"])


def test_items_are_normalized_with_both_source_lists(tmp_path):
    receipts = fixture_items(tmp_path)[RECEIPTS]
    assert {key: value for key, value in receipts.items() if key != DOCUMENTS_KEY} == {
        "id": RECEIPTS,
        "uid": RECEIPTS,
        "question": "Percent change in total receipts from January 1944 to January 1945 (2 decimals)?",
        "ground_truth": "12.37%",
        "answers": ["12.37%"],
        "task_type": "hard",
        "source_files": ["treasury_bulletin_1944_01.txt", "treasury_bulletin_1945_01.txt"],
        "source_docs": ["https://fraser.stlouisfed.org/x/january-1944?page=5",
                        "https://fraser.stlouisfed.org/x/january-1945?page=5"],
        "split": "",
    }
    assert normalise_row(receipts) == {k: v for k, v in receipts.items() if k != DOCUMENTS_KEY}  # idempotent


def test_alias_columns_load():
    row = {"id": 17, "question": "Q?", "ground_truth": 1.5, "category": "hard", "source_files": "a.txt",
           "split": "train"}
    item = normalise_row(row)
    assert (item["id"], item["uid"], item["ground_truth"], item["answers"], item["task_type"]) == (
        "17", "17", "1.5", ["1.5"], "hard")
    assert item["source_files"] == ["a.txt"] and item["source_docs"] == [] and item["split"] == "train"


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ('["a.txt", "b.txt"]', ["a.txt", "b.txt"]),
        ("a.txt\nb.txt", ["a.txt", "b.txt"]),
        ("a.txt\r\nb.txt\r\n", ["a.txt", "b.txt"]),
        ("a.txt\rb.txt", ["a.txt", "b.txt"]),
        ("a.txt, b.txt", ["a.txt", "b.txt"]),
        ("a.txt", ["a.txt"]),
        ("", []),
        (None, []),
        (["a.txt", "", None], ["a.txt"]),
    ],
)
def test_source_files_accept_json_newline_comma_and_single_forms(cell, expected):
    assert parse_source_files(cell) == expected


def test_source_docs_split_on_newlines_and_commas_before_a_url():
    assert parse_source_docs("https://x/a?page=1,https://x/b?page=2\r\nhttps://x/c?p=1,2") == [
        "https://x/a?page=1", "https://x/b?page=2", "https://x/c?p=1,2"]
    assert parse_source_docs('["https://x/a"]') == ["https://x/a"]


def test_a_row_without_an_answer_is_an_error_naming_the_file_and_row(tmp_path):
    source = tmp_path / "rows.csv"
    source.write_text("uid,question,answer\nA,Q1?,1\nB,Q2?,\nC,Q3?,3\n", encoding="utf-8")
    config = OfficeQAConfig(split_mode="ratio", data_path=str(source), split_output_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match=r"rows.csv line 3: missing field 'ground_truth'"):
        OfficeQABenchmark(env={}).load_split(config, "train", run_dir=tmp_path)


def test_an_unknown_split_name_raises_listing_the_accepted_names(tmp_path):
    with pytest.raises(ValueError, match="accepted names: train, val, selection"):
        plugin.load_split(fixture_config(), "dev", run_dir=tmp_path)
    assert [item.id for item in plugin.load_split(fixture_config(), "valid_unseen", run_dir=tmp_path)] == [
        BONDS
    ]


def test_ratio_output_round_trips_through_its_own_reader(tmp_path):
    out = tmp_path / "splits"
    bench = OfficeQABenchmark(env={})
    config = OfficeQAConfig(
        split_mode="ratio",
        data_path=str(FIXTURES / "raw" / "officeqa.csv"),
        split_ratio="1:1:1",
        split_output_dir=str(out),
        docs_dirs=[str(FIXTURES)],
    )
    loaded = {split: bench.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [len(rows) for rows in loaded.values()] == [1, 1, 1]
    manifest = json.loads((out / "split_manifest.json").read_text(encoding="utf-8"))
    assert manifest["counts"] == {"train": 1, "val": 1, "test": 1}
    again = OfficeQAConfig(split_mode="split_dir", split_dir=str(out), docs_dirs=[str(FIXTURES)])
    for split, rows in loaded.items():
        written = json.loads((out / split / "items.json").read_text(encoding="utf-8"))
        assert [row["id"] for row in written] == manifest["ids"][split]
        assert all(DOCUMENTS_KEY not in row for row in written)  # corpus paths are never written
        assert bench.load_split(again, split, run_dir=tmp_path) == rows
    assert {item.id: item for rows in loaded.values() for item in rows} == fixture_items(tmp_path / "fixture")


# ---------------------------------------------------------------------------------------- preflight


def test_preflight_fails_without_any_document_root(tmp_path):
    (tmp_path / "split").mkdir()
    for split in ("train", "val", "test"):
        (tmp_path / "split" / split).mkdir()
    config = OfficeQAConfig(split_dir=str(tmp_path / "split"), docs_dirs=[str(tmp_path / "nowhere")])
    with pytest.raises(BenchmarkSetupError, match="no document root exists.*OFFICEQA_DOCS_DIR"):
        OfficeQABenchmark(env={}).preflight(config)


def test_preflight_names_a_source_file_found_under_no_root(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "treasury_bulletin_1950_03.txt").write_text("x\n", encoding="utf-8")
    config = OfficeQAConfig(split_dir=str(FIXTURES), docs_dirs=[str(docs)])
    with pytest.raises(BenchmarkSetupError, match=r"3 document\(s\).*treasury_bulletin_1944_01.txt"):
        OfficeQABenchmark(env={}).preflight(config)
    # $OFFICEQA_DOCS_DIR adds a root that holds the rest.
    OfficeQABenchmark(env={"OFFICEQA_DOCS_DIR": str(FIXTURES)}).preflight(config)


def test_a_missing_split_folder_fails_preflight_with_a_fix_it_message(tmp_path):
    with pytest.raises(BenchmarkSetupError, match="pass --data DIR"):
        plugin.preflight(OfficeQAConfig(split_dir=str(tmp_path / "nowhere")))


def test_roots_prefer_transformed_and_are_deduplicated(tmp_path):
    roots = docs_roots([str(FIXTURES), "transformed"], str(FIXTURES), {"OFFICEQA_DOCS_DIR": str(CORPUS)})
    assert roots == [CORPUS.resolve()]


# -------------------------------------------------------------------------------------------- prompts


def test_the_debt_prompt_has_an_oracle_pipe_table_candidates_and_hints(tmp_path):
    item = fixture_items(tmp_path)[DEBT]
    system, user = plugin.build_messages(item, "  Read small windows.  ", fixture_config())
    assert "## Skill\nRead small windows.\n\n" in system.text()
    assert "<tool_call>" in system.text() and "<tool_result>" in system.text() and "<answer>" in system.text()
    text = user.text()
    order = ["## Question\nPer the March 1950", "## Oracle Parsed Pages\nPrimary evidence",
             "## Candidate Files\n- " + str(DEBT_FILE.resolve()), "## Source Hints\n- https://fraser"]
    assert [text.index(part) for part in order] == sorted(text.index(part) for part in order)
    assert "| Item | Amount |\n| --- | --- |\n| Gross public debt | 255,724 |" in text
    assert item[DOCUMENTS_KEY]["oracle_pages_included"] == 1
    assert "## Skill" not in plugin.build_messages(item, " \n", fixture_config())[0].text()


def test_items_without_oracle_pages_or_with_them_off_leave_the_block_out(tmp_path):
    items = fixture_items(tmp_path)
    assert "## Oracle Parsed Pages" not in plugin.build_messages(items[BONDS], "", fixture_config())[1].text()
    off = fixture_items(tmp_path / "off", include_oracle_pages="false")[DEBT]
    assert "## Oracle Parsed Pages" not in plugin.build_messages(off, "", fixture_config())[1].text()


def test_without_local_tools_the_prompt_has_no_tools_and_no_candidate_files(tmp_path):
    item = fixture_items(tmp_path, use_local_tools="false")[DEBT]
    system, user = plugin.build_messages(item, "", fixture_config(use_local_tools="false"))
    assert "<tool_call>" not in system.text() and "## Candidate Files" not in user.text()
    assert "## Oracle Parsed Pages" in user.text() and "## Source Hints" in user.text()


def test_no_prompt_reads_or_contains_a_gold_value(tmp_path):
    for item in fixture_items(tmp_path).values():
        baseline = [m.text() for m in plugin.build_messages(item, "skill", fixture_config())]
        without_gold = Item({k: v for k, v in item.items() if k not in plugin.GOLD_FIELDS})
        assert [m.text() for m in plugin.build_messages(without_gold, "skill", fixture_config())] == baseline
        marked = Item({**item, "ground_truth": SENTINEL, "answers": [SENTINEL]})
        assert not any(SENTINEL in m.text() for m in plugin.build_messages(marked, "skill", fixture_config()))
        assert not any(item["ground_truth"] in text for text in baseline if item.id != BONDS)


# ---------------------------------------------------------------------------------------- oracle pages


def test_html_tables_become_pipe_tables_and_other_markup_is_stripped():
    html = "<p>Note &amp; <b>text</b></p><table><tr><th>A</th><th>B|C</th></tr><tr><td>1</td></tr></table>"
    assert html_to_markdown(html) == "Note & text\n| A | B\\|C |\n| --- | --- |\n| 1 |  |"
    assert html_to_markdown("plain line") == "plain line"


def test_pages_come_from_page_pagenum_or_page_id_and_pair_with_files():
    assert [page_number(u) for u in ("https://x/a?page=14", "https://x/a?pagenum=3&x=1",
                                      "https://x/a?page_id=7", "https://x/a")] == [14, 3, 7, None]
    assert page_pairs(["a.txt", "b.txt"], ["https://x?page=1", "https://x?page=2"]) == [
        ("a.txt", 1),
        ("b.txt", 2),
    ]
    assert page_pairs(["a.txt"], ["https://x?page=1", "https://y?page=4"]) == [("a.txt", 1), ("a.txt", 4)]


def test_an_oversized_page_is_capped(tmp_path):
    root = tmp_path / "docs"
    (root / "jsons").mkdir(parents=True)
    (root / "big.txt").write_text("x\n", encoding="utf-8")
    elements = [{"content": "word " * 10_000, "bbox": [{"page_id": 2}]}]
    (root / "jsons" / "big.json").write_text(
        json.dumps({"document": {"elements": elements}}), encoding="utf-8"
    )
    item = normalise_row({"uid": "B1", "question": "Q?", "answer": "1", "source_files": "big.txt",
                          "source_docs": "https://x/big?page=2"})
    docs = OfficeQABenchmark(env={})._documents(Item(item), OfficeQAConfig(docs_dirs=[str(root)]))
    assert docs["oracle_pages_included"] == 1
    assert len(docs["oracle_pages"]) <= PAGE_CHARS + len("### big.txt, page 2\n")
    assert docs["oracle_pages"].endswith("...[truncated]")


# ---------------------------------------------------------------------------------------------- scoring


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<answer>$255,724 million</answer>", (1.0, 1.0, "")),
        ("<answer>255,724</answer>", (1.0, 1.0, "")),
        ("<answer>255724 Millions Dollars</answer>", (1.0, 1.0, "")),
        ("<answer>255724 millions of dollars</answer>", (0.0, 0.67, "wrong")),  # only the listed words go
        ("<answer>$255,724 nominal dollars</answer>", (1.0, 1.0, "")),
        ("<answer>255,723</answer> no wait <answer>255,724</answer>", (1.0, 1.0, "")),  # the last tag wins
        ("<answer>255724.0</answer>", (0.0, 0.0, "wrong")),  # '.' is kept: 255724.0 is another string
        ("<answer>about 255,724</answer>", (0.0, 0.67, "wrong")),
    ],
)
def test_debt_scoring_normalises_commas_currency_and_scale_words(tmp_path, reply, expected):
    hard, soft, reason = score(fixture_items(tmp_path)[DEBT], reply)
    assert (hard, soft, reason.split(":")[0]) == expected


@pytest.mark.parametrize(
    ("reply", "hard", "soft"),
    [
        ("<answer>12.37%</answer>", 1.0, 1.0),
        ("<answer> 12.37 % </answer>", 0.0, 0.0),  # '%' is kept and spacing splits the token
        ("<answer>12.4%</answer>", 0.0, 0.0),
        ("<answer>+12.37%</answer>", 1.0, 1.0),  # '+' is punctuation and is stripped
        ("<answer>12.37% increase</answer>", 0.0, 0.67),
    ],
)
def test_percent_answers_keep_the_percent_sign_and_the_decimals(tmp_path, reply, hard, soft):
    assert score(fixture_items(tmp_path)[RECEIPTS], reply)[:2] == (hard, soft)


def test_normalisation_rules():
    assert normalise_answer("$255,724 million") == "255724"
    assert normalise_answer("  -3.5 Billion dollars ") == "-3.5"
    assert normalise_answer("U.S. (nominal) $1,000,000") == "u.s. 1000000"
    assert normalise_answer("Millionaire") == "millionaire"  # only whole words are deleted
    assert normalise_answer("snake_case; 50%!") == "snakecase 50%"


def test_missing_answers_are_no_answer_rows_with_the_loop_reason(tmp_path):
    item = fixture_items(tmp_path)[DEBT]
    assert score(item, "I think it is 255,724.") == (0.0, 0.0, "no-answer: no tool call and no final answer")
    assert score(item, call("grep", pattern="debt", path="x")) == (
        0.0, 0.0, "no-answer: tool-turn budget exhausted (24)")
    assert score(item, "<answer>  </answer>") == (0.0, 0.0, "no-answer: empty <answer>")
    no_tools = fixture_items(tmp_path / "nt", use_local_tools="false")[DEBT]
    assert score(no_tools, "no tag") == (0.0, 0.0, "no-answer: no final answer")


def test_score_reports_the_extras_and_the_expected_value(tmp_path):
    result = plugin.score(fixture_items(tmp_path)[DEBT], "<answer>1</answer>", None)
    assert result.extras["resolved_source_paths"] == [str(DEBT_FILE.resolve())]
    assert result.extras["oracle_pages_included"] == 1 and result.extras["oracle_pages_chars"] > 0
    assert result.extras["use_local_tools"] is True
    assert result.expected == "255724" and result.fail_reason.startswith("wrong: predicted '1'")
    assert plugin.extract_answer("<answer>$255,724 million</answer>") == plugin.extract_answer(
        "<answer>255724</answer>"
    )


# ------------------------------------------------------------------------------------------------ tools


def debt_tools(tmp_path: Path) -> DocumentTools:
    docs = fixture_items(tmp_path)[DEBT][DOCUMENTS_KEY]
    return DocumentTools(docs["candidate_files"], docs["roots"])


def test_reads_outside_the_items_documents_are_refused(tmp_path):
    tools = debt_tools(tmp_path)
    refused = [
        "/etc/passwd",
        str(BONDS_FILE),  # another item's document, inside the root
        str(CORPUS / ".." / "train" / "officeqa.csv"),  # the split file with the gold, via '..'
        str(DEBT_FILE.parent / ".." / "transformed" / ".." / "raw" / "officeqa.csv"),
        "../train/officeqa.csv",
        "treasury_bulletin_1961_06.txt",
        "",
    ]
    for path in refused:
        assert tools.read(path) == NOT_ALLOWED, path
        assert tools.grep("UID", path) == NOT_ALLOWED, path
    assert tools.glob("*") == str(DEBT_FILE.resolve())
    assert tools.glob("*1961*") == "no matching files"


def test_a_symlink_escaping_the_root_is_refused_and_nothing_is_read(tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("SECRET 255724\n", encoding="utf-8")
    root = tmp_path / "docs"
    root.mkdir()
    (root / "treasury_bulletin_2000_01.txt").symlink_to(outside)  # a corpus file that leaves the root
    (root / "good.txt").write_text("line one\n", encoding="utf-8")
    (root / "link_to_secret").symlink_to(outside)
    corpus = Corpus.index([root.resolve()])
    assert corpus.missing(["treasury_bulletin_2000_01.txt"]) == ["treasury_bulletin_2000_01.txt"]
    tools = DocumentTools([root / "good.txt", root / "treasury_bulletin_2000_01.txt"], [root])
    for path in (str(root / "link_to_secret"), str(root / "treasury_bulletin_2000_01.txt"),
                 "treasury_bulletin_2000_01.txt", str(outside)):
        assert tools.read(path) == NOT_ALLOWED
        assert tools.grep("secret", path) == NOT_ALLOWED
    assert "SECRET" not in tools.glob("*") and tools.read("good.txt") == "1: line one"


def test_read_numbers_lines_and_caps_the_output_and_grep_caps_hits(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "long.txt").write_text("".join(f"Total receipts row {n} {'x' * 100}\n" for n in range(1, 101)),
                                   encoding="utf-8")
    tools = DocumentTools([root / "long.txt"], [root])
    assert tools.read("long.txt", start=2, limit=2).splitlines()[0].startswith("2: Total receipts row 2 ")
    assert len(tools.read("long.txt")) <= READ_MAX_CHARS and tools.read("long.txt").endswith("...[truncated]")
    hits = tools.grep("TOTAL RECEIPTS", str(root / "long.txt")).splitlines()
    assert len(hits) == GREP_MAX_HITS + 1 and hits[0].startswith("1: Total receipts row 1")
    assert hits[-1] == "... (80 more matches)"
    assert tools.grep("absent", "long.txt") == "no matches"
    assert tools.read("long.txt", start=500).startswith("error: read: start 500 is past the end")


def test_bad_tool_calls_become_error_observations():
    tools = DocumentTools([], [])
    assert parse_tool_call("no call here") is None
    malformed = parse_tool_call("<tool_call>{name: grep}</tool_call>")
    assert malformed is not None and tools.run(malformed).startswith("error: malformed tool call JSON")
    unknown = parse_tool_call(call("delete", path="/"))
    assert (
        unknown is not None
        and tools.run(unknown) == "error: unknown tool 'delete'; the tools are glob, read, grep"
    )
    bad = parse_tool_call(call("read", path=3))
    assert bad is not None and tools.run(bad) == "error: read: argument 'path' must be a string"
    bad_start = parse_tool_call(call("read", path="x", start="one"))
    assert (
        bad_start is not None and tools.run(bad_start) == "error: read: argument 'start' must be an integer"
    )


# ---------------------------------------------------------------------------------------- the tool loop


def test_the_tool_budget_bounds_the_target_calls(tmp_path):
    target = ScriptedTarget([{"stage": "rollout", "text": call("glob", pattern="*")}])
    item = fixture_items(tmp_path)[DEBT]
    result, events = episode(item, target, fixture_config(max_tool_turns=3))
    assert (result.n_turns, len(target.requests)) == (3, 3)
    assert [e["type"] for e in events] == ["message", "tool_call"] * 3
    item3 = fixture_items(tmp_path / "b", max_tool_turns=3)[DEBT]
    assert score(item3, result.response_text)[2] == "no-answer: tool-turn budget exhausted (3)"


def test_a_malformed_call_uses_a_turn_and_the_observation_is_what_the_target_gets(tmp_path):
    target = ScriptedTarget([
        {"stage": "rollout", "user": "malformed", "text": "<answer>255,724</answer>"},
        {"stage": "rollout", "text": "<tool_call>{not json</tool_call>"},
    ])
    result, events = episode(fixture_items(tmp_path)[DEBT], target, fixture_config())
    [tool_call] = [e for e in events if e["type"] == "tool_call"]
    assert tool_call["name"] == "invalid" and tool_call["observation"].startswith(
        "error: malformed tool call JSON"
    )
    assert target.requests[1].last_user_text() == f"<tool_result>\n{tool_call['observation']}\n</tool_result>"
    assert result.n_turns == 2 and last_answer(result.response_text) == "255,724"


def last_answer(text: str) -> str:
    return text.split("<answer>")[-1].split("</answer>")[0]


def test_a_reply_with_neither_call_nor_answer_ends_the_loop(tmp_path):
    target = ScriptedTarget([{"stage": "rollout", "text": "Let me think about it."}])
    result, events = episode(fixture_items(tmp_path)[DEBT], target, fixture_config())
    assert result.n_turns == 1 and len(target.requests) == 1 and observations(events) == []


def test_a_past_deadline_starts_no_call(tmp_path):
    target = ScriptedTarget()
    result, events = episode(fixture_items(tmp_path)[DEBT], target, fixture_config(), deadline=-1)
    assert (result.n_turns, result.answered, target.requests, events) == (0, False, [], [])


def test_each_call_uses_the_configured_max_tokens(tmp_path):
    target = ScriptedTarget()
    episode(fixture_items(tmp_path)[DEBT], target, fixture_config(max_tokens=321))
    assert {request.max_tokens for request in target.requests} == {321}


# ------------------------------------------------------------------------------- runner and scripted


def test_scripted_runs_grep_then_read_then_answer_and_solve_two_of_three(tmp_path):
    items = fixture_items(tmp_path)
    rows = {item_id: run_item(plugin, item, "", fixture_config(), target=ScriptedTarget(), judge=None)
            for item_id, item in items.items()}
    assert {item_id: (row.hard, round(row.soft, 2)) for item_id, row in rows.items()} == {
        DEBT: (1.0, 1.0), RECEIPTS: (0.0, 0.0), BONDS: (1.0, 1.0)}
    debt = rows[DEBT]
    assert debt.predicted_answer == "$255,724 million" and debt.n_turns == 3 and debt.phase == "done"
    tool_calls = [event for event in debt.trajectory if event["type"] == "tool_call"]
    assert [event["name"] for event in tool_calls] == ["grep", "read"]
    assert tool_calls[0]["observation"] == "9: Gross public debt .... 255,724"
    assert tool_calls[1]["observation"].startswith("9: Gross public debt .... 255,724\n10: Guaranteed")
    assert (
        debt.trajectory[-1]["type"] == "evaluation" and "Expected: 255724" in debt.trajectory[-1]["content"]
    )
    assert (
        rows[RECEIPTS].fail_reason.startswith("wrong: predicted '12.4%'")
        and rows[RECEIPTS].task_type == "hard"
    )
    assert [e["name"] for e in rows[BONDS].trajectory if e["type"] == "tool_call"] == ["glob"]


def test_gold_never_reaches_a_tool_observation_or_a_prompt(tmp_path):
    for item in fixture_items(tmp_path).values():
        marked = Item({**item, "ground_truth": SENTINEL, "answers": [SENTINEL]})
        target = ScriptedTarget()
        row = run_item(plugin, marked, "", fixture_config(), target=target, judge=None)
        seen = [m.text() for request in target.requests for m in request.messages]
        seen += [event["observation"] for event in row.trajectory if event["type"] == "tool_call"]
        assert seen and not any(SENTINEL in text or "UID900" in text for text in seen)
        assert row.trajectory[-1]["type"] == "evaluation" and SENTINEL in row.trajectory[-1]["content"]


def test_scripted_answers_at_once_without_local_tools(tmp_path):
    item = fixture_items(tmp_path, use_local_tools="false")[DEBT]
    target = ScriptedTarget()
    row = run_item(plugin, item, "", fixture_config(use_local_tools="false"), target=target, judge=None)
    assert (row.hard, row.n_turns, len(target.requests)) == (1.0, 1, 1)
    assert row.extras["use_local_tools"] is False


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
    assert len(parse_rules(list(fixture_rules(plugin)), where="officeqa scripted_rules")) == 11
    names = {path.name for path in plugin.prompts_dir.iterdir()}
    assert {"initial_skill.md", "analyst_error.md", "analyst_success.md"} <= names
    seed = (plugin.prompts_dir / "initial_skill.md").read_text(encoding="utf-8")
    assert "<answer>…</answer>" in seed and "\\boxed" not in seed and "<tool_call>" not in seed
    taxonomy = (plugin.prompts_dir / "analyst_error.md").read_text(encoding="utf-8")
    for label in (
        "retrieval_miss",
        "evidence_miss",
        "operand_error",
        "calculation_error",
        "answer_format",
        "other",
    ):
        assert f"`{label}`" in taxonomy


def test_importing_the_plugin_imports_no_heavy_package():
    code = ("import sys, skillopt.benchmarks.officeqa; print(sorted({'openpyxl', 'datasets', 'alfworld', "
            "'swebench', 'minisweagent'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
