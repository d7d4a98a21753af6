"""Usage and cost accounting: prices, the JSONL ledger, budgets and summaries."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from skillopt.core.config import BudgetSection
from skillopt.core.errors import ConfigError
from skillopt.llm.chat import Usage
from skillopt.llm.errors import BudgetExceeded
from skillopt.llm.pricing import PriceTable
from skillopt.llm.usage import (
    RoleSpend,
    Totals,
    UsageLedger,
    check_budget,
    check_startable,
    projection_from_history,
)

# Hand-written prices, so expected costs are computed from numbers visible in this file.
TEST_PRICES = """\
as_of: 2025-01-01
entries:
  - {match: "big-model*", input_per_mtok: 10.0, cached_input_per_mtok: 1.0, cache_write_per_mtok: 12.5,
     output_per_mtok: 40.0}
  - {match: "small-model", input_per_mtok: 1.0, output_per_mtok: 2.0}
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def prices(tmp_path: Path) -> PriceTable:
    return PriceTable.load(write(tmp_path / "prices.yaml", TEST_PRICES))


def call(ledger: UsageLedger, **overrides: Any):
    """Record one successful optimizer call on ``big-model`` unless told otherwise."""
    fields: dict[str, Any] = dict(
        role="optimizer",
        backend="openai",
        model_requested="big-model",
        model_served="big-model-2025",
        stage="analyst",
        usage=Usage(prompt_tokens=1000, completion_tokens=100),
        latency_s=1.0,
        attempts=1,
        status="ok",
    )
    fields.update(overrides)
    return ledger.record(**fields)


# --------------------------------------------------------------------------------------------
# Prices


def test_cost_bills_cached_prompt_at_cached_rate_and_reasoning_inside_completion(prices: PriceTable):
    usage = Usage(
        prompt_tokens=10_000, cached_prompt_tokens=4_000, completion_tokens=3_000, reasoning_tokens=2_000
    )
    # 6,000 fresh × $10 + 4,000 cached × $1 + 3,000 output (reasoning included, not added) × $40, per million.
    expected = (6_000 * 10 + 4_000 * 1 + 3_000 * 40) / 1e6
    assert prices.cost("openai", "big-model", usage) == pytest.approx(expected)
    assert expected == pytest.approx(0.184)


def test_cost_bills_cache_writes_at_write_rate_and_defaults_cached_rates_to_input(prices: PriceTable):
    usage = Usage(
        prompt_tokens=10_000, cached_prompt_tokens=5_000, cache_write_tokens=2_000, completion_tokens=500
    )
    expected = (3_000 * 10 + 5_000 * 1 + 2_000 * 12.5 + 500 * 40) / 1e6
    assert prices.cost("anthropic", "big-model-x", usage) == pytest.approx(expected)
    # small-model has no cached or write price: both bill at the input rate.
    assert prices.cost("openai", "small-model", usage) == pytest.approx((10_000 * 1 + 500 * 2) / 1e6)


def test_reasoning_reported_without_completion_bills_as_output(prices: PriceTable):
    assert prices.cost("openai", "small-model", Usage(reasoning_tokens=1_000)) == pytest.approx(
        1_000 * 2 / 1e6
    )


def test_unreported_usage_costs_nothing_but_is_priced(prices: PriceTable):
    assert prices.cost("openai", "small-model", Usage()) == 0.0


def test_shipped_table_prices_the_common_models_with_its_date():
    table = PriceTable.load()
    assert table.as_of.year >= 2025
    for backend, model in [
        ("openai", "gpt-4.1"),
        ("openai", "gpt-4.1-mini"),
        ("openai", "gpt-4.1-nano"),
        ("openai", "gpt-4o"),
        ("azure_openai", "gpt-4o-mini"),
        ("openai", "o3"),
        ("openai", "o4-mini"),
        ("openai", "gpt-5"),
        ("openai", "gpt-5-mini"),
        ("openai", "gpt-4o-2024-08-06"),
        ("anthropic", "claude-opus-4-1-20250805"),
        ("anthropic", "claude-sonnet-4-5"),
        ("anthropic", "claude-haiku-4-5"),
        ("anthropic", "claude-3-5-haiku-latest"),
        ("openai_compatible", "deepseek-chat"),
        ("openai_compatible", "deepseek-reasoner"),
        ("openai_compatible", "qwen-plus"),
        ("openai_compatible", "qwen-max"),
        ("openai_compatible", "qwen-turbo"),
    ]:
        assert table.lookup(backend, model) is not None, model
    # More specific entries win: the mini model is not priced as its big sibling.
    assert (
        table.lookup("openai", "gpt-4o-mini").input_per_mtok < table.lookup("openai", "gpt-4o").input_per_mtok
    )
    assert table.lookup("openai", "gpt-5-mini").match == "gpt-5-mini"
    assert table.lookup("openai", "my-finetune") is None


def test_user_table_overrides_the_shipped_one_and_keeps_the_rest(tmp_path: Path):
    user = write(
        tmp_path / "mine.yaml",
        """\
entries:
  - {match: "GPT-4O", input_per_mtok: 1.0, output_per_mtok: 1.0}
  - {match: "*", backend: "openai_compat*", input_per_mtok: 0, output_per_mtok: 0}
""",
    )
    table = PriceTable.load(user)
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=1_000_000)
    assert table.cost("openai", "gpt-4o", usage) == pytest.approx(2.0)
    assert table.cost("openai_compatible", "my-vllm-model", usage) == 0.0
    assert table.cost("openai", "my-vllm-model", usage) is None  # the backend glob limits the catch-all
    assert table.cost("openai", "gpt-4.1", usage) == pytest.approx(
        PriceTable.load().cost("openai", "gpt-4.1", usage)
    )
    assert table.as_of == PriceTable.load().as_of and table.user_as_of is None


@pytest.mark.parametrize("backend", ["local", "scripted"])
def test_local_and_scripted_calls_cost_zero(prices: PriceTable, backend: str):
    assert prices.cost(backend, "whatever-model", Usage(prompt_tokens=10**6, completion_tokens=10**6)) == 0.0
    assert prices.cost(backend, None, Usage()) == 0.0


def test_bad_price_files_name_the_file_and_the_entry(tmp_path: Path):
    typo = write(
        tmp_path / "typo.yaml",
        """\
entries:
  - {match: a, input_per_mtok: 1, output_per_mtok: 1}
  - {match: b, inptu_per_mtok: 1, output_per_mtok: 1}
""",
    )
    with pytest.raises(ConfigError, match=r"typo\.yaml: entries\[1\]: .*inptu_per_mtok: unknown key"):
        PriceTable.load(typo)
    negative = write(
        tmp_path / "negative.yaml", "entries:\n  - {match: a, input_per_mtok: -1, output_per_mtok: 1}\n"
    )
    with pytest.raises(ConfigError, match=r"negative\.yaml: entries\[0\]: input_per_mtok"):
        PriceTable.load(negative)
    broken = write(tmp_path / "broken.yaml", "entries: [\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml"):
        PriceTable.load(broken)
    top = write(tmp_path / "top.yaml", "prices: []\n")
    with pytest.raises(ConfigError, match=r"top\.yaml: prices: unknown key"):
        PriceTable.load(top)
    with pytest.raises(ConfigError, match="pricing file not found"):
        PriceTable.load(tmp_path / "missing.yaml")


# --------------------------------------------------------------------------------------------
# Ledger


def test_ledger_appends_one_json_line_per_call_with_cost(tmp_path: Path, prices: PriceTable):
    path = tmp_path / "run" / "usage.jsonl"
    ledger = UsageLedger(path, prices)
    call(ledger, tags={"item_id": "q1", "step": 2})
    call(ledger, status="error", error_class="RateLimited", usage=None, attempts=6, latency_s=0.0)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["ts"].endswith("Z") and first["role"] == "optimizer" and first["stage"] == "analyst"
    assert first["model_requested"] == "big-model" and first["model_served"] == "big-model-2025"
    assert first["tags"] == {"item_id": "q1", "step": 2}
    assert first["cost_usd"] == pytest.approx((1000 * 10 + 100 * 40) / 1e6)
    assert first["cache_hit"] is False and first["status"] == "ok"
    assert second["status"] == "error" and second["error_class"] == "RateLimited" and second["attempts"] == 6
    assert ledger.totals().calls == 2 and ledger.totals().errors == 1


def test_ledgers_of_several_processes_on_one_file_count_every_line(tmp_path: Path, prices: PriceTable):
    """A Dask worker appends its rollouts' lines to the run's usage.jsonl: the flow's ledger counts them
    too."""
    path = tmp_path / "usage.jsonl"
    flow, worker = UsageLedger(path, prices), UsageLedger(path, prices)
    mark = flow.mark()
    call(flow, tags={"item_id": "q1"})
    call(worker, tags={"item_id": "q2"})
    call(worker, tags={"item_id": "q3"})
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"ts": "2026-')  # a line another process is still writing is not read yet
    assert flow.totals().calls == 3 and flow.totals(since=mark).calls == 3
    assert [r.tags["item_id"] for r in flow.records(mark)] == ["q1", "q2", "q3"]
    assert worker.totals().calls == 3


def test_unreported_token_counts_stay_null_in_the_record(tmp_path: Path, prices: PriceTable):
    ledger = UsageLedger(tmp_path / "usage.jsonl", prices)
    record = call(ledger, usage=Usage(prompt_tokens=0, completion_tokens=12))
    line = json.loads((tmp_path / "usage.jsonl").read_text(encoding="utf-8"))
    assert line["prompt_tokens"] == 0 and line["completion_tokens"] == 12
    assert line["reasoning_tokens"] is None and line["cached_prompt_tokens"] is None
    assert line["cache_write_tokens"] is None
    assert record.reasoning_tokens is None


def test_unpriced_model_costs_null_and_warns_once_per_model(
    prices: PriceTable, caplog: pytest.LogCaptureFixture
):
    ledger = UsageLedger(None, prices)
    with caplog.at_level(logging.WARNING, logger="skillopt.llm.usage"):
        first = call(ledger, model_requested="mystery-model")
        call(ledger, model_requested="mystery-model")
        call(ledger, model_requested="big-model")
        call(ledger, backend="anthropic", model_requested="other", price_model="other-priced-as")
    assert first.cost_usd is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "openai/mystery-model" in warnings[0] and "anthropic/other-priced-as" in warnings[1]
    totals = ledger.totals()
    assert totals.calls == 4 and totals.unpriced_calls == 3
    assert totals.usd == pytest.approx((1000 * 10 + 100 * 40) / 1e6)


def test_reported_cost_wins_over_the_table(prices: PriceTable):
    ledger = UsageLedger(None, prices)
    record = call(ledger, backend="claude_code_exec", model_requested=None, cost_usd=0.42)
    assert record.cost_usd == 0.42 and ledger.totals().usd == pytest.approx(0.42)


def test_cache_hits_are_logged_at_zero_cost_and_not_billed(tmp_path: Path, prices: PriceTable):
    ledger = UsageLedger(tmp_path / "usage.jsonl", prices)
    call(ledger)
    hit = call(ledger, cache_hit=True, model_requested="mystery-model")
    assert hit.cost_usd == 0.0 and hit.cache_hit
    totals = ledger.totals()
    assert (totals.calls, totals.cache_hits, totals.prompt_tokens, totals.unpriced_calls) == (1, 1, 1000, 0)
    assert totals.usd == pytest.approx((1000 * 10 + 100 * 40) / 1e6)
    assert (
        json.loads((tmp_path / "usage.jsonl").read_text(encoding="utf-8").splitlines()[1])["cache_hit"]
        is True
    )


def test_totals_are_restored_from_an_existing_ledger(tmp_path: Path, prices: PriceTable):
    path = tmp_path / "usage.jsonl"
    first = UsageLedger(path, prices)
    for _ in range(3):
        call(first)
    call(first, role="target", stage="rollout", model_requested="small-model", status="error")
    again = UsageLedger(path, prices)
    assert again.totals() == first.totals()
    call(again)
    assert again.totals().calls == 5
    assert len(path.read_text(encoding="utf-8").splitlines()) == 5  # appended, never rewritten


def test_a_half_written_last_line_is_skipped_and_the_next_record_starts_a_new_line(
    tmp_path: Path, prices: PriceTable, caplog: pytest.LogCaptureFixture
):
    path = tmp_path / "usage.jsonl"
    first = UsageLedger(path, prices)
    call(first)
    call(first)
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"ts": "2025-01-01T00:00:00Z", "role": "optim')  # crash mid-write
    with caplog.at_level(logging.WARNING, logger="skillopt.llm.usage"):
        resumed = UsageLedger(path, prices)
    assert "line 3" in caplog.text
    assert resumed.totals().calls == 2
    call(resumed)
    # The broken line stays where it was; the new record is intact on its own line.
    assert UsageLedger(path, prices).totals().calls == 3


def test_concurrent_records_from_sixteen_threads_all_land(tmp_path: Path, prices: PriceTable):
    path = tmp_path / "usage.jsonl"
    ledger = UsageLedger(path, prices)
    per_thread = 50
    start = threading.Barrier(16)

    def work(n: int) -> None:
        start.wait()
        for i in range(per_thread):
            call(ledger, tags={"thread": n, "i": i}, usage=Usage(prompt_tokens=1000, completion_tokens=100))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 16 * per_thread
    assert {(json.loads(line)["tags"]["thread"], json.loads(line)["tags"]["i"]) for line in lines} == {
        (n, i) for n in range(16) for i in range(per_thread)
    }
    totals = ledger.totals()
    assert totals.calls == 800 and totals.prompt_tokens == 800_000 and totals.completion_tokens == 80_000
    assert totals.usd == pytest.approx(800 * (1000 * 10 + 100 * 40) / 1e6)
    assert UsageLedger(path, prices).totals() == totals


def test_summary_groups_by_stage_role_and_model_with_latency_percentiles(prices: PriceTable):
    ledger = UsageLedger(None, prices)
    for latency in range(1, 21):  # 1..20 s
        call(
            ledger,
            role="target",
            stage="rollout",
            model_requested="small-model",
            latency_s=float(latency),
            usage=Usage(prompt_tokens=100, completion_tokens=10),
        )
    call(ledger, stage="merge", latency_s=3.0)
    call(ledger, stage="analyst", latency_s=5.0, status="error", usage=None)
    call(ledger, stage="analyst", cache_hit=True, latency_s=0.0)
    summary = ledger.summary()
    json.dumps(summary)  # plain JSON values
    assert [row["stage"] for row in summary["by_stage"]] == ["rollout", "analyst", "merge"]  # STAGES order
    rollout = summary["by_stage"][0]
    assert rollout["calls"] == 20 and rollout["prompt_tokens"] == 2000 and rollout["tokens"] == 2200
    assert rollout["p50_latency_s"] == pytest.approx(10.5)
    assert rollout["p95_latency_s"] == pytest.approx(19.05)  # linear between the 19th and 20th value
    assert rollout["usd"] == pytest.approx(20 * (100 * 1 + 10 * 2) / 1e6)
    analyst = summary["by_stage"][1]
    assert (analyst["calls"], analyst["errors"], analyst["cache_hits"], analyst["p50_latency_s"]) == (
        1,
        1,
        1,
        5.0,
    )
    assert analyst["reasoning_tokens"] == 0
    assert [row["role"] for row in summary["by_role"]] == ["target", "optimizer"]
    assert [(row["backend"], row["model"]) for row in summary["by_model"]] == [
        ("openai", "big-model"),
        ("openai", "small-model"),
    ]
    assert summary["total"]["calls"] == 22 and summary["total"]["errors"] == 1


def test_step_totals_count_only_calls_after_a_mark(prices: PriceTable):
    ledger = UsageLedger(None, prices)
    call(ledger)
    mark = ledger.mark()
    call(ledger, usage=Usage(prompt_tokens=7, completion_tokens=3))
    step = ledger.totals(since=mark)
    assert (step.calls, step.tokens) == (1, 10)
    assert ledger.summary(since=mark)["total"]["calls"] == 1


# --------------------------------------------------------------------------------------------
# Budgets


def spend(usd: float = 0.0, tokens: int = 0, calls: int = 0, **by_role: float) -> Totals:
    """Totals with ``usd``, ``tokens`` (all prompt) and ``calls``; ``by_role`` gives each role's USD."""
    return Totals(
        calls=calls,
        prompt_tokens=tokens,
        usd=usd,
        by_role={
            role: RoleSpend(usd=share, tokens=round(tokens * share / usd) if usd else 0, calls=0)
            for role, share in by_role.items()
        },
    )


def test_budget_guard_stops_before_a_step_whose_projection_would_pass_the_cap():
    budget = BudgetSection(max_usd=25.0)
    spent = spend(usd=24.10, optimizer=17.11, target=6.507, judge=0.483)
    verdict = check_budget(budget, spent, spend(usd=1.20), "epoch 3 step 2")
    assert verdict.stop and verdict.cap == "max_usd"
    assert verdict.message == (  # the projection, not the spend, stops it: the message says so
        "budget: $24.10 of $25.00 (optimizer 71%, target 27%, judge 2%) spent, and epoch 3 step 2 is "
        "expected to take ~$1.20; stopped before epoch 3 step 2; raise budget.max_usd and resume"
    )
    assert "next step" in verdict.reason
    assert not check_budget(budget, spent, spend(usd=0.80), "epoch 3 step 2").stop
    assert not check_budget(budget, spent, None, "epoch 3 step 2").stop
    reached = check_budget(budget, spend(usd=25.0, target=25.0), None, "the final evaluation")
    assert reached.stop and reached.message.startswith("budget reached: $25.00 of $25.00 (target 100%)")


def test_budget_guard_applies_token_and_call_caps():
    by_tokens = check_budget(
        BudgetSection(max_tokens=1_000_000), spend(tokens=990_000), spend(tokens=20_000), "epoch 1 step 4"
    )
    assert by_tokens.stop and by_tokens.cap == "max_tokens"
    assert by_tokens.message == (
        "budget: 990,000 of 1,000,000 tokens spent, and epoch 1 step 4 is expected to take ~20,000 tokens; "
        "stopped before epoch 1 step 4; raise budget.max_tokens and resume"
    )
    by_calls = check_budget(BudgetSection(max_calls=100), spend(calls=100), None, "epoch 2 step 1")
    assert by_calls.stop and by_calls.cap == "max_calls"
    assert "100 of 100 calls" in by_calls.message and "raise budget.max_calls" in by_calls.message
    assert not check_budget(BudgetSection(), spend(usd=1e9, tokens=10**9, calls=10**9), None, "x").stop


def test_projection_is_the_mean_of_the_last_three_steps_else_the_estimate():
    estimate = spend(usd=9.0)
    assert projection_from_history([], estimate) is estimate
    assert projection_from_history([], None) is None
    steps = [
        spend(usd=100.0, calls=100),
        spend(usd=1.0, calls=1),
        spend(usd=2.0, calls=2),
        spend(usd=3.0, calls=4),
    ]
    projection = projection_from_history(steps, estimate)
    assert projection.usd == pytest.approx(2.0)
    assert projection.calls == 3  # 7 / 3 rounds up
    assert projection_from_history(steps[:1], estimate).usd == pytest.approx(100.0)


def test_ledger_refuses_calls_past_the_hard_factor(prices: PriceTable):
    # Each call costs (1000 × $10 + 100 × $40) / 1e6 = $0.014; cap $0.05 × 1.2 = $0.06 → 5th call refused.
    ledger = UsageLedger(None, prices, BudgetSection(max_usd=0.05, hard_factor=1.2))
    for _ in range(4):
        ledger.before_call()
        call(ledger)
    assert ledger.totals().usd == pytest.approx(0.056)
    ledger.before_call()  # $0.056 < $0.06: in-flight calls may still run
    call(ledger)
    with pytest.raises(BudgetExceeded, match=r"spent \$0\.07, past 1\.2 × budget\.max_usd \$0\.05") as caught:
        ledger.before_call(role="optimizer", stage="merge")
    assert "raise budget.max_usd and resume" in str(caught.value)
    assert caught.value.role == "optimizer"


def test_hard_stop_spans_restarts_and_covers_calls(tmp_path: Path, prices: PriceTable):
    path = tmp_path / "usage.jsonl"
    first = UsageLedger(path, prices)
    for _ in range(6):
        call(first)
    resumed = UsageLedger(path, prices, BudgetSection(max_calls=5, hard_factor=1.2))
    with pytest.raises(BudgetExceeded, match=r"6 calls.*budget\.max_calls"):
        resumed.before_call()


def test_run_refuses_to_start_with_a_usd_cap_and_an_unpriced_model(prices: PriceTable):
    roles = {
        "target": ("openai_compatible", "my-vllm"),
        "optimizer": ("openai", "big-model"),
        "judge": ("anthropic", "mystery"),
    }
    with pytest.raises(ConfigError) as caught:
        check_startable(BudgetSection(max_usd=10.0), prices, roles)
    message = str(caught.value)
    assert "target (openai_compatible/my-vllm)" in message and "judge (anthropic/mystery)" in message
    assert "optimizer" not in message and "allow_unpriced" in message
    check_startable(BudgetSection(max_usd=10.0, allow_unpriced=True), prices, roles)
    check_startable(BudgetSection(max_tokens=1000), prices, roles)  # no USD cap: prices do not matter
    check_startable(
        BudgetSection(max_usd=10.0),
        prices,
        {"target": ("local", None), "optimizer": ("scripted", "x"), "judge": ("openai", "small-model")},
    )
