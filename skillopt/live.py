"""Live progress events: what a terminal's progress display shows while a run goes.

The run reports where it is as structured log records on the ``skillopt.live`` logger: the step
that starts, the stage that runs and how many items it has, each finished item, each model call
(with its tokens and cost). Nothing listens by default (the logger is off, so an event costs one
level check); the command line's live display turns it on for its own run. Logging is the channel
because the run's pieces (flows, tasks in worker threads, the usage ledger) share no object with
the command that started them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

LIVE_LOGGER = "skillopt.live"
#: The attribute of a live log record that holds its event.
EVENT_ATTRIBUTE = "skillopt_live"

#: Stages whose calls belong to the items of a rollout stage (reported by ``stage`` and ``item`` events).
_ITEM_STAGES = frozenset({"rollout", "judge"})

_live = logging.getLogger(LIVE_LOGGER)


def emit(kind: str, **fields: Any) -> None:
    """Report one event (``step``, ``stage``, ``item`` or ``call``) to whoever displays progress."""
    if _live.isEnabledFor(logging.DEBUG):
        _live.debug(kind, extra={EVENT_ATTRIBUTE: {"kind": kind, **fields}})


@dataclass
class LiveState:
    """What the display knows so far, folded from events."""

    epoch: int = 0
    step: int = 0
    total_steps: int = 0
    stage: str = "setting up"
    items_done: int = 0
    items_total: int = 0
    calls: int = 0
    cached: int = 0
    tokens: int = 0
    usd: float = 0.0
    unpriced: int = 0
    stage_calls: dict[str, int] = field(default_factory=dict)

    def apply(self, event: dict[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "step":
            self.epoch, self.step, self.total_steps = event["epoch"], event["step"], event["total_steps"]
        elif kind == "stage":
            self.stage, self.items_done, self.items_total = event["name"], 0, event.get("total", 0)
        elif kind == "item":
            self.items_done += 1
        elif kind == "call":
            if event.get("cache_hit"):
                self.cached += 1
                return
            self.calls += 1
            self.tokens += event.get("tokens", 0)
            if event.get("usd") is None:
                self.unpriced += 1
            else:
                self.usd += event["usd"]
            stage = event.get("stage", "")
            self.stage_calls[stage] = self.stage_calls.get(stage, 0) + 1
            if stage not in _ITEM_STAGES:  # an optimizer stage has no items: its calls say where the run is
                self.stage, self.items_done, self.items_total = stage, 0, 0

    def line(self) -> str:
        """One line: ``epoch 1 · step 3/6 · rollout val 7/12 · 55 calls · 23,100 tokens · $0.0123``."""
        parts = []
        if self.total_steps:
            parts.append(f"epoch {self.epoch} · step {self.step}/{self.total_steps}")
        stage = self.stage
        if self.items_total:
            stage += f" {self.items_done}/{self.items_total} items"
        elif self.stage in self.stage_calls:
            stage += f" ({self.stage_calls[self.stage]} calls)"
        parts.append(stage)
        calls = f"{self.calls} calls"
        if self.cached:
            calls += f" (+{self.cached} from cache)"
        parts += [calls, f"{self.tokens:,} tokens"]
        if self.unpriced and self.unpriced >= self.calls:
            parts.append("cost unknown")
        else:
            parts.append(f"${self.usd:.4f}" + (f" + {self.unpriced} unpriced" if self.unpriced else ""))
        return " · ".join(parts)
