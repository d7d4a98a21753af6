"""The live progress display: events folded into one status line, printed lines above it."""

from __future__ import annotations

import io
import logging

from skillopt.core import live
from skillopt.core.live import LIVE_LOGGER
from skillopt.llm.chat import Usage
from skillopt.llm.pricing import PriceTable
from skillopt.llm.usage import UsageLedger
from skillopt.shell.live_display import LiveDisplay, LiveState, wants_live_display


def call(stage: str, *, tokens: int = 100, usd: float | None = 0.001, cache_hit: bool = False) -> dict:
    """The ``call`` event the usage ledger emits for one model call."""
    ledger = UsageLedger(None, PriceTable.load(None))
    record = ledger.record(role="target", backend="openai_compatible", model_requested="unpriced-model",
                           model_served=None, stage=stage, usage=Usage(prompt_tokens=tokens),
                           latency_s=0.1, attempts=1, status="ok", cache_hit=cache_hit, cost_usd=usd)
    return {"kind": "call", "record": record}


def test_events_fold_into_epoch_step_stage_items_calls_tokens_and_cost():
    state = LiveState()
    assert state.line() == "waiting for Prefect to start the flow run · 0 calls · 0 tokens · $0.0000"
    state.apply({"kind": "step", "epoch": 1, "step": 3, "total_steps": 6})
    state.apply({"kind": "stage", "name": "rollout train", "total": 8})
    for _ in range(5):
        state.apply({"kind": "item"})
        state.apply(call("rollout"))
    state.apply(call("rollout", cache_hit=True))
    assert state.line() == ("epoch 1 · step 3/6 · rollout train 5/8 items · 5 calls (+1 from cache) · "
                            "500 tokens · $0.0050")
    state.apply(call("analyst", tokens=2000, usd=None))
    assert state.line() == ("epoch 1 · step 3/6 · analyst · 6 calls (+1 from cache) · 2,500 tokens · "
                            "$0.0050 + 1 unpriced")


def test_evaluations_side_by_side_count_their_items_together_never_past_their_total():
    """A slow update scores two skills on the same 20 items at once: 38 items done read 38/40, not 38/20 (each
    evaluation's stage event once reset the total while the other's items went on counting)."""
    state = LiveState()
    state.apply({"kind": "stage", "name": "rollout train", "total": 20, "key": "before"})
    state.apply({"kind": "stage", "name": "rollout train", "total": 20, "key": "after"})
    for index in range(38):
        state.apply({"kind": "item", "key": "before" if index % 2 else "after"})
    assert state.line().startswith("rollout train 38/40 items · ")
    state.apply({"kind": "stage", "name": "rollout val", "total": 12, "key": "gate"})
    assert state.line().startswith("rollout train + rollout val 38/52 items · ")  # the first two still run
    for key in ("before", "after"):
        state.apply({"kind": "item", "key": key})
    state.apply({"kind": "stage", "name": "rollout test", "total": 8, "key": "test"})  # the train ones ended
    assert state.line().startswith("rollout val + rollout test 0/20 items · ")


def test_the_eta_comes_from_the_steps_left_and_the_measured_time_per_step():
    now = [100.0]
    state = LiveState(clock=lambda: now[0])
    state.apply(call("rollout"))
    assert state.line().startswith(
        "waiting for Prefect to start the flow run (the baseline's calls have started)")
    state.apply({"kind": "step", "epoch": 1, "step": 1, "total_steps": 6})
    now[0] = 130.0
    assert state.eta_s() is None and "left" not in state.line()  # no step finished yet: nothing measured
    state.apply({"kind": "step", "epoch": 1, "step": 2, "total_steps": 6})  # step 1 took 30 s
    now[0] = 140.0
    # Five steps to go at 30 s each, 10 s of the current one spent.
    assert state.eta_s() == 140.0
    assert state.line().startswith("epoch 1 · step 2/6 · ~2m 20s left in the steps · ")


def test_every_call_unpriced_reads_cost_unknown():
    state = LiveState()
    state.apply(call("merge", tokens=10, usd=None))
    assert state.line().endswith("1 calls · 10 tokens · cost unknown")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_display_listens_only_while_it_runs_and_redacts_what_it_prints(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    stream = _Terminal()
    assert wants_live_display(stream) and not wants_live_display(io.StringIO())
    live.emit("step", epoch=9, step=9, total_steps=9)  # nobody listens: dropped
    with LiveDisplay(stream, lambda text: text.replace("SECRET", "***")) as display:
        live.emit("stage", name="rollout val", total=12)
        live.emit("item")
        display.print("  baseline with SECRET inside")
        assert display.status_line() == "rollout val 1/12 items · 0 calls · 0 tokens · $0.0000"
    assert "baseline with *** inside" in stream.getvalue() and "SECRET" not in stream.getvalue()
    assert not logging.getLogger(LIVE_LOGGER).isEnabledFor(logging.DEBUG)
    monkeypatch.setenv("TERM", "dumb")
    assert not wants_live_display(stream)
