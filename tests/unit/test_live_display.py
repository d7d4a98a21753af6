"""The live progress display: events folded into one status line, printed lines above it."""

from __future__ import annotations

import io
import logging

from skillopt import live
from skillopt.live import LIVE_LOGGER, LiveState
from skillopt.live_display import LiveDisplay, wants_live_display


def test_events_fold_into_epoch_step_stage_items_calls_tokens_and_cost():
    state = LiveState()
    assert state.line() == "setting up · 0 calls · 0 tokens · $0.0000"
    state.apply({"kind": "step", "epoch": 1, "step": 3, "total_steps": 6})
    state.apply({"kind": "stage", "name": "rollout train", "total": 8})
    for _ in range(5):
        state.apply({"kind": "item"})
        state.apply({"kind": "call", "stage": "rollout", "tokens": 100, "usd": 0.001, "cache_hit": False})
    state.apply({"kind": "call", "stage": "rollout", "tokens": 0, "usd": 0.0, "cache_hit": True})
    assert state.line() == ("epoch 1 · step 3/6 · rollout train 5/8 items · 5 calls (+1 from cache) · 500 tokens · "
                            "$0.0050")
    state.apply({"kind": "call", "stage": "analyst", "tokens": 2000, "usd": None, "cache_hit": False})
    assert state.line() == "epoch 1 · step 3/6 · analyst (1 calls) · 6 calls (+1 from cache) · 2,500 tokens · " \
                           "$0.0050 + 1 unpriced"


def test_every_call_unpriced_reads_cost_unknown():
    state = LiveState()
    state.apply({"kind": "call", "stage": "merge", "tokens": 10, "usd": None, "cache_hit": False})
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
