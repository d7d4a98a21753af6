"""Publishing what a person sees in the Prefect UI.

The content is built by ``skillopt.artifacts`` (pure); this module only hands it to Prefect under
stable keys ``<bench>-<run>-<kind>``, so each key shows its latest version and its history.
Artifacts are a view: failing to publish one is logged, never fatal to training.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from skillopt.artifacts import (
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
from skillopt.assembly import Run
from skillopt.records import StepRecord
from skillopt.registry import RegistryEvent, promotion_markdown

log = logging.getLogger("skillopt.artifacts")


def _key(ctx: Run, kind: str) -> str:
    return artifact_key(ctx.benchmark.id, ctx.run_name, kind)


def _publish(kind: str, create: Any, **kwargs: Any) -> Any:
    try:
        return create(**kwargs)
    except Exception as error:  # noqa: BLE001 - a view must not stop training; the run dir has everything
        log.warning("could not publish the %s artifact: %s", kind, error)
        return None


def publish_progress(ctx: Run, step: int, total_steps: int, epoch: int, epochs: int, current: float,
                     best: float, artifact_id: str | None = None, *, finished: bool = False,
                     last_step: StepRecord | None = None) -> str | None:
    """Prefect's progress artifact of the run, created once and then updated in place: the share of
    steps done, with the epoch, step and current/best gate scores as its description (``finished``:
    the run's final figures), and the last step's optimizer replies and error rows.

    Returns the artifact id to pass back on the next call (None if publishing failed)."""
    percent = progress_percent(step, total_steps)
    description = progress_markdown(epoch, epochs, step, total_steps, current, best, finished=finished,
                                    last_step=last_step)
    if artifact_id is None:
        created = _publish(PROGRESS, create_progress_artifact, progress=percent, key=_key(ctx, PROGRESS),
                           description=description)
        return None if created is None else str(created)
    _publish(PROGRESS, update_progress_artifact, artifact_id=UUID(artifact_id), progress=percent,
             description=description)
    return artifact_id


def publish_cost(ctx: Run) -> None:
    """Usage per stage so far (calls, tokens, USD) with a total row."""
    _publish(
        COST,
        create_table_artifact,
        key=_key(ctx, COST),
        table=cost_table(ctx.clients.ledger.summary()),
        description=f"model calls, tokens and cost by stage of {ctx.run_name}",
    )


def publish_report_link(ctx: Run, report: Any) -> None:
    """A link to the run's HTML report: under ``run.reports_url`` when set, else a file:// URL."""
    url = report_url(report, run_name=ctx.run_name, reports_url=ctx.config.run.reports_url)
    _publish(
        REPORT,
        create_link_artifact,
        key=_key(ctx, REPORT),
        link=url,
        link_text=f"HTML report of {ctx.run_name}",
        description="plots, skill diffs and summary of the run",
    )


def publish_step(ctx: Run, record: StepRecord, history: list[StepRecord], *, previous_skill: str,
                 current_skill: str) -> None:
    """The gate table, the step's edits and, for an accepted candidate, the skill diff."""
    _publish(GATES, create_table_artifact, key=_key(ctx, GATES), table=gate_table(history),
             description="gate decisions per step")
    if record.edits:
        _publish(EDITS, create_table_artifact, key=_key(ctx, EDITS),
                 table=edits_table(record.edits, record.apply_report, record.decision),
                 description=f"edits of step {record.step}")
    if record.gate is not None and record.decision != "reject" and previous_skill != current_skill:
        _publish("diff", create_markdown_artifact, key=_key(ctx, SKILL_DIFF),
                 markdown=skill_diff_markdown(record.step, previous_skill, current_skill, record.gate),
                 description=f"accepted skill change at step {record.step}")


def publish_promotion(ctx: Run, event: RegistryEvent) -> None:
    """A nightly run's promotion decision, with the scores it was made on."""
    _publish(
        PROMOTION,
        create_markdown_artifact,
        key=_key(ctx, PROMOTION),
        markdown=promotion_markdown(event),
        description=f"promotion decision of {ctx.run_name}",
    )
