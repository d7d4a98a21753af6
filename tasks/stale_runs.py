"""A flow run left *Running* by a process that could not report its end, settled by the run that resumes it.

A run whose Prefect API server was unreachable when it stopped (the server died, or the process was killed)
cannot tell the server: its flow run, and the sub-flow runs of its epochs, stay *Running* in the server's
database. The run directory knows better. Each run writes the id of its flow run into the run directory
(``flow_run.json``), and each epoch sub-flow adds its own id as it starts; the next run of the same
directory holds its lock, so the process of the previous flow run is gone, and a previous flow run (with
its sub-flows: those recorded, and those the server lists under it) still in a non-final state is set
*Crashed*. The server releases what such a run held (a deployment's concurrency slot among it) when it
reaches a final state.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from uuid import UUID

from skillopt.core.atomic import atomic_write_bytes

log = logging.getLogger("skillopt.stale_runs")
progress = logging.getLogger("skillopt.progress")

FLOW_RUN_FILE = "flow_run.json"
#: The states of a flow run that something must still end (Prefect's ``StateType`` values).
UNFINISHED = ["RUNNING", "PENDING", "SCHEDULED", "PAUSED", "CANCELLING"]
RESUMED = ("its process ended without reporting (killed, or stopped while the Prefect API was away); the "
           "run was resumed")
ABANDONED = "its process is gone without reporting (killed, or stopped while the Prefect API was away)"


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
    recorded = _recorded(path)
    previous = recorded.get("flow_run_id")
    if previous and previous != current:
        try:
            subflows = [UUID(str(run_id)) for run_id in recorded.get("sub_flow_run_ids", [])]
            settled = _crash_unfinished(UUID(str(previous)), subflows)
        except Exception as error:  # noqa: BLE001 - best effort: the run goes on either way
            log.debug("could not settle the previous flow run %s: %s", previous, error)
            settled = 0
        if settled:
            progress.info("the previous flow run of this run directory (%s) was still marked running: set "
                          "Crashed (%d flow run(s))", previous, settled)
    atomic_write_bytes(path, json.dumps({"flow_run_id": current}).encode("utf-8"))
    _crash_on_forced_exit(context.flow_run.id, str(context.client.api_url), run_dir)


#: How long a forced exit waits for the server to take the run's Crashed state (an unreachable server
#: must not hold the exit).
EXIT_REPORT_S = 3.0


def _crash_on_forced_exit(flow_run_id: UUID, api_url: str, run_dir: Path) -> None:
    """A forced exit (the first Ctrl-C's deadline while model calls are still in flight, a second Ctrl-C)
    ends the process before Prefect reports the flow run, which the server would then show *Running* for
    good: the active guard sets it (and its sub-flows) *Crashed* with its message on the way out.

    ``api_url`` is the address the flow's own client reports to. The exiting thread has no settings of the
    run, and Prefect's temporary server is found through no setting at all: a client made from the settings
    there would start a new temporary server in the exiting process (which then outlives it)."""
    from skillopt.shell.interrupt import active_guard

    guard = active_guard()
    if guard is None:
        return

    def crash() -> None:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        recorded = _recorded(run_dir / FLOW_RUN_FILE)
        subflows = [UUID(str(run_id)) for run_id in recorded.get("sub_flow_run_ids", [])]
        try:  # a client of its own: the flow's may be closed by now
            with temporary_settings(updates={PREFECT_API_URL: api_url}):
                _crash_unfinished(flow_run_id, subflows, guard.message())
        except Exception as error:  # noqa: BLE001 - exiting anyway; a resume settles the run
            log.debug("could not set flow run %s Crashed on the way out: %s", flow_run_id, error)

    def report() -> None:
        worker = threading.Thread(target=crash, name="skillopt-report-crash", daemon=True)
        worker.start()
        worker.join(EXIT_REPORT_S)

    guard.add_cleanup(report, first=True)


def settle_abandoned_flow_runs(runs_dirs: Iterable[Path]) -> list[str]:
    """Set *Crashed* the flow runs (with their sub-flows) the server still has in a non-final state whose
    run directory, under one of ``runs_dirs``, no live process holds: the process is gone, killed or stopped
    while the server was away, and nothing else will ever end them. Returns one line per run settled.

    ``skillopt serve`` calls it as it starts, so that a deployment run left *Running* gives back its
    deployment's slot. A run directory that is not found here (another machine's) is left alone."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from skillopt.run.runs import RunDir

    recorded: dict[UUID, tuple[Path, list[UUID]]] = {}
    for runs_dir in runs_dirs:
        for path in sorted(Path(runs_dir).glob(f"*/{FLOW_RUN_FILE}")):
            record = _recorded(path)
            try:
                recorded[UUID(str(record["flow_run_id"]))] = (
                    path.parent, [UUID(str(run_id)) for run_id in record.get("sub_flow_run_ids", [])])
            except (KeyError, TypeError, ValueError):
                continue
    if not recorded:
        return []
    with get_client(sync_client=True) as client:
        unfinished = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=list(recorded)), state=_unfinished()))
    lines = []
    for run in unfinished:
        run_dir, subflows = recorded[run.id]
        if RunDir(run_dir).in_use():
            continue
        settled = _crash_unfinished(run.id, subflows, ABANDONED)
        if settled:
            lines.append(f"flow run {run.name} ({run.id}) was left {run.state_name} by a process that is "
                         f"gone (run directory {run_dir}): set Crashed ({settled} flow run(s)), which frees "
                         "its deployment's slot")
    return lines


def record_sub_flow_run(run_dir: Path) -> None:
    """Add the current (sub-)flow run to ``run_dir``'s record, so that a resume settles it even when the
    server cannot tell whose sub-flow it is. Only inside a flow run of the directory's recorded flow."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    path = run_dir / FLOW_RUN_FILE
    recorded = _recorded(path)
    if not recorded.get("flow_run_id"):
        return
    ids = [str(run_id) for run_id in recorded.get("sub_flow_run_ids", [])]
    ids.append(str(context.flow_run.id))
    atomic_write_bytes(path, json.dumps({**recorded, "sub_flow_run_ids": ids}).encode("utf-8"))


def _recorded(path: Path) -> dict[str, Any]:
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def _crash_unfinished(flow_run_id: UUID, subflows: list[UUID], message: str = RESUMED) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.states import Crashed

    settled: set[UUID] = set()
    with get_client(sync_client=True) as client:
        # Twice: a read that failed (a busy server) or a sub-flow the server committed late is caught by the
        # second look; a run already settled is not counted again.
        for _ in range(2):
            parent = client.read_flow_run(flow_run_id)
            recorded = [run for run in (_flow_run(client, run_id) for run_id in subflows) if run is not None]
            # Sub-flows created but never started (so never recorded): the server finds the unfinished flow
            # runs whose parent task run belongs to it.
            listed = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]), state=_unfinished()))
            runs = {run.id: run for run in [parent, *recorded, *listed]}
            for run in runs.values():
                if run.id not in settled and run.state is not None and not run.state.is_final():
                    client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                    settled.add(run.id)
    return len(settled)


def _unfinished() -> Any:
    from prefect.client.schemas.filters import FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    return FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType(name) for name in UNFINISHED]))


def _flow_run(client: Any, flow_run_id: UUID) -> Any:
    try:
        return client.read_flow_run(flow_run_id)
    except Exception as error:  # noqa: BLE001 - a flow run the server never got
        log.debug("could not read flow run %s: %s", flow_run_id, error)
        return None


__all__ = ["FLOW_RUN_FILE", "record_sub_flow_run", "settle_abandoned_flow_runs", "settle_previous_flow_run"]
