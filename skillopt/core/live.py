"""Live progress events: what a terminal's progress display shows while a run goes.

The run reports where it is as structured log records on the ``skillopt.core.live`` logger: the step
that starts, the stage that runs and how many items it has, each finished item, each model call
(with its tokens and cost). Nothing listens by default (the logger is off, so an event costs one
level check); the command line's live display turns it on for its own run. Logging is the channel
because the run's pieces (flows, tasks in worker threads, the usage ledger) share no object with
the command that started them.
"""

from __future__ import annotations

import logging
from typing import Any

LIVE_LOGGER = "skillopt.core.live"
#: The attribute of a live log record that holds its event.
EVENT_ATTRIBUTE = "skillopt_live"

_live = logging.getLogger(LIVE_LOGGER)


def emit(kind: str, **fields: Any) -> None:
    """Report one event to whoever displays progress: ``step`` (epoch, step, total_steps), ``stage`` (name,
    total items, a key its items name), ``item`` (one finished, with its stage's key), ``call`` (record: the
    ``UsageRecord`` of one model call)."""
    if _live.isEnabledFor(logging.DEBUG):
        _live.debug(kind, extra={EVENT_ATTRIBUTE: {"kind": kind, **fields}})
