"""skillopt's runs as the Prefect API knows them: ``skillopt runs``, ``skillopt runs logs`` and what ``serve``
prints for each run it picks up.

A run of a ``skill-train/<benchmark>`` deployment is executed only while some process serves that deployment
(``skillopt serve``). With none, Prefect still accepts ``prefect deployment run …`` and the nightly schedule
still creates runs; they wait, turn ``Late`` and say nothing more. ``recent_runs`` lists the recent runs with
their state, best gate score (from the run's progress artifact) and UI link, and marks each Late run whose
deployment no process has polled lately, with the ``skillopt serve`` command that would run it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

#: The flows whose runs are skillopt's.
FLOWS = ("skill-train", "skill-eval")
#: A deployment counts as served when a process polled it this recently (``skillopt serve`` polls every 10 s
#: by default; Prefect itself marks a deployment not ready after 60 s without a poll).
SERVED_WITHIN = timedelta(seconds=60)
_BEST = re.compile(r"^\| best \| ([0-9.]+) \|$", re.M)
#: Rows per request: a Prefect server answers at most ``PREFECT_API_DEFAULT_LIMIT`` (200 by default) at once.
PAGE = 200


@dataclass(frozen=True)
class RunRow:
    """One flow run as ``skillopt runs`` shows it."""

    id: str
    name: str
    flow: str
    deployment: str | None
    state: str
    best: float | None
    link: str
    #: For a Late run nobody serves: the command that would run it.
    unserved_fix: str | None = None
    #: For a Failed or Crashed run: why, as its final state says (the first line).
    reason: str | None = None


def ui_url() -> str | None:
    """The UI of the Prefect API in use, or None when it is not known (e.g. a temporary server)."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    url = settings.ui_url or (settings.api.url.removesuffix("/api") if settings.api.url else None)
    return url.rstrip("/") if url else None


def run_link(flow_run_id: str, base: str | None = None) -> str:
    """The flow run's page in the Prefect UI."""
    base = base or ui_url() or ""
    return f"{base}/runs/flow-run/{flow_run_id}"


def follow_hint(flow_run_id: str) -> str:
    """How to follow a run's log from a terminal."""
    return f"skillopt runs logs {flow_run_id} --follow"


def best_from_progress(markdown: str | None) -> float | None:
    """The best gate score in a progress artifact's description (``| best | 0.917 |``), if any."""
    match = _BEST.search(markdown or "")
    return float(match.group(1)) if match else None


def serve_command(benchmark: str, parameters: Mapping[str, Any]) -> str:
    """The ``skillopt serve`` command that serves ``benchmark`` with the deployment's default parameters."""
    parts = ["skillopt serve", benchmark]
    if parameters.get("data"):
        parts += ["--data", str(parameters["data"])]
    for kind in ("backend", "model"):
        if parameters.get(kind):
            parts += [f"--{kind}", str(parameters[kind])]
        for role in ("target", "optimizer", "judge"):
            if parameters.get(f"{role}_{kind}"):
                parts += [f"--{role}-{kind}", str(parameters[f"{role}_{kind}"])]
    if parameters.get("config_file"):
        parts += ["-c", str(parameters["config_file"])]
    for override in parameters.get("overrides") or []:
        parts += ["-o", str(override)]
    return " ".join(parts)


def _served(deployment: Any, now: datetime) -> bool:
    polled = getattr(deployment, "last_polled", None)
    return polled is not None and now - polled <= SERVED_WITHIN


def _pages(read: Callable[[int, int], list[Any]], limit: int) -> list[Any]:
    """Up to ``limit`` rows of ``read(offset, count)``, a page at a time."""
    rows: list[Any] = []
    while len(rows) < limit:
        count = min(PAGE, limit - len(rows))
        page = read(len(rows), count)
        rows += page
        if len(page) < count:
            break
    return rows


@dataclass(frozen=True)
class Upcoming:
    """A deployment's runs scheduled to start later (its schedule's next ones, or runs given a delay)."""

    deployment: str
    next_start: datetime
    count: int


def _top_level_runs(client: Any, limit: int, *, scheduled: bool) -> list[Any]:
    """Up to ``limit`` top-level runs of skillopt's flows, latest expected start first: those in a Scheduled
    state (Late ones included) with ``scheduled``, the others without."""
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterParentTaskRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    types = (FlowRunFilterStateType(any_=[StateType.SCHEDULED]) if scheduled
             else FlowRunFilterStateType(not_any_=[StateType.SCHEDULED]))
    return _pages(lambda offset, count: client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=list(FLOWS))),
        flow_run_filter=FlowRunFilter(parent_task_run_id=FlowRunFilterParentTaskRunId(is_null_=True),
                                      state=FlowRunFilterState(type=types)),
        sort=FlowRunSort.EXPECTED_START_TIME_DESC, offset=offset, limit=count), limit)


def _expected_start(run: Any) -> datetime:
    return run.expected_start_time or run.start_time or run.created or datetime.min.replace(tzinfo=UTC)


def recent_runs(client: Any, *, limit: int = 10, now: datetime | None = None,
                upcoming: list[Upcoming] | None = None) -> list[RunRow]:
    """The ``limit`` most recent top-level runs of skillopt's flows, newest first (``client``: a sync
    Prefect client). Runs scheduled to start later are not among them (a served deployment's schedule
    keeps its next few runs waiting): they are summed up per deployment into ``upcoming``, if given."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterType

    now = now or datetime.now(UTC)
    waiting = _top_level_runs(client, PAGE, scheduled=True)
    later = [run for run in waiting if _expected_start(run) > now]
    due = [run for run in waiting if _expected_start(run) <= now]  # about to run, or Late
    runs = [*_top_level_runs(client, limit, scheduled=False), *due]
    runs = sorted(runs, key=_expected_start, reverse=True)[:limit]
    deployments = {str(d.id): d for d in (client.read_deployment(run.deployment_id)
                                          for run in {r.deployment_id: r for r in [*runs, *later]
                                                      if r.deployment_id}.values())}
    flows = {str(f.id): f.name for f in (client.read_flow(i) for i in {r.flow_id for r in [*runs, *later]})}
    if upcoming is not None:
        upcoming.extend(_upcoming(later, deployments, flows))
    bests: dict[str, float | None] = {}
    for first in range(0, len(runs), PAGE):
        # Only the progress artifacts (one per run): a run's other artifacts, a new version of some every
        # step, would fill the server's page.
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[r.id for r in runs[first:first + PAGE]]),
            type=ArtifactFilterType(any_=["progress"])), limit=PAGE)
        for artifact in artifacts:
            if artifact.key and artifact.key.endswith("-progress") and artifact.flow_run_id:
                bests[str(artifact.flow_run_id)] = best_from_progress(artifact.description)
    base = ui_url()
    rows = []
    for run in runs:
        deployment, flow = _deployment_of(run, deployments), flows.get(str(run.flow_id), "?")
        state = run.state.name if run.state else "?"
        fix = None
        if deployment is not None and state == "Late" and not _served(deployment, now):
            benchmark = str((deployment.parameters or {}).get("benchmark") or deployment.name)
            fix = serve_command(benchmark, deployment.parameters or {})
        reason = None
        if run.state is not None and run.state.type.value in ("FAILED", "CRASHED") and run.state.message:
            reason = run.state.message.strip().splitlines()[0]
        rows.append(RunRow(id=str(run.id), name=run.name, flow=flow,
                           deployment=_label(flow, deployment),
                           state=state, best=bests.get(str(run.id)), link=run_link(str(run.id), base),
                           unserved_fix=fix, reason=reason))
    return rows


def _deployment_of(run: Any, deployments: Mapping[str, Any]) -> Any:
    return deployments.get(str(run.deployment_id)) if run.deployment_id else None


def _label(flow: str, deployment: Any) -> str | None:
    """A deployment as ``skillopt runs`` names it (``skill-train/demo``); None for a run without one."""
    return f"{flow}/{deployment.name}" if deployment is not None else None


def _upcoming(later: list[Any], deployments: Mapping[str, Any], flows: Mapping[str, str]) -> list[Upcoming]:
    by_deployment: dict[str, list[datetime]] = {}
    for run in later:
        flow = flows.get(str(run.flow_id), "?")
        name = _label(flow, _deployment_of(run, deployments)) or flow
        by_deployment.setdefault(name, []).append(_expected_start(run))
    return [Upcoming(deployment=name, next_start=min(starts), count=len(starts))
            for name, starts in sorted(by_deployment.items(), key=lambda item: min(item[1]))]


#: How much of a failed run's reason ``skillopt runs`` shows (``skillopt runs logs`` has all of it).
REASON_CHARS = 200


def _shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def format_runs(rows: list[RunRow], upcoming: Sequence[Upcoming] = ()) -> list[str]:
    """The lines of ``skillopt runs``: one per run, then one note per deployment with Late runs nobody
    serves, then one line per deployment with runs scheduled to start later."""
    later = [f"next: {item.deployment} at {item.next_start.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
             + (f" ({item.count} runs scheduled)" if item.count > 1 else "") for item in upcoming]
    if not rows:
        return ["no skillopt runs on this Prefect server yet (skillopt demo, skillopt train, or "
                "prefect deployment run skill-train/<benchmark> with skillopt serve running)", *later]
    lines = []
    for row in rows:
        best = f"best {row.best:.3f}" if row.best is not None else "best –"
        late = "  ← nothing serves it" if row.unserved_fix else ""
        lines.append(f"{row.state:<10} {row.name:<44} {best:<10} {row.deployment or 'command line':<26} "
                     f"{row.link}{late}")
        if row.reason:
            lines.append(f"{'':<10} why: {_shortened(row.reason, REASON_CHARS)}")
    fixes: dict[str, tuple[str, list[str]]] = {}
    for row in rows:
        if row.unserved_fix and row.deployment:
            fixes.setdefault(row.deployment, (row.unserved_fix, []))[1].append(row.name)
    within = int(SERVED_WITHIN.total_seconds())
    for deployment, (command, names) in fixes.items():
        lines.append(f"Late: {', '.join(names)} of {deployment} will wait until a process serves the "
                     f"deployment (nothing has polled it in the last {within} s); run: {command}")
    return [*lines, *later]


def flow_run_id_of(client: Any, reference: str) -> str:
    """The id of the flow run ``reference`` names: its id, or its name as ``skillopt runs`` shows it (the
    newest run of that name). ``prefect.exceptions.ObjectNotFound`` when there is none."""
    import uuid

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.exceptions import ObjectNotFound

    try:
        return str(uuid.UUID(reference))
    except ValueError:
        pass
    runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[reference])),
                                 sort=FlowRunSort.START_TIME_DESC, limit=1)
    if not runs:
        raise ObjectNotFound(http_exc=Exception(f"no flow run named {reference}"))
    return str(runs[0].id)


def follow_logs(client: Any, flow_run_id: str, emit: Callable[[str], None], *, follow: bool,
                poll_s: float = 1.0) -> str:
    """Print the run's log lines (the training story) as ``prefect flow-run logs`` does; with ``follow``, keep
    printing new lines until the run is in a final state. Returns the run's final (or current) state name."""
    for line in _log_lines(client, flow_run_id, follow=follow, poll_s=poll_s):
        emit(line)
    run = client.read_flow_run(flow_run_id)
    return run.state.name if run.state else "?"


def _log_lines(client: Any, flow_run_id: str, *, follow: bool, poll_s: float) -> Iterator[str]:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    seen = 0
    while True:
        run = client.read_flow_run(flow_run_id)
        final = run.state is not None and run.state.is_final()
        while True:
            page = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])),
                                    sort=LogSort.TIMESTAMP_ASC, limit=200, offset=seen)
            for log in page:
                yield f"{log.timestamp:%H:%M:%S} {log.message}"
            seen += len(page)
            if len(page) < 200:
                break
        if not follow or final:
            return
        time.sleep(poll_s)


class PickedUpRuns:
    """``serve``'s watcher: once per run of the served deployments that starts, ``emit`` the lines that say
    where to watch it (its UI page and the command that follows its log). A run is announced once it is
    Running: by then the flow has named it after its run directory."""

    def __init__(self, deployment_names: list[str], emit: Callable[[str], None], *,
                 poll_s: float = 2.0) -> None:
        self.names = deployment_names
        self.emit = emit
        self.poll_s = poll_s
        self.seen: set[str] = set()

    def poll_once(self, client: Any) -> None:
        from prefect.client.schemas.filters import (
            DeploymentFilter,
            DeploymentFilterName,
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
        )
        from prefect.client.schemas.objects import StateType

        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=self.names)),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                any_=[StateType.RUNNING]))),
            limit=50)
        for run in runs:
            if str(run.id) in self.seen:
                continue
            self.seen.add(str(run.id))
            self.emit(f"run {run.name} started: {run_link(str(run.id))}")
            # Only skillopt's command: it finds the local server, where `prefect flow-run logs` needs
            # PREFECT_API_URL set (without it, it starts a temporary server of its own).
            self.emit(f"  follow its log: {follow_hint(str(run.id))}")

    def watch(self, stop: Any) -> None:
        """Poll until ``stop`` (a ``threading.Event``) is set; a failed poll is tried again at the next."""
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            while not stop.wait(self.poll_s):
                try:
                    self.poll_once(client)
                except Exception:  # noqa: BLE001 - a hint printer must never stop serving
                    continue
