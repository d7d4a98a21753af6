"""Publishing what a person sees in the Prefect UI.

The content is built by ``skillopt.run.artifacts`` (pure); this module only hands it to Prefect under
stable keys ``<bench>-<run>-<kind>``, so each key shows its latest version and its history.
Artifacts are a view: failing to publish one is logged, never fatal to training.

Each artifact is an API round trip, so a run's artifacts are sent by a few background threads per run
(``Publisher``) and never hold the training loop: the content is built at once (it is a snapshot of that
moment), the sending is queued, each key's versions in the order they were made. The threads run in the
context of the flow run that published first (the top-level ``skill-train``), so every artifact of a run
is attached to that flow run. ``published(run)`` sends what is still queued before the flow returns.

The threads share one Prefect API client, opened with the first artifact and closed by ``published``.
Prefect's ``create_*_artifact`` functions open a new client for every artifact: a new TLS context (its CA
bundle read and parsed, 24 ms of a core, even for an ``http://`` API) and a new connection each time. At
the end of a run, eight of them took the server 0.1-0.25 s apiece beside the run's last state changes.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from prefect.artifacts import Artifact, LinkArtifact, MarkdownArtifact, ProgressArtifact, TableArtifact
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate
from prefect.utilities.context import get_task_and_flow_run_ids

from skillopt.core.records import StepRecord
from skillopt.run.artifacts import (
    COST,
    EDITS,
    GATES,
    PROGRESS,
    PROMOTION,
    REPORT,
    SKILL_DIFF,
    artifact_key,
    cost_table,
    edits_table,
    gate_table,
    progress_markdown,
    progress_percent,
    report_url,
    skill_diff_markdown,
)
from skillopt.run.assembly import Run
from skillopt.run.registry import RegistryEvent, promotion_markdown

log = logging.getLogger("skillopt.run.artifacts")


#: How long the end of a flow waits for its queued artifacts to reach the API.
DRAIN_TIMEOUT_S = 30.0
#: Threads sending one run's artifacts (a run has up to seven artifact keys).
LANES = 3


def _key(ctx: Run, kind: str) -> str:
    return artifact_key(ctx.benchmark.id, ctx.run_name, kind)


def _publish(kind: str, create: Any, **kwargs: Any) -> Any:
    try:
        return create(**kwargs)
    except Exception as error:  # noqa: BLE001 - a view must not stop training; the run dir has everything
        log.warning("could not publish the %s artifact: %s", kind, error)
        return None


class Publisher:
    """One run's artifacts, sent from background threads in the publishing flow run's context: the versions
    of one key in the order they were made (the newest must end up the latest), different keys side by side.

    One thread sending everything in turn held the end of a run 0.2-0.45 s for the last step's and the
    final stage's artifacts (five to eight round trips to a local server busy with the run's events)."""

    def __init__(self, lanes: int = LANES) -> None:
        context = contextvars.copy_context()
        self._client: Any = None  # Prefect's SyncPrefectClient, opened by the first artifact sent
        self._client_lock = threading.Lock()
        self._queues: list[queue.SimpleQueue[Callable[[], None] | None]] = [
            queue.SimpleQueue() for _ in range(max(1, lanes))
        ]
        self._lanes: dict[str, int] = {}  # artifact key -> its queue, given out in turn
        self._lanes_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, args=(jobs, context.copy()), name=f"skillopt-artifacts-{i}",
                             daemon=True)
            for i, jobs in enumerate(self._queues)
        ]
        #: The run's progress artifact once created (it is then updated in place).
        self.progress_id: UUID | None = None
        self._progress_sent = 0
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _work(jobs: queue.SimpleQueue[Callable[[], None] | None], context: contextvars.Context) -> None:
        while (job := jobs.get()) is not None:
            context.run(job)

    def _put(self, key: str, job: Callable[[], None]) -> None:
        with self._lanes_lock:
            lane = self._lanes.setdefault(key, len(self._lanes) % len(self._queues))
        self._queues[lane].put(job)

    def send(self, kind: str, create: Any, **kwargs: Any) -> None:
        """Queue ``create(**kwargs)`` (e.g. ``self.table``) behind the versions of ``kwargs["key"]`` already
        queued."""
        self._put(kwargs["key"], lambda: _publish(kind, create, **kwargs))

    def client(self) -> Any:
        """The lanes' Prefect client, opened on first use (in a lane: the publishing flow run's settings)."""
        with self._client_lock:
            if self._client is None:  # once per run
                from prefect.client.orchestration import get_client

                self._client = get_client(sync_client=True).__enter__()
            return self._client

    def create(self, artifact: Artifact) -> UUID:
        """Create ``artifact`` through the lanes' client, attached to the current flow (and task) run, as
        Prefect's ``create_*_artifact`` functions do; returns its id."""
        task_run_id, flow_run_id = get_task_and_flow_run_ids()
        request = ArtifactCreate(type=artifact.type, key=artifact.key, description=artifact.description,
                                 task_run_id=task_run_id, flow_run_id=flow_run_id,
                                 data=artifact.format(_sync=True))  # type: ignore[call-arg]
        return self.client().create_artifact(artifact=request).id

    def markdown(self, *, key: str, markdown: str, description: str | None = None) -> UUID:
        return self.create(MarkdownArtifact(key=key, markdown=markdown, description=description))

    def table(self, *, key: str, table: Any, description: str | None = None) -> UUID:
        return self.create(TableArtifact(key=key, table=table, description=description))

    def link(self, *, key: str, link: str, link_text: str | None = None, description: str | None = None
             ) -> UUID:
        return self.create(LinkArtifact(key=key, link=link, link_text=link_text, description=description))

    def progress(self, *, key: str, progress: float, description: str | None = None) -> UUID:
        return self.create(ProgressArtifact(key=key, progress=progress, description=description))

    def update_progress(self, *, artifact_id: UUID, progress: float, description: str | None = None) -> None:
        data = ProgressArtifact(progress=progress).format(_sync=True)  # type: ignore[call-arg]
        update = (ArtifactUpdate(data=data, description=description) if description  # as Prefect does
                  else ArtifactUpdate(data=data))
        self.client().update_artifact(artifact_id=artifact_id, artifact=update)

    def send_progress(self, progress: float, description: str, key: str) -> None:
        """Create the progress artifact, or update it in place; an update still queued behind a newer one is
        dropped (the newer one says everything it would)."""
        with self._lanes_lock:
            self._progress_sent += 1
            number = self._progress_sent

        def job() -> None:
            if number != self._progress_sent:
                return
            if self.progress_id is None:
                created = _publish(PROGRESS, self.progress, progress=progress, key=key,
                                   description=description)
                self.progress_id = None if created is None else UUID(str(created))
            else:
                _publish(PROGRESS, self.update_progress, artifact_id=self.progress_id, progress=progress,
                         description=description)

        self._put(key, job)

    def close(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Send what is queued (for up to ``timeout_s`` in all), stop the threads, close the client."""
        for jobs in self._queues:
            jobs.put(None)
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self._threads):
            log.warning("artifacts still queued after %.0f s were not published", timeout_s)
            return  # a lane may still use the client
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.__exit__(None, None, None)
            except Exception as error:  # noqa: BLE001 - closing a view's connection must not fail the run
                log.debug("closing the artifacts' Prefect client: %s", error)


_publishers: weakref.WeakKeyDictionary[Run, Publisher] = weakref.WeakKeyDictionary()
_publishers_lock = threading.Lock()


def _publisher(ctx: Run) -> Publisher:
    with _publishers_lock:
        if ctx not in _publishers:
            _publishers[ctx] = Publisher()
        return _publishers[ctx]


@contextmanager
def published(ctx: Run) -> Iterator[None]:
    """Around a flow's work on ``ctx``: its artifacts are all sent (or given up on) when the work ends."""
    try:
        yield
    finally:
        with _publishers_lock:
            publisher = _publishers.pop(ctx, None)
        if publisher is not None:
            publisher.close()


def publish_progress(ctx: Run, step: int, total_steps: int, epoch: int, epochs: int, current: float,
                     best: float, *, finished: bool = False, stopped: str | None = None,
                     last_step: StepRecord | None = None, totals: Mapping[str, Any] | None = None) -> None:
    """Prefect's progress artifact of the run, created once and then updated in place: the share of
    steps done, with the epoch, step and current/best gate scores as its description (``finished``:
    the run's final figures; ``stopped``: why it ended early), and the last step's optimizer replies and
    error rows."""
    spent = ctx.clients.ledger.totals()
    usd = f", ${spent.usd:,.4f}" if spent.usd else ""
    description = progress_markdown(epoch, epochs, step, total_steps, current, best, finished=finished,
                                    stopped=stopped, last_step=last_step, totals=totals,
                                    spend=f"{spent.calls:,} model calls, {spent.tokens:,} tokens{usd}")
    _publisher(ctx).send_progress(progress_percent(step, total_steps), description, _key(ctx, PROGRESS))


def publish_cost(ctx: Run) -> None:
    """Usage per stage (calls, tokens, USD) with a total row, once the run ends (each publication is a card
    of its own in the run's Artifacts tab; the progress artifact carries the spend while the run goes)."""
    publisher = _publisher(ctx)
    publisher.send(
        COST,
        publisher.table,
        key=_key(ctx, COST),
        table=cost_table(ctx.clients.ledger.summary()),
        description=f"model calls, tokens and cost by stage of {ctx.run_name}",
    )


def publish_report_link(ctx: Run, report: Any) -> None:
    """The run's report as a markdown artifact the UI renders (scores, plots as inline images, a row per
    step; it names the HTML report's location: under ``run.reports_url`` when set, else the file), and the
    gate table of the whole run, once."""
    from skillopt.run.report import load_run
    from skillopt.run.report_markdown import report_markdown

    url = report_url(report, run_name=ctx.run_name, reports_url=ctx.config.run.reports_url)
    run = load_run(ctx.dir.path)
    publisher = _publisher(ctx)
    publisher.send(GATES, publisher.table, key=_key(ctx, GATES), table=gate_table(run.history),
                   description=f"gate decisions per step of {ctx.run_name}")
    publisher.send(
        REPORT,
        publisher.markdown,
        key=_key(ctx, REPORT),
        markdown=report_markdown(run, html_report=url),
        description=f"report of {ctx.run_name}: scores, plots, steps",
    )


def publish_step(ctx: Run, record: StepRecord, history: list[StepRecord], *, previous_skill: str,
                 current_skill: str) -> None:
    """The step's edits and, for an accepted candidate, the skill diff (the gate table of the whole run is
    published once, with the report)."""
    publisher = _publisher(ctx)
    if record.edits:
        publisher.send(EDITS, publisher.table, key=_key(ctx, EDITS),
                       table=edits_table(record.edits, record.apply_report, record.decision),
                       description=f"edits of step {record.step}")
    if record.gate is not None and record.decision != "reject" and previous_skill != current_skill:
        publisher.send("diff", publisher.markdown, key=_key(ctx, SKILL_DIFF),
                       markdown=skill_diff_markdown(record.step, previous_skill, current_skill, record.gate),
                       description=f"accepted skill change at step {record.step}")


def publish_promotion(ctx: Run, event: RegistryEvent) -> None:
    """A nightly run's promotion decision, with the scores it was made on."""
    publisher = _publisher(ctx)
    publisher.send(
        PROMOTION,
        publisher.markdown,
        key=_key(ctx, PROMOTION),
        markdown=promotion_markdown(event),
        description=f"promotion decision of {ctx.run_name}",
    )
