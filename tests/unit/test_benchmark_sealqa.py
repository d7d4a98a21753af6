"""The ``sealqa`` benchmark.

Items come from tests/fixtures/sealqa (split_dir form, one native CSV per split) or its raw copy
(ratio form); the target is the real ``scripted`` backend answering from the plug-in's own
``scripted_rules``, the judge the scripted ``auto`` judge, and URLs are served by a fake
``UrlFetcher`` (no test opens a socket).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from skillopt.benchmarks.base import (
    Benchmark,
    BenchmarkSetupError,
    RolloutInfrastructureError,
    benchmark_config,
    load_benchmark,
)
from skillopt.benchmarks.runner import check_infrastructure, error_row, run_item
from skillopt.benchmarks.sealqa import (
    EpisodeContext,
    FetchError,
    SealQABenchmark,
    SealQAConfig,
    UrlFetcher,
    UrllibFetcher,
    normalise_row,
    normalise_string_answer,
    parse_list,
    plugin,
    string_match,
)
from skillopt.benchmarks.sealqa.fetch import page_text
from skillopt.core.config import load_config
from skillopt.core.data import Item
from skillopt.core.errors import DataError
from skillopt.llm.base import BackendContext
from skillopt.llm.errors import ServerError
from skillopt.llm.scripted import ScriptedBackend, parse_rules, resolve_rule_set
from skillopt.shell.cli import _data_overrides
from tests.fakes.benchmark_target import PluginScriptedTarget, fixture_config_of, fixture_rules, items_by_id

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sealqa"
CANARY = "CANARY-TEST"
LAKE, SATURN, FIELDS = "sq-001", "sq-002", "sq-003"
LAKE_URL = "https://en.wikipedia.org/wiki/Lake_Baikal"


# ------------------------------------------------------------------------------------------ helpers


def fixture_config(**overrides: Any) -> SealQAConfig:
    """The config a user gets from ``skillopt train sealqa --data tests/fixtures/sealqa -o
    benchmark.<k>=<v>``."""
    config = fixture_config_of(plugin, [f"benchmark.{key}={value}" for key, value in overrides.items()])
    assert isinstance(config, SealQAConfig)
    return config


def fixture_items(tmp_path: Path, **overrides: Any) -> dict[str, Item]:
    config = fixture_config(**overrides)
    return items_by_id(plugin, config, tmp_path)


def score(item: Item, reply: str, judge: Any = None) -> tuple[float, float, str]:
    result = plugin.score(item, reply, judge)
    return result.hard, result.soft, result.fail_reason


class ScriptedTarget(PluginScriptedTarget):
    """The ``target`` role as the runner uses it: the real scripted backend with this plug-in's rules."""

    def __init__(self, rules: Any = None) -> None:
        super().__init__(plugin, rules)


def scripted_judge(item: Item, prediction: str) -> tuple[bool, str]:
    """The judge callable backed by the scripted ``auto`` judge, through the plug-in's own request."""
    backend = ScriptedBackend(resolve_rule_set(None, BackendContext(), where="test"), role="judge")
    verdict = json.loads(backend.attempt(plugin.judge_request(item, prediction), timeout_s=30).text)
    return verdict["verdict"] == "correct", verdict["reason"]


def exploding_judge(item: Item, prediction: str) -> tuple[bool, str]:
    raise AssertionError("the judge must not be called")


class FakeFetcher:
    """A ``UrlFetcher`` serving pages from a dict; an unknown URL fails like a 404 would."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages
        self.calls: list[tuple[str, float]] = []

    def fetch(self, url: str, *, timeout_s: float) -> str:
        self.calls.append((url, timeout_s))
        if url not in self.pages:
            raise FetchError("HTTP 404 Not Found")
        return self.pages[url]


def episode(
    bench: SealQABenchmark, item: Item, target: ScriptedTarget, config: SealQAConfig, *, deadline: float = 60
) -> tuple[Any, list[dict[str, Any]]]:
    """Run ``bench.run_episode`` the way a runner hook would: the built prompt, a recorder, a deadline."""
    events: list[dict[str, Any]] = []
    ctx = EpisodeContext(
        target=target,
        messages=bench.build_messages(item, "", config),
        cfg=config,
        record=events.append,
        deadline=time.monotonic() + deadline,
        tags={"item_id": item.id},
    )
    return bench.run_episode(item, "", ctx), events


#: A target that gives no answer until it has read fetched content, then answers from it.
FETCH_THEN_ANSWER = [
    {
        "stage": "rollout",
        "user": "## Fetched URL Content",
        "text": "The page settles it.\n<answer>Lake Baikal</answer>",
    },
    {"stage": "rollout", "text": "I need the page itself to decide."},
]


# ------------------------------------------------------------------------------------ config, loading


def test_registered_and_the_default_config_with_data_loads_and_passes_preflight(tmp_path):
    assert isinstance(load_benchmark("sealqa"), Benchmark)
    config = fixture_config()
    assert config.split_mode == "split_dir" and config.split_dir == str(FIXTURES)
    assert (config.grader, config.fetch_urls, config.fetch_max_urls) == ("llm", True, 2)
    assert (config.fetch_timeout, config.fetch_max_chars, config.max_tokens, config.workers) == (
        20,
        6000,
        768,
        4,
    )
    plugin.preflight(config)
    items = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [[item.id for item in rows] for rows in items.values()] == [[LAKE], [SATURN], [FIELDS]]
    assert plugin.task_types([item for rows in items.values() for item in rows]) == ["Geography", "Science"]


def test_the_shipped_config_keys_are_all_valid_for_the_plugin_config():
    config = benchmark_config(plugin, load_config("sealqa", env={}).config.benchmark)
    assert isinstance(config, SealQAConfig) and config.split_dir == "data/sealqa_split"
    assert plugin.default_split_mode == "split_dir"


def test_a_missing_split_folder_fails_preflight_with_a_fix_it_message(tmp_path):
    config = SealQAConfig(split_dir=str(tmp_path / "nowhere"))
    with pytest.raises(BenchmarkSetupError, match="pass --data DIR"):
        plugin.preflight(config)


def test_items_are_normalized_with_lists_parsed_and_the_canary_dropped(tmp_path):
    items = fixture_items(tmp_path)
    saturn = items[SATURN]
    assert {key: value for key, value in saturn.items() if key != "grader"} == {
        "id": SATURN,
        "question": "How many moons of Saturn were officially recognized as of March 2025?",
        "answer": "274",
        "topic": "Science",
        "urls": ["https://science.nasa.gov/saturn/moons/"],
        "search_results": "unhelpful",
        "freshness": "fast-changing",
        "question_types": ["temporal tracking", "entity disambiguation"],
        "effective_year": "2025",
        "task_type": "Science",
    }
    assert all("canary" not in item and CANARY not in json.dumps(item) for item in items.values())
    assert items[LAKE]["urls"] == [LAKE_URL] and items[LAKE].task_type == "Geography"


def test_a_row_without_an_id_gets_sealqa_plus_sha1_and_the_canary_is_never_the_id():
    row = {"question": "Which river is longest?", "ground_truth": "Nile", "canary": CANARY, "topic": ""}
    item = normalise_row(row)
    assert item["id"] == "sealqa-" + hashlib.sha1(b"Which river is longest?").hexdigest()[:12]
    assert item["answer"] == "Nile" and item["task_type"] == "sealqa" and "canary" not in item
    assert normalise_row(item) == item  # idempotent: normalized rows load again unchanged
    assert normalise_row({"id": "x1", "question": "Q?", "answer": "A"})["id"] == "x1"


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("['a', 'b']", ["a", "b"]),
        ('["a", "b"]', ["a", "b"]),
        ("[]", []),
        ("", []),
        (None, []),
        ("https://one.example/page", ["https://one.example/page"]),
        (["x", "", None], ["x"]),
    ],
)
def test_list_cells_accept_python_and_json_literals(cell, expected):
    assert parse_list(cell, "urls") == expected


def test_a_bracketed_cell_that_is_no_list_literal_is_an_error_naming_the_file_row_and_field(tmp_path):
    root = tmp_path / "data"
    header = "question,answer,urls\n"
    for split, urls in (("train", "['ok']"), ("val", "[not, a list"), ("test", "")):
        (root / split).mkdir(parents=True)
        (root / split / "rows.csv").write_text(header + f'Q {split}?,A,"{urls}"\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"val/rows.csv line 2: field 'urls' is not a JSON or Python list"):
        plugin.load_split(SealQAConfig(split_dir=str(root)), "train", run_dir=tmp_path)


def test_a_row_without_an_answer_is_an_error_with_no_drop_rule(tmp_path):
    source = tmp_path / "rows.csv"
    source.write_text("question,answer\nQ1?,a\nQ2?,\nQ3?,c\n", encoding="utf-8")
    config = SealQAConfig(split_mode="ratio", data_path=str(source), split_output_dir=str(tmp_path / "out"))
    with pytest.raises(DataError, match=r"rows.csv line 3: missing field 'answer'"):
        plugin.load_split(config, "train", run_dir=tmp_path)


def test_an_unknown_split_name_raises_listing_the_accepted_names(tmp_path):
    with pytest.raises(ValueError, match="accepted names: train, val, selection"):
        plugin.load_split(fixture_config(), "dev", run_dir=tmp_path)
    assert [item.id for item in plugin.load_split(fixture_config(), "valid_unseen", run_dir=tmp_path)] == [
        FIELDS
    ]


def test_ratio_output_round_trips_through_its_own_reader(tmp_path):
    out = tmp_path / "splits"
    config = SealQAConfig(
        split_mode="ratio",
        data_path=str(FIXTURES / "raw" / "sealqa.csv"),
        split_ratio="1:1:1",
        split_output_dir=str(out),
    )
    loaded = {split: plugin.load_split(config, split, run_dir=tmp_path) for split in ("train", "val", "test")}
    assert [len(rows) for rows in loaded.values()] == [1, 1, 1]
    manifest = json.loads((out / "split_manifest.json").read_text(encoding="utf-8"))
    assert manifest["counts"] == {"train": 1, "val": 1, "test": 1} and manifest["split_ratio"] == "1:1:1"
    again = SealQAConfig(split_mode="split_dir", split_dir=str(out))
    for split, rows in loaded.items():
        written = json.loads((out / split / "items.json").read_text(encoding="utf-8"))
        assert [row["id"] for row in written] == manifest["ids"][split]
        assert all("grader" not in row and "canary" not in row for row in written)
        assert plugin.load_split(again, split, run_dir=tmp_path) == rows
    # The raw CSV holds the fixture rows, so it gives the same items as the split folders.
    assert {item.id: item for rows in loaded.values() for item in rows} == fixture_items(tmp_path / "fixture")


# -------------------------------------------------------------------------------------------- prompts


def test_the_prompt_has_question_evidence_sections_and_the_skill_in_the_system_message(tmp_path):
    item = fixture_items(tmp_path)[SATURN]
    system, user = plugin.build_messages(item, "  Prefer recent sources.  ", fixture_config())
    assert "## Skill\nPrefer recent sources.\n\n" in system.text() and "<answer>…</answer>" in system.text()
    assert "entity, date and scope" in system.text()
    text = user.text()
    order = ["## Question\nHow many moons", "## Search Results\nunhelpful",
             "## URL Hints\n- https://science.nasa.gov/saturn/moons/", "## Freshness\nfast-changing",
             "## Question Types\ntemporal tracking, entity disambiguation"]
    assert [text.index(part) for part in order] == sorted(text.index(part) for part in order)
    assert text.rstrip().endswith("put your final answer inside <answer>…</answer>.")
    assert "## Skill" not in plugin.build_messages(item, " \n", fixture_config())[0].text()


def test_empty_evidence_sections_are_left_out():
    item = Item(normalise_row({"id": "bare", "question": "Q?", "answer": "A"}))
    _, user = plugin.build_messages(item, "", fixture_config())
    assert user.text().startswith("## Question\nQ?\n\n")
    for heading in ("## Search Results", "## URL Hints", "## Freshness", "## Question Types"):
        assert heading not in user.text()


def test_no_prompt_reads_or_contains_a_gold_value_or_the_canary(tmp_path):
    sentinel = "GOLD-SENTINEL-9431"
    for item in fixture_items(tmp_path).values():
        baseline = [m.text() for m in plugin.build_messages(item, "skill", fixture_config())]
        without_gold = Item({k: v for k, v in item.items() if k not in plugin.GOLD_FIELDS})
        assert [m.text() for m in plugin.build_messages(without_gold, "skill", fixture_config())] == baseline
        marked = Item({**item, **{field: sentinel for field in plugin.GOLD_FIELDS}, "canary": CANARY})
        texts = [m.text() for m in plugin.build_messages(marked, "skill", fixture_config())]
        assert not any(sentinel in text or CANARY in text for text in texts)
        assert not any(str(item["answer"]) in text for text in baseline)


# ------------------------------------------------------------------------------ scoring: llm grader


def test_the_default_grader_is_the_judge_and_grades_lake_baikal(tmp_path):
    lake = fixture_items(tmp_path)[LAKE]
    assert plugin.needs_judge(fixture_config()) is True and lake["grader"] == "llm"
    assert score(lake, "<answer>Lake Baikal</answer>", scripted_judge) == (1.0, 1.0, "")
    hard, soft, reason = score(lake, "<answer>Baikal</answer>", scripted_judge)
    assert (hard, soft) == (0.0, 0.0)
    assert reason == "wrong: judged incorrect: the normalised prediction equals no gold answer"
    # The last tag is the one graded.
    assert (
        score(lake, "<answer>Baikal</answer> no wait <answer>lake baikal.</answer>", scripted_judge)[0] == 1.0
    )


def test_the_judge_request_carries_question_gold_and_prediction_in_text_and_tags(tmp_path):
    lake = fixture_items(tmp_path)[LAKE]
    request = plugin.judge_request(lake, "Baikal")
    assert request.stage == "judge"
    assert request.tags == {"item_id": LAKE, "prediction": "Baikal", "gold_answers": ["Lake Baikal"]}
    text = request.last_user_text()
    assert "## Question\nWhich lake" in text and "## Gold answer\nLake Baikal" in text
    assert text.rstrip().endswith("## Answer to grade\nBaikal")
    rubric = request.messages[0].text()
    assert "NOT ATTEMPTED" in rubric and '"not attempted"' in rubric and CANARY not in text


def test_a_not_attempted_reason_is_kept_in_the_fail_reason(tmp_path):
    def not_attempted(item: Item, prediction: str) -> tuple[bool, str]:
        return False, "not attempted: the answer declines to commit"

    result = plugin.score(fixture_items(tmp_path)[LAKE], "<answer>unclear</answer>", not_attempted)
    assert result.fail_reason == "wrong: judged incorrect: not attempted: the answer declines to commit"
    assert result.extras["grader"] == "llm" and result.expected == "Lake Baikal"
    assert "Judge: not attempted" in result.detail


def test_a_judge_error_propagates_and_is_never_graded_incorrect(tmp_path):
    lake = fixture_items(tmp_path)[LAKE]

    def broken_judge(item: Item, prediction: str) -> tuple[bool, str]:
        raise ServerError("judge backend down")

    with pytest.raises(ServerError, match="judge backend down"):
        plugin.score(lake, "<answer>Baikal</answer>", broken_judge)
    target = ScriptedTarget()
    with pytest.raises(ServerError):
        run_item(plugin, lake, "", fixture_config(), target=target, judge=broken_judge)


def test_grader_llm_without_a_judge_callable_is_a_setup_error_not_a_string_match(tmp_path):
    with pytest.raises(BenchmarkSetupError, match="grader 'llm' needs the judge role"):
        plugin.score(fixture_items(tmp_path)[LAKE], "<answer>Lake Baikal</answer>", None)


def test_grader_llm_without_a_judge_role_fails_preflight_and_never_falls_back(tmp_path):
    from skillopt.run.assembly import Run

    overrides = [
        *_data_overrides(str(FIXTURES)),
        "model.judge=null",
        "model.target.backend=scripted",
        "model.optimizer.backend=scripted",
        f"run.runs_dir={tmp_path / 'runs'}",
    ]
    loaded = load_config("sealqa", overrides=overrides, env={})
    with pytest.raises(BenchmarkSetupError, match="benchmark sealqa needs the judge role"):
        Run.from_config(loaded, env={})
    assert not (tmp_path / "runs").exists()
    assert benchmark_config(plugin, loaded.config.benchmark).grader == "llm"  # unchanged, no silent switch


@pytest.mark.parametrize("reply", ["no tag at all", "<answer>  </answer>", "<answer>Lake Baikal"])
def test_a_reply_without_a_final_answer_is_a_no_answer_row_and_calls_no_judge(tmp_path, reply):
    result = plugin.score(fixture_items(tmp_path)[LAKE], reply, exploding_judge)
    assert (result.hard, result.soft, result.fail_reason) == (
        0.0,
        0.0,
        "no-answer: model gave no final answer",
    )
    assert result.predicted_answer == ""


# --------------------------------------------------------------------------- scoring: string grader


def test_the_string_grader_is_offline_and_matches_by_containment(tmp_path):
    items = fixture_items(tmp_path, grader="string")
    assert plugin.needs_judge(fixture_config(grader="string")) is False
    lake = items[LAKE]
    assert lake["grader"] == "string"
    assert score(lake, "<answer>Baikal</answer>", exploding_judge) == (1.0, 1.0, "")
    assert score(lake, "<answer>It is Lake Baikal, Siberia</answer>", exploding_judge)[0] == 1.0
    assert score(lake, "<answer>Lake Superior</answer>", exploding_judge) == (
        0.0,
        0.0,
        "wrong: no string match",
    )
    assert plugin.score(lake, "<answer>Baikal</answer>", None).extras["grader"] == "string"


@pytest.mark.parametrize(
    ("prediction", "gold", "matches"),
    [
        ("LAKE   baikal!", "Lake Baikal", True),  # case, spaces and '!' normalised away
        ("12.5%", "12.5 %", False),  # spaces are kept, so '12.5%' is not '12.5 %'
        ("12.5%", "about 12.5% of all", True),
        ("co-founder", "cofounder", False),  # '-' is kept
        ("Lake_Baikal", "lake baikal", False),  # '_' is a word character and is kept
        ("", "Lake Baikal", False),  # an empty prediction never matches
        ("?!", "Lake Baikal", False),  # nor one that normalises to nothing
        ("27", "274", True),  # containment is on characters, as §2.9 states
    ],
)
def test_string_grader_normalisation_edge_cases(prediction, gold, matches):
    assert string_match(prediction, gold) is matches


def test_string_normalisation_keeps_word_chars_spaces_percent_dots_and_hyphens():
    assert normalise_string_answer("  U.S. GDP: +3.1%  (est.) — São_Paulo ") == "u.s. gdp 3.1% est. são_paulo"


# ------------------------------------------------------------------------------------------ URL fetch


def test_a_first_reply_with_no_answer_triggers_the_fake_fetcher_and_a_logged_tool_call(tmp_path):
    page = "<html><head><style>p{color:red}</style><script>var gold = 1;</script></head>" \
           "<body><p>Lake&nbsp;Baikal holds <b>23,000</b> km&sup3;.</p></body></html>"
    fetcher = FakeFetcher({LAKE_URL: page})
    bench = SealQABenchmark(fetcher=fetcher)
    target = ScriptedTarget(FETCH_THEN_ANSWER)
    result, events = episode(bench, fixture_items(tmp_path)[LAKE], target, fixture_config())
    assert fetcher.calls == [(LAKE_URL, 20)]
    [tool_call] = [event for event in events if event["type"] == "tool_call"]
    assert tool_call["name"] == "fetch_url" and tool_call["command"] == LAKE_URL
    assert tool_call["observation"] == f"### {LAKE_URL}\nLake Baikal holds 23,000 km³."
    # The observation is exactly what the target received, under ## Fetched URL Content.
    second = target.requests[1].last_user_text()
    assert second.startswith("## Fetched URL Content\n\n" + tool_call["observation"])
    assert (result.n_turns, result.fetched_urls) == (2, (LAKE_URL,))
    assert [event["type"] for event in events] == ["message", "tool_call", "feedback", "message"]
    assert plugin.score(fixture_items(tmp_path)[LAKE], result.response_text, scripted_judge).hard == 1.0


def test_no_fetch_when_the_first_reply_answers_or_fetching_is_off(tmp_path):
    fetcher = FakeFetcher({LAKE_URL: "page"})
    bench = SealQABenchmark(fetcher=fetcher)
    lake = fixture_items(tmp_path)[LAKE]
    result, events = episode(bench, lake, ScriptedTarget(), fixture_config())
    assert result.n_turns == 1 and "<answer>Lake Baikal</answer>" in result.response_text
    result, events = episode(
        bench, lake, ScriptedTarget(FETCH_THEN_ANSWER), fixture_config(fetch_urls="false")
    )
    assert result.n_turns == 1 and fetcher.calls == [] and [e["type"] for e in events] == ["message"]
    assert (
        plugin.score(lake, result.response_text, exploding_judge).fail_reason
        == "no-answer: model gave no final answer"
    )


def test_fetch_errors_become_blocks_and_at_most_fetch_max_urls_are_fetched(tmp_path):
    urls = ["https://a.example/1", "file:///etc/passwd", "https://a.example/missing", "https://a.example/4"]
    item = Item({**fixture_items(tmp_path)[LAKE], "urls": urls})
    fetcher = FakeFetcher({"https://a.example/1": "x" * 50_000})
    bench = SealQABenchmark(fetcher=fetcher)
    target = ScriptedTarget([{"stage": "rollout", "text": "Still unsure."}])
    result, events = episode(bench, item, target, fixture_config(fetch_max_urls=3, fetch_max_chars=100))
    observations = [event["observation"] for event in events if event["type"] == "tool_call"]
    assert observations[0] == "### https://a.example/1\n" + "x" * 100
    assert observations[1].startswith("### file:///etc/passwd\n[fetch error] refused")
    assert observations[2] == "### https://a.example/missing\n[fetch error] HTTP 404 Not Found"
    assert [url for url, _ in fetcher.calls] == ["https://a.example/1", "https://a.example/missing"]
    # The target is asked once more only; still no answer is a no-answer row.
    assert len(target.requests) == 2 and result.n_turns == 2
    assert (
        plugin.score(item, result.response_text, exploding_judge).fail_reason
        == "no-answer: model gave no final answer"
    )


def test_a_past_deadline_starts_no_fetch_and_no_second_call(tmp_path):
    fetcher = FakeFetcher({LAKE_URL: "page"})
    target = ScriptedTarget(FETCH_THEN_ANSWER)
    result, _ = episode(
        SealQABenchmark(fetcher=fetcher), fixture_items(tmp_path)[LAKE], target, fixture_config(), deadline=-1
    )
    assert fetcher.calls == [] and len(target.requests) == 1 and result.n_turns == 1


def test_page_text_strips_scripts_styles_and_tags_and_caps_the_text():
    html = "<div>One<script>alert('x')</script> <noscript>nope</noscript><span>two</span>\n\n three</div>"
    assert page_text(html, 6000) == "One two three"
    assert page_text(html, 5) == "One t"
    assert page_text("plain text, no tags", 6000) == "plain text, no tags"


def test_the_real_fetcher_is_a_url_fetcher_that_refuses_non_http_urls_without_a_socket(socket_guard):
    fetcher = UrllibFetcher()
    assert isinstance(fetcher, UrlFetcher) and isinstance(FakeFetcher({}), UrlFetcher)
    assert isinstance(plugin.fetcher, UrllibFetcher)
    for url in ("file:///etc/passwd", "ftp://example.com/x", "data:text/plain,hi", "/relative/path"):
        with pytest.raises(FetchError, match="only absolute http"):
            fetcher.fetch(url, timeout_s=1)
    assert socket_guard.attempts == []


# ------------------------------------------------------------------------------- runner and scripted


def test_scripted_rules_solve_the_lake_and_miss_saturn_and_fields_under_the_scripted_judge(tmp_path):
    items = fixture_items(tmp_path)
    target = ScriptedTarget()
    rows = {
        item_id: run_item(plugin, item, "", fixture_config(), target=target, judge=scripted_judge)
        for item_id, item in items.items()
    }
    assert {item_id: (row.hard, row.soft) for item_id, row in rows.items()} == {
        LAKE: (1.0, 1.0),
        SATURN: (0.0, 0.0),
        FIELDS: (0.0, 0.0),
    }
    saturn = rows[SATURN]
    assert saturn.fail_reason.startswith("wrong: judged incorrect: ") and saturn.task_type == "Science"
    assert saturn.extras["grader"] == "llm" and saturn.predicted_answer == "146"
    assert saturn.trajectory[-1]["type"] == "evaluation"
    assert "Expected: 274" in saturn.trajectory[-1]["content"]
    assert all(CANARY not in row.target_user_prompt + row.target_system_prompt for row in rows.values())


def test_a_target_that_always_raises_is_an_infrastructure_error(tmp_path):
    failing = ScriptedTarget(rules=[{"stage": "rollout", "error": "ServerError"}])
    rows = []
    for item in fixture_items(tmp_path).values():
        with pytest.raises(ServerError) as caught:
            run_item(plugin, item, "", fixture_config(), target=failing, judge=exploding_judge)
        rows.append(error_row(item, caught.value))
    assert all(row.phase == "error" and row.fail_reason.startswith("error: ServerError") for row in rows)
    with pytest.raises(RolloutInfrastructureError, match="none of 3 items got a model answer"):
        check_infrastructure(rows, role_label="scripted/scripted")


def test_self_check_answers_compare_after_normalisation():
    assert plugin.extract_answer("<answer>The Lake Baikal.</answer>") == plugin.extract_answer(
        "<answer>lake baikal</answer>"
    )
    assert plugin.extract_answer("no tag") is None


def test_scripted_rules_are_valid_rules_and_the_prompts_ship():
    assert len(parse_rules(list(fixture_rules(plugin)), where="sealqa scripted_rules")) == len(
        fixture_rules(plugin)
    )
    names = {path.name for path in plugin.prompts_dir.iterdir()}
    assert {"initial_skill.md", "analyst_error.md", "analyst_success.md"} <= names
    seed = (plugin.prompts_dir / "initial_skill.md").read_text(encoding="utf-8")
    assert "<answer>…</answer>" in seed and "\\boxed" not in seed
    taxonomy = (plugin.prompts_dir / "analyst_error.md").read_text(encoding="utf-8")
    for label in ("retrieval_miss", "evidence_conflict", "answer_selection", "not_attempted", "other"):
        assert f"`{label}`" in taxonomy


def test_the_shared_runner_drives_the_episode_records_the_fetch_and_scores_the_final_answer(tmp_path):
    from skillopt.benchmarks.runner import run_item

    fetcher = FakeFetcher({LAKE_URL: "<p>Lake Baikal is the deepest lake.</p>"})
    bench = SealQABenchmark(fetcher=fetcher)
    row = run_item(
        bench,
        fixture_items(tmp_path)[LAKE],
        "",
        fixture_config(),
        target=ScriptedTarget(FETCH_THEN_ANSWER),
        judge=scripted_judge,
    )
    assert (row.hard, row.n_turns, row.predicted_answer) == (1.0, 2, "Lake Baikal")
    kinds = [event["type"] for event in row.trajectory]
    assert kinds.index("tool_call") < kinds.index("feedback") < len(kinds) - 1
    assert kinds[-1] == "evaluation"
    assert fetcher.calls and fetcher.calls[0][0] == LAKE_URL
