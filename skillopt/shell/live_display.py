"""The command line's live progress display (rich) for ``train``, ``demo`` and ``eval`` on a terminal.

The run's printed lines (run directory, baseline, each step, epoch boundary) scroll above one live
status line: epoch and step, the stage running and its items done, calls, tokens and cost so far
(from the run's ``skillopt.core.live`` events). Not on a terminal (a pipe, a file, CI), nothing of this
is used: one plain line per step, as before.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TextIO

from skillopt.core.live import EVENT_ATTRIBUTE, LIVE_LOGGER
from skillopt.llm.usage import Totals, UsageRecord

#: Stages whose calls belong to the items of a rollout stage (reported by ``stage`` and ``item`` events).
_ITEM_STAGES = frozenset({"rollout", "judge"})
#: What the run waits for until its flow reports a stage: Prefect creating the flow run and its first tasks.
WAITING = "waiting for Prefect to start the flow run"


@dataclass
class LiveState:
    """What the display knows so far, folded from the run's events."""

    epoch: int = 0
    step: int = 0
    total_steps: int = 0
    stage: str = WAITING
    #: The rollout stages running now, by the key their events carry: [name, items done, items total].
    #: Evaluations run side by side (a slow update's, the final checks), so several can be open at once.
    item_stages: dict[Any, list[Any]] = field(default_factory=dict)
    totals: Totals = field(default_factory=Totals)
    clock: Callable[[], float] = time.monotonic
    #: When the first step this display saw began (and its number), and when the current one began.
    first_step: tuple[int, float] | None = None
    step_started: float | None = None

    def apply(self, event: dict[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "step":
            self.epoch, self.step, self.total_steps = event["epoch"], event["step"], event["total_steps"]
            now = self.clock()
            self.step_started = now
            if self.first_step is None:
                self.first_step = (self.step, now)
        elif kind == "stage":
            self.item_stages = {key: stage for key, stage in self.item_stages.items() if stage[1] < stage[2]}
            self.item_stages[event.get("key")] = [event["name"], 0, event.get("total", 0)]
            self.stage = event["name"]
        elif kind == "item":
            if (stage := self.item_stages.get(event.get("key"))) is not None:
                stage[1] += 1
        elif kind == "call":
            record: UsageRecord = event["record"]
            self.totals.add(record)
            if not record.cache_hit and record.stage not in _ITEM_STAGES:
                # An optimizer stage has no items: its calls say where the run is.
                self.stage, self.item_stages = record.stage, {}

    @property
    def items(self) -> tuple[str, int, int] | None:
        """The rollout stages running now as one: their names joined, items done and in all."""
        if not self.item_stages:
            return None
        names = list(dict.fromkeys(name for name, _, _ in self.item_stages.values()))
        return (" + ".join(names), sum(done for _, done, _ in self.item_stages.values()),
                sum(total for _, _, total in self.item_stages.values()))

    def eta_s(self) -> float | None:
        """Seconds until the last step ends, from the plan (steps left) and the measured time per step so far
        (known once a step has finished); None before that."""
        if self.first_step is None or self.step_started is None or self.step <= self.first_step[0]:
            return None
        first, since = self.first_step
        per_step = (self.step_started - since) / (self.step - first)
        left = per_step * (self.total_steps - self.step + 1) - (self.clock() - self.step_started)
        return max(left, 0.0)

    def line(self) -> str:
        """One line, e.g. ``epoch 1 · step 3/6 · ~1m 20s left · rollout val 7/12 items · 55 calls · 23,100
        tokens · $0.0123``."""
        totals = self.totals
        parts = [f"epoch {self.epoch} · step {self.step}/{self.total_steps}"] if self.total_steps else []
        eta = self.eta_s()
        if eta is not None:
            parts.append(f"~{_duration(eta)} left in the steps")
        stage = self.stage
        if (items := self.items) is not None and items[2]:
            stage = f"{items[0]} {items[1]}/{items[2]} items"
        elif stage == WAITING and totals.calls:
            stage += " (the baseline's calls have started)"
        parts.append(stage)
        calls = f"{totals.calls} calls" + (f" (+{totals.cache_hits} from cache)" if totals.cache_hits else "")
        parts += [calls, f"{totals.tokens:,} tokens"]
        if totals.unpriced_calls and totals.unpriced_calls >= totals.calls:
            parts.append("cost unknown")
        else:
            unpriced = f" + {totals.unpriced_calls} unpriced" if totals.unpriced_calls else ""
            parts.append(f"${totals.usd:.4f}{unpriced}")
        return " · ".join(parts)


def _duration(seconds: float) -> str:
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def wants_live_display(stream: TextIO) -> bool:
    """A live display only on an interactive terminal that can draw one."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM", "") != "dumb"


class LiveDisplay:
    """Prints the run's lines above a status line that redraws a few times a second.

    ``redact`` is applied to every printed line. A context manager; ``stop`` may also be called
    from another thread (a forced exit) to give the terminal its cursor back.
    """

    def __init__(self, stream: TextIO, redact: Callable[[str], str]) -> None:
        from rich.console import Console
        from rich.live import Live

        self.redact = redact
        self.state = LiveState()
        self._lock = threading.Lock()
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self._live = Live(console=self.console, refresh_per_second=4, transient=True,
                          get_renderable=self._render, redirect_stdout=False, redirect_stderr=False)
        self._handler = _EventHandler(self)
        self._logger = logging.getLogger(LIVE_LOGGER)

    def __enter__(self) -> LiveDisplay:
        self._logger.addHandler(self._handler)
        self._logger.setLevel(logging.DEBUG)
        self._logger.propagate = False
        self._live.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        self._live.stop()
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(logging.NOTSET)

    def print(self, text: str = "") -> None:
        """One line above the status line (the run's progress lines come here)."""
        from rich.text import Text

        self.console.print(Text(self.redact(text)))

    def apply(self, event: dict) -> None:
        with self._lock:
            self.state.apply(event)

    def status_line(self) -> str:
        with self._lock:
            return self.state.line()

    def _render(self):  # noqa: ANN202 - a rich renderable
        from rich.text import Text

        return Text(self.status_line(), style="bold")


class _EventHandler(logging.Handler):
    def __init__(self, display: LiveDisplay) -> None:
        super().__init__(logging.DEBUG)
        self.display = display

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, EVENT_ATTRIBUTE, None)
        if isinstance(event, dict):
            self.display.apply(event)
