"""A flow run left *Running* by a process that could not report its end, settled by the run that resumes it.

A run whose Prefect API server was unreachable when it stopped (the server died, or the process was killed)
cannot tell the server: its flow run, and the sub-flow runs of its epochs, stay *Running* in the server's
database. The run directory knows better. Each run writes the id of its flow run into the run directory
(``flow_run.json``); the next run of the same directory holds its lock, so the process of the previous
flow run is gone, and a previous flow run (with its sub-flows) still in a non-final state is set
*Crashed*. The server releases what such a run held (a deployment's concurrency slot among it) when it
reaches a final state.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any
from uuid import UUID

from skillopt.core.atomic import atomic_write_bytes

log = logging.getLogger("skillopt.stale_runs")
progress = logging.getLogger("skillopt.progress")

FLOW_RUN_FILE = "flow_run.json"


def settle_previous_flow_run(run_dir: Path) -> None:
    """Set the previous flow run of ``run_dir`` (and its sub-flows) *Crashed* if the server still has it in
    a non-final state, then record this flow run as the directory's. Only inside a flow run; never raises
    for the server's answers (a previous run on another server, or deleted, is left alone)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    current = str(context.flow_run.id)
    path = run_dir / FLOW_RUN_FILE
    try:
        previous = json.loads(path.read_text(encoding="utf-8")).get("flow_run_id")
    except (OSError, ValueError, AttributeError):
        previous = None
    if previous and previous != current:
        try:
            settled = _crash_unfinished(UUID(str(previous)))
        except Exception as error:  # noqa: BLE001 - best effort: the run goes on either way
            log.debug("could not settle the previous flow run %s: %s", previous, error)
            settled = 0
        if settled:
            progress.info("the previous flow run of this run directory (%s) was still marked running: set "
                          "Crashed (%d flow run(s))", previous, settled)
    atomic_write_bytes(path, json.dumps({"flow_run_id": current}).encode("utf-8"))


def _crash_unfinished(flow_run_id: UUID) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentTaskRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    message = "its process ended without reporting (the Prefect API was unreachable); the run was resumed"
    unfinished = [StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED, StateType.PAUSED]
    settled = 0
    with get_client(sync_client=True) as client:
        parent = client.read_flow_run(flow_run_id)
        # Its sub-flows (the epochs): unfinished flow runs whose parent task run belongs to it.
        children = [
            run for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_task_run_id=FlowRunFilterParentTaskRunId(is_null_=False),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=unfinished))))
            if run.parent_task_run_id is not None
            and _task_run_of(client, run.parent_task_run_id) == flow_run_id
        ]
        for run in [parent, *children]:
            if run.state is not None and not run.state.is_final():
                client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                settled += 1
    return settled


def _task_run_of(client: Any, task_run_id: UUID) -> UUID | None:
    try:
        return client.read_task_run(task_run_id).flow_run_id
    except Exception:  # noqa: BLE001 - a task run the server never got
        return None


__all__ = ["FLOW_RUN_FILE", "settle_previous_flow_run"]
